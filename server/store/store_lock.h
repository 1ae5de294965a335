#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tidemark::server {

// One daemon per store: an exclusive lock on `<db>.lock`, held for the daemon's life (the kernel
// releases it when the process ends, however it ends, so a crashed daemon leaves no stale lock).
// The file holds the holder's pid, for the refusal message.
class StoreLock {
 public:
  // FAILED_PRECONDITION naming the other daemon's pid when the store is taken.
  static absl::StatusOr<StoreLock> acquire(const std::string& dbPath);

  StoreLock(StoreLock&& other) noexcept : m_fd(other.m_fd) { other.m_fd = -1; }
  StoreLock& operator=(StoreLock&& other) noexcept;
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;
  ~StoreLock();

 private:
  explicit StoreLock(int fd) : m_fd(fd) {}
  int m_fd = -1;
};

}  // namespace tidemark::server
