#include "agent/transport/spool.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/base/private_dir.h"

namespace tidemark::agent {

std::string prepareSpoolDirectory(const std::string& dir) {
  if (dir == base::defaultSpoolDirectory()) return base::makePrivateDirectory(dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return "";
}

SpoolWriter::~SpoolWriter() {
  if (m_file != nullptr) std::fclose(m_file);
}

bool SpoolWriter::append(const v1::AgentMessage& message) {
  return appendSerialized(message.SerializeAsString());
}

bool SpoolWriter::appendSerialized(const std::string& bytes) {
  return appendSerialized(bytes, nullptr, 0);
}

bool SpoolWriter::appendSerialized(const std::string& bytes, const void* tail, size_t tailBytes) {
  if (m_failed) return false;
  const uint64_t size = bytes.size() + tailBytes;
  if (size > UINT32_MAX || m_bytes + size + 4 > m_cap) return false;
  if (m_file == nullptr) {
    m_failure = prepareSpoolDirectory(std::filesystem::path(m_path).parent_path().string());
    if (!m_failure.empty()) {
      m_failed = true;
      return false;
    }
    const int fd =
        ::open(m_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    m_file = fd >= 0 ? ::fdopen(fd, "wb") : nullptr;
    if (m_file == nullptr) {
      m_failure = "cannot create " + m_path + ": " + std::strerror(errno);
      if (fd >= 0) ::close(fd);
      m_failed = true;
      return false;
    }
  }
  const uint32_t n = static_cast<uint32_t>(size);
  const unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                static_cast<unsigned char>(n >> 16),
                                static_cast<unsigned char>(n >> 24)};
  if (std::fwrite(len, 1, 4, m_file) != 4 ||
      std::fwrite(bytes.data(), 1, bytes.size(), m_file) != bytes.size() ||
      (tailBytes > 0 && std::fwrite(tail, 1, tailBytes, m_file) != tailBytes)) {
    m_failed = true;
    return false;
  }
  m_bytes += size + 4;
  return true;
}

void SpoolWriter::flush() {
  if (m_file != nullptr) std::fflush(m_file);
}

}  // namespace tidemark::agent
