#include "server/ingest/cpu_yield.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

namespace tidemark::server {

namespace {
bool clockNs(clockid_t clock, int64_t* ns) {
  timespec t{};
  if (::clock_gettime(clock, &t) != 0) return false;
  *ns = static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  return true;
}
}  // namespace

CpuYield::CpuYield(double factor, pid_t jobPid) : m_factor(std::max(0.0, factor)) {
  if (jobPid <= 0 || ::clock_getcpuclockid(jobPid, &m_jobClock) != 0) m_factor = 0;
}

double CpuYield::factorForNiceness(int niceness) {
  if (niceness <= 0) return 0;
  return std::pow(1.25, std::min(niceness, 19)) - 1;
}

int64_t CpuYield::pauseNs(int64_t cpuNs, int64_t waitNs, int64_t jobCpuNs, int64_t wallNs,
                          double factor) {
  if (factor <= 0 || cpuNs <= 0 || waitNs < 0 || wallNs <= 0) return 0;
  if (waitNs * 5 < cpuNs + waitNs) return 0;  // the processors were there when it asked
  if (jobCpuNs * 2 < wallNs) return 0;        // not the job it records that wanted them
  const double pause = factor * static_cast<double>(cpuNs);
  return pause >= static_cast<double>(kMaxPauseNs) ? kMaxPauseNs : static_cast<int64_t>(pause);
}

bool CpuYield::read(Reading* r) const {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[96];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  long long ranNs = 0;  // as of the thread's last switch: its clock below is exact now
  long long wait = 0;
  if (std::sscanf(text, "%lld %lld", &ranNs, &wait) != 2) return false;
  r->waitNs = wait;
  return clockNs(CLOCK_THREAD_CPUTIME_ID, &r->cpuNs) && clockNs(m_jobClock, &r->jobCpuNs) &&
         clockNs(CLOCK_MONOTONIC, &r->wallNs);
}

std::chrono::nanoseconds CpuYield::due() {
  if (m_factor <= 0) return {};
  Reading now;
  if (!read(&now)) {
    m_factor = 0;  // no such figures here, or the job is gone: never asked again
    return {};
  }
  if (!m_started || now.cpuNs - m_start.cpuNs < kWindowCpuNs) {
    if (!m_started) m_start = now;
    m_started = true;
    return {};
  }
  const int64_t pause =
      pauseNs(now.cpuNs - m_start.cpuNs, now.waitNs - m_start.waitNs,
              now.jobCpuNs - m_start.jobCpuNs, now.wallNs - m_start.wallNs, m_factor);
  m_start = now;
  return std::chrono::nanoseconds(pause);
}

void CpuYield::afterWork() {
  const std::chrono::nanoseconds pause = due();
  if (pause.count() <= 0) return;
  std::this_thread::sleep_for(pause);
  // The next window starts after the pause: neither work nor a wait for a processor (the wait to
  // be scheduled again after it counts in the next window, as it should).
  Reading now;
  if (read(&now)) m_start = now;
}

}  // namespace tidemark::server
