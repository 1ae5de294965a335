#pragma once

#include <sys/types.h>
#include <time.h>

#include <chrono>
#include <cstdint>

namespace tidemark::server {

// While the job a stream records wants the processors it shares with the daemon, the stream's
// ingest gives them back to it.
//
// The kernel weighs the daemon's niceness against the jobs only inside one session's scheduling
// group (its autogroups): a daemon in a session of its own, as users' daemons run, shares the
// processors with the jobs' session as an equal group whatever its niceness, and on a small
// machine takes half of them from a job whose allocations burst. So the ingest measures it
// itself, over windows of its own work: the calling thread's wait in the kernel's run queue
// (/proc/thread-self/schedstat) says whether others wanted the processors meanwhile, and the
// job's processor clock whether the job was one of them (busy on at least half a processor).
// While both hold, the stream pauses for `factor` times the processor time its work took,
// taking about 1/(1 + factor) of a processor, as a thread of niceness N does against one of
// niceness 0 (factorForNiceness). Nothing is lost meanwhile: what the daemon does not take stays
// with the agent (its buffer, then the stream's flow control) and arrives later; a job that ends
// hands the rest over in a file, stored at full pace (its job is gone). A machine with processors
// to spare, another user's load or a job on another host never makes a stream pause.
class CpuYield {
 public:
  // factor 0, or a job that is not this host's (pid 0, or not found): never pauses.
  CpuYield(double factor, pid_t jobPid);

  // After a unit of work on the calling thread: pauses as long as due() says.
  void afterWork();

  // The pause due after the work since the last one (zero while the processors are free, the
  // job idle, or until enough work has been measured to tell); the next window starts now.
  std::chrono::nanoseconds due();

  // The policy, over a window: the stream's processor time and its run-queue wait, the job's
  // processor time and the window's wall time. Contended when the stream waited at least a fifth
  // of its time and the job ran on at least half a processor.
  static int64_t pauseNs(int64_t cpuNs, int64_t waitNs, int64_t jobCpuNs, int64_t wallNs,
                         double factor);
  // A thread of niceness N against one of 0: the kernel's weights fall by 1.25 a step.
  static double factorForNiceness(int niceness);

  // The stream's work measured before a decision, and the longest single pause.
  static constexpr int64_t kWindowCpuNs = 5'000'000;
  static constexpr int64_t kMaxPauseNs = 100'000'000;

 private:
  struct Reading {
    int64_t cpuNs = 0;     // the calling thread's processor clock
    int64_t waitNs = 0;    // its run-queue wait (schedstat, as of its last switch)
    int64_t jobCpuNs = 0;  // the job's processor clock, all its threads
    int64_t wallNs = 0;
  };
  // False where the kernel does not say, or the job is gone: then no more pauses.
  bool read(Reading* r) const;

  double m_factor;
  clockid_t m_jobClock{};
  bool m_started = false;
  Reading m_start;
};

}  // namespace tidemark::server
