#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {

// Makes the directory spool and overflow files go to, when missing. The default one
// (base::defaultSpoolDirectory) must be private to this user (0700, its own); false (nothing is
// written there) when it is not. One given by TIDEMARK_SPOOL_DIR is the user's choice: made if
// missing, not checked (the files themselves are 0600 and never follow a link). Returns "" when
// it may be written to, else why not.
std::string prepareSpoolDirectory(const std::string& dir);

// A bounded file of AgentMessages (each a little-endian u32 length, then the message), written
// at exit when no server took the rest of the run. It starts with the handshake (resuming the
// session when there is one), so `tidemark upload FILE` can send it later (client/spool_reader.h
// reads it). Created with O_EXCL and mode 0600 (never through a planted file or link). Over the
// cap, messages are refused (the caller counts the loss).
class SpoolWriter {
 public:
  SpoolWriter(std::string path, uint64_t capBytes) : m_path(std::move(path)), m_cap(capBytes) {}
  ~SpoolWriter();
  SpoolWriter(const SpoolWriter&) = delete;
  SpoolWriter& operator=(const SpoolWriter&) = delete;

  bool append(const v1::AgentMessage& message);
  // A message serialized already.
  bool appendSerialized(const std::string& bytes);
  // A message serialized in two parts, head then tail (the tail written from where it is: the
  // raw records of a handed-off exit).
  bool appendSerialized(const std::string& head, const void* tail, size_t tailBytes);
  void flush();
  const std::string& path() const { return m_path; }
  uint64_t bytes() const { return m_bytes; }
  // Why the file could not be made ("" if it was, or was not needed yet).
  const std::string& failure() const { return m_failure; }

 private:
  std::string m_failure;
  std::string m_path;
  uint64_t m_cap;
  uint64_t m_bytes = 0;
  std::FILE* m_file = nullptr;
  bool m_failed = false;
};

}  // namespace tidemark::agent
