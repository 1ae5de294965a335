#include "client/spool_reader.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/transport/batch_encoder.h"

namespace tidemark::client {

SpoolReader::SpoolReader(const std::string& path) {
  m_file = std::fopen(path.c_str(), "rbe");
  if (m_file == nullptr) m_error = path + ": " + std::strerror(errno);
}

SpoolReader::SpoolReader(int fd) {
  m_file = fd >= 0 ? ::fdopen(fd, "rb") : nullptr;
  if (m_file == nullptr) {
    m_error = std::string("cannot read the spool: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
  }
}

SpoolReader::~SpoolReader() {
  if (m_file != nullptr) std::fclose(m_file);
}

bool SpoolReader::next(v1::AgentMessage* message) {
  if (m_rawNext < m_rawBatches) {
    if (!message->ParseFromString(agent::rawRecordsBatch(m_raw.raw_records(), m_rawNext++))) {
      m_error = "corrupt spool: raw records that do not encode";
      return false;
    }
    return true;
  }
  if (m_file == nullptr) return false;
  unsigned char len[4];
  const size_t got = std::fread(len, 1, 4, m_file);
  if (got == 0) return false;  // clean end
  if (got != 4) {
    m_error = "truncated spool: partial length prefix";
    return false;
  }
  const uint32_t n =
      len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (n > kMaxMessageBytes) {
    m_error = "corrupt spool: message of " + std::to_string(n) + " bytes";
    return false;
  }
  m_buffer.resize(n);
  if (std::fread(m_buffer.data(), 1, n, m_file) != n) {
    m_error = "truncated spool: partial message";
    return false;
  }
  if (!message->ParseFromString(m_buffer)) {
    m_error = "corrupt spool: message does not parse";
    return false;
  }
  if (message->has_raw_records()) {
    if (const std::string why = agent::rawRecordsProblem(message->raw_records()); !why.empty()) {
      m_error = "unreadable spool: " + why;
      return false;
    }
    m_raw.Swap(message);
    m_rawNext = 0;
    m_rawBatches =
        agent::rawBatchCount(m_raw.raw_records().records().size() / sizeof(agent::Record));
    return next(message);
  }
  return true;
}

}  // namespace tidemark::client
