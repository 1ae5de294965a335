#pragma once

#include <cstdint>
#include <string>

#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {

// Makes the directory spool, overflow and handed-off files go to, when missing. The default ones
// (base::defaultSpoolDirectory, base::defaultHandoffDirectory) must be private to this user
// (0700, its own); false (nothing is written there) when they are not. One given by
// TIDEMARK_SPOOL_DIR is the user's choice: made if missing, not checked (the files themselves are
// 0600 and never follow a link). Returns "" when it may be written to, else why not.
std::string prepareSpoolDirectory(const std::string& dir);

// The bytes free to this user on the file system a file at `path` would be on (that of the
// nearest directory above it that exists); 0 when none can be read.
uint64_t freeBytesFor(const std::string& path);

// A bounded file of AgentMessages (each a little-endian u32 length, then the message), written
// at exit when no server took the rest of the run. It starts with the handshake (resuming the
// session when there is one), so `tidemark upload FILE` can send it later (client/spool_reader.h
// reads it). Created with O_EXCL and mode 0600 (never through a planted file or link). Over the
// cap, messages are refused (the caller counts the loss). Unbuffered: a message appended is in
// the file (one write), so a file system that fills refuses the message it cannot hold, and
// every one after it, never one appended before.
class SpoolWriter {
 public:
  // The cap is also the process's file size limit (RLIMIT_FSIZE): a write past it would raise
  // SIGXFSZ, which ends the job.
  SpoolWriter(std::string path, uint64_t capBytes);
  ~SpoolWriter();
  SpoolWriter(const SpoolWriter&) = delete;
  SpoolWriter& operator=(const SpoolWriter&) = delete;

  bool append(const v1::AgentMessage& message);
  // A message serialized already.
  bool appendSerialized(const std::string& bytes);
  // A message serialized in two parts, head then tail (the tail written from where it is: the
  // raw records of a handed-off exit).
  bool appendSerialized(const std::string& head, const void* tail, size_t tailBytes);
  const std::string& path() const { return m_path; }
  uint64_t bytes() const { return m_bytes; }
  // Why the file could not be made or written ("" if it was, or was not needed yet).
  const std::string& failure() const { return m_failure; }

 private:
  std::string m_failure;
  std::string m_path;
  uint64_t m_cap;
  uint64_t m_bytes = 0;
  int m_fd = -1;
  bool m_failed = false;
};

}  // namespace tidemark::agent
