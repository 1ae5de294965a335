#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "tidemark/v1/ingest.pb.h"

namespace tidemark::client {

// Reads a spool file (the agent's SpoolWriter: each message a little-endian u32 length, then the
// AgentMessage). next() returns false at the end or on a bad record (then error() says which).
// A RawRecords message (a handed-off exit) comes out as the batches the agent would have sent.
class SpoolReader {
 public:
  static constexpr uint32_t kMaxMessageBytes = 256u << 20;

  explicit SpoolReader(const std::string& path);
  // Reads an open file; takes the descriptor (closed with the reader).
  explicit SpoolReader(int fd);
  ~SpoolReader();
  SpoolReader(const SpoolReader&) = delete;
  SpoolReader& operator=(const SpoolReader&) = delete;

  bool ok() const { return m_file != nullptr; }
  bool next(v1::AgentMessage* message);
  const std::string& error() const { return m_error; }

 private:
  std::FILE* m_file = nullptr;
  std::string m_error;
  std::string m_buffer;
  // A RawRecords being read: its batches come out one at a time.
  v1::AgentMessage m_raw;
  uint64_t m_rawNext = 0;
  uint64_t m_rawBatches = 0;
};

}  // namespace tidemark::client
