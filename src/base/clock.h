#pragma once

#include <cstdint>
#include <ctime>

namespace tidemark::base {

// One clock for every timestamp tidemark records: CLOCK_MONOTONIC in nanoseconds. It is read
// through the vDSO, so it is no system call and may be used on the agent's hot path.
inline int64_t monotonicNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline int64_t wallNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace tidemark::base
