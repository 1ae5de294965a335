#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace tidemark::agent {

// Waits while *word == expected, at most timeoutNs (a wake, a change or a spurious return ends
// it early: callers re-check). The one system call a hook may make, and only when its ring is full.
inline void futexWait(std::atomic<uint32_t>& word, uint32_t expected, int64_t timeoutNs) noexcept {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  timespec ts{static_cast<time_t>(timeoutNs / 1000000000),
              static_cast<long>(timeoutNs % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
          0);
}

inline void futexWakeAll(std::atomic<uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

}  // namespace tidemark::agent
