#pragma once

#include <sys/types.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace tidemark::server {

// While the jobs the daemon records want the processors it shares with them, its work gives them
// back: each ingest stream to its own job, the analysis pass to every job being recorded.
//
// The kernel weighs the daemon's niceness against the jobs only inside one session's scheduling
// group (its autogroups): a daemon in a session of its own, as users' daemons run, shares the
// processors with the jobs' session as an equal group whatever its niceness, and on a small
// machine takes half of them from a job whose allocations burst. So the daemon measures it
// itself, over windows of its own work: the time some thread of the machine waited for a
// processor (the kernel's pressure figures, /proc/pressure/cpu) or the calling thread's own wait
// in the run queue (/proc/thread-self/schedstat) says whether the processors were all wanted
// meanwhile (a thread of the daemon given a processor of its own by the group's fair share never
// waits itself, while the job's threads do), and the job's processor clock whether the job was
// busy (on at least half a processor).
// While both hold, the work pauses for `factor` times the processor time its work took,
// taking about 1/(1 + factor) of a processor, as a thread of niceness N does against one of
// niceness 0 (factorForNiceness). Nothing is lost meanwhile: what the daemon does not take stays
// with the agent (its buffer, then the stream's flow control) and arrives later; a job that ends
// hands the rest over in a file, stored at full pace (its job is gone). A machine with processors
// to spare, one busy with others' work while the job is idle, a job on another host or a process
// that is not the caller's own never makes a stream pause.
class CpuYield {
 public:
  // The pids of the jobs to yield to, asked at each window's ends (a job met at both counts).
  using JobPids = std::function<std::vector<pid_t>()>;

  // One job: a stream's (pid 0, a job on another host: never pauses). factor 0: never pauses.
  CpuYield(double factor, pid_t jobPid);
  // Whichever jobs the daemon records when it asks (its analysis pass between their streams).
  CpuYield(double factor, JobPids jobs);

  // Each object measures the one thread that calls it.

  // After a unit of work on the calling thread: pauses as long as due() says.
  void afterWork();

  // The pause due after the work since the last one (zero while the processors are free, the
  // jobs idle, or until enough work has been measured to tell); the next window starts now.
  std::chrono::nanoseconds due();

  // The policy, over a window: the calling thread's processor time and its run-queue wait, the
  // time some thread of the machine waited for a processor (-1: not known), the jobs' processor
  // time and the window's wall time. Contended when the thread, or some thread, waited at least a
  // fifth of the time and the jobs ran on at least half a processor.
  static int64_t pauseNs(int64_t cpuNs, int64_t waitNs, int64_t stallNs, int64_t jobCpuNs,
                         int64_t wallNs, double factor);
  // A thread of niceness N against one of 0: the kernel's weights fall by 1.25 a step.
  static double factorForNiceness(int niceness);

  // The work measured before a decision, and the longest single pause.
  static constexpr int64_t kWindowCpuNs = 5'000'000;
  static constexpr int64_t kMaxPauseNs = 100'000'000;

 private:
  struct Reading {
    int64_t cpuNs = 0;     // the calling thread's processor clock
    int64_t waitNs = 0;    // its run-queue wait (schedstat, as of its last switch)
    int64_t stallNs = -1;  // some thread of the machine waiting (/proc/pressure/cpu; -1: none)
    int64_t wallNs = 0;
    std::vector<std::pair<pid_t, int64_t>> jobs;  // each job's processor clock, all its threads
  };
  // False where the kernel does not say: then no more pauses. A job gone counts for nothing.
  bool read(Reading* r) const;

  double m_factor;
  JobPids m_jobs;
  bool m_started = false;
  Reading m_start;
};

// The pid an agent's handshake names, where it is a process of this host owned by the calling
// uid (any process for root); 0 otherwise: nothing to yield to (a job on another host, or a pid
// of somebody else's that a client named, whose load would then slow the daemon for everyone).
pid_t ownProcessHere(pid_t pid, uid_t caller);

// The jobs the daemon records on this host now, one entry per stream (a job may have several):
// what its analysis pass yields to.
class RecordedJobs {
 public:
  void add(pid_t pid);
  void remove(pid_t pid);
  std::vector<pid_t> pids() const;

  // Lists a stream's job for as long as it lives (pid 0, or no list: nothing).
  class Listing {
   public:
    Listing(RecordedJobs* jobs, pid_t pid) : m_jobs(pid > 0 ? jobs : nullptr), m_pid(pid) {
      if (m_jobs != nullptr) m_jobs->add(m_pid);
    }
    ~Listing() {
      if (m_jobs != nullptr) m_jobs->remove(m_pid);
    }
    Listing(const Listing&) = delete;
    Listing& operator=(const Listing&) = delete;

   private:
    RecordedJobs* m_jobs;
    pid_t m_pid;
  };

 private:
  mutable std::mutex m_mutex;
  std::multiset<pid_t> m_pids;
};

}  // namespace tidemark::server
