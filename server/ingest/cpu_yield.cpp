#include "server/ingest/cpu_yield.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace tidemark::server {

namespace {
bool clockNs(clockid_t clock, int64_t* ns) {
  timespec t{};
  if (::clock_gettime(clock, &t) != 0) return false;
  *ns = static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  return true;
}
// /proc/pressure/cpu's "some" total, in ns: how long, since boot, some thread waited for a
// processor; -1 where the kernel keeps no pressure figures.
int64_t readStall() {
  const int fd = ::open("/proc/pressure/cpu", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[256];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  const char* total = std::strstr(text, "total=");  // the first line's: "some"
  if (total == nullptr) return -1;
  return std::strtoll(total + 6, nullptr, 10) * 1000;
}
}  // namespace

CpuYield::CpuYield(double factor, pid_t jobPid)
    : CpuYield(factor,
               jobPid > 0 ? JobPids([jobPid] { return std::vector<pid_t>{jobPid}; }) : JobPids()) {}

CpuYield::CpuYield(double factor, JobPids jobs)
    : m_factor(jobs ? std::max(0.0, factor) : 0), m_jobs(std::move(jobs)) {}

double CpuYield::factorForNiceness(int niceness) {
  if (niceness <= 0) return 0;
  return std::pow(1.25, std::min(niceness, 19)) - 1;
}

int64_t CpuYield::pauseNs(int64_t cpuNs, int64_t waitNs, int64_t stallNs, int64_t jobCpuNs,
                          int64_t wallNs, double factor) {
  if (factor <= 0 || cpuNs <= 0 || waitNs < 0 || wallNs <= 0) return 0;
  // The processors were there when anyone asked.
  if (waitNs * 5 < cpuNs + waitNs && stallNs * 5 < wallNs) return 0;
  if (jobCpuNs * 2 < wallNs) return 0;  // not the job it records that wanted them
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
  r->stallNs = readStall();
  if (!clockNs(CLOCK_THREAD_CPUTIME_ID, &r->cpuNs) || !clockNs(CLOCK_MONOTONIC, &r->wallNs))
    return false;
  r->jobs.clear();
  for (const pid_t pid : m_jobs()) {
    clockid_t clock{};
    int64_t ns = 0;
    if (::clock_getcpuclockid(pid, &clock) == 0 && clockNs(clock, &ns))
      r->jobs.emplace_back(pid, ns);
  }
  return true;
}

std::chrono::nanoseconds CpuYield::due() {
  if (m_factor <= 0) return {};
  // Within a window only the thread's clock is read: cheap enough for every thousand items.
  if (int64_t cpu = 0;
      m_started && clockNs(CLOCK_THREAD_CPUTIME_ID, &cpu) && cpu - m_start.cpuNs < kWindowCpuNs)
    return {};
  Reading now;
  if (!read(&now)) {
    m_factor = 0;  // the kernel keeps no such figures here: never asked again
    return {};
  }
  if (!m_started || now.cpuNs - m_start.cpuNs < kWindowCpuNs) {
    if (!m_started) m_start = std::move(now);
    m_started = true;
    return {};
  }
  int64_t jobCpu = 0;  // of the jobs met at both ends of the window
  for (const auto& [pid, ns] : now.jobs) {
    for (const auto& [startPid, startNs] : m_start.jobs)
      if (startPid == pid) jobCpu += ns - startNs;
  }
  const int64_t stall =
      now.stallNs >= 0 && m_start.stallNs >= 0 ? now.stallNs - m_start.stallNs : -1;
  const int64_t pause = pauseNs(now.cpuNs - m_start.cpuNs, now.waitNs - m_start.waitNs, stall,
                                jobCpu, now.wallNs - m_start.wallNs, m_factor);
  m_start = std::move(now);
  return std::chrono::nanoseconds(pause);
}

void CpuYield::afterWork() {
  const std::chrono::nanoseconds pause = due();
  if (pause.count() <= 0) return;
  std::this_thread::sleep_for(pause);
  // The next window starts after the pause: neither work nor a wait for a processor (the wait to
  // be scheduled again after it counts in the next window, as it should).
  Reading now;
  if (read(&now)) m_start = std::move(now);
}

pid_t ownProcessHere(pid_t pid, uid_t caller) {
  if (pid <= 0) return 0;
  struct stat info {};
  const std::string dir = "/proc/" + std::to_string(pid);
  if (::stat(dir.c_str(), &info) != 0) return 0;
  return caller == 0 || info.st_uid == caller ? pid : 0;
}

void RecordedJobs::add(pid_t pid) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_pids.insert(pid);
}

void RecordedJobs::remove(pid_t pid) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (auto it = m_pids.find(pid); it != m_pids.end()) m_pids.erase(it);
}

std::vector<pid_t> RecordedJobs::pids() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  std::vector<pid_t> out;
  for (const pid_t pid : m_pids)
    if (out.empty() || out.back() != pid) out.push_back(pid);
  return out;
}

}  // namespace tidemark::server
