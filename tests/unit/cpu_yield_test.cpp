// The ingest's pauses while every processor is taken (server/ingest/cpu_yield.h).
#include "server/ingest/cpu_yield.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

namespace tidemark::server {
namespace {

int64_t threadCpuNs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

void spinFor(int64_t cpuNs) {
  const int64_t until = threadCpuNs() + cpuNs;
  volatile uint64_t x = 0;
  while (threadCpuNs() < until) x = x + 1;
}

TEST(CpuYieldTest, PausesOnlyWhenTheJobWantedTheProcessorsItsWorkTook) {
  const double f = 3;
  const int64_t wall = 20'000'000;
  const int64_t busy = 20'000'000;  // the job on a whole processor over the window
  const int64_t none = 0;           // no thread of the machine waited
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 0, none, busy, wall, f), 0);          // nobody waited
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 2'000'000, none, busy, wall, f), 0);  // 1/6: free enough
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 0, wall / 5 - 1, busy, wall, f), 0);
  // The thread itself waited a fifth of its time or more, the job busy: it gets them back.
  EXPECT_EQ(CpuYield::pauseNs(8'000'000, 2'000'000, none, busy, wall, f), 24'000'000);
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 10'000'000, none, busy, wall, f), 30'000'000);
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 10'000'000, -1, wall / 2, wall, f), 30'000'000);
  // Or some thread of the machine did (the job's: the daemon's thread ran on a processor the
  // group's fair share left it), a fifth of the window or more.
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 0, wall / 5, busy, wall, f), 30'000'000);
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 0, wall, busy, wall, f), 30'000'000);
  // Others wanted the processors, not the job (idle, or on less than half a processor).
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 10'000'000, wall, 0, wall, f), 0);
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 10'000'000, wall, wall / 2 - 1, wall, f), 0);
  EXPECT_EQ(CpuYield::pauseNs(10'000'000, 10'000'000, wall, busy, wall, 0), 0);  // --nice 0
  EXPECT_EQ(CpuYield::pauseNs(0, 10'000'000, wall, busy, wall, f), 0);
  EXPECT_EQ(CpuYield::pauseNs(-5, 10, wall, busy, wall, f), 0);
  EXPECT_EQ(CpuYield::pauseNs(10, -5, wall, busy, wall, f), 0);
  EXPECT_EQ(CpuYield::pauseNs(10, 10, wall, busy, 0, f), 0);
  // Bounded, however much work came before.
  EXPECT_EQ(CpuYield::pauseNs(int64_t{1} << 50, int64_t{1} << 50, int64_t{1} << 51,
                              int64_t{1} << 52, int64_t{1} << 51, f),
            CpuYield::kMaxPauseNs);
}

TEST(CpuYieldTest, TakesTheShareOfANiceThread) {
  EXPECT_EQ(CpuYield::factorForNiceness(0), 0);
  EXPECT_EQ(CpuYield::factorForNiceness(-3), 0);
  EXPECT_NEAR(CpuYield::factorForNiceness(1), 0.25, 1e-12);
  // Niceness 10 against 0: the kernel's weights 110 against 1024, about a tenth of a processor.
  const double f10 = CpuYield::factorForNiceness(10);
  EXPECT_NEAR(1 / (1 + f10), 110.0 / 1024, 0.005);
  EXPECT_EQ(CpuYield::factorForNiceness(40), CpuYield::factorForNiceness(19));
}

// Spinning threads in this process stand for the job: its processor clock counts them.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      m_threads.emplace_back([this] {
        volatile uint64_t x = 0;
        while (!m_stop.load(std::memory_order_relaxed)) x = x + 1;
      });
    }
  }
  ~Spinners() {
    m_stop = true;
    for (auto& t : m_threads) t.join();
  }

 private:
  std::atomic<bool> m_stop{false};
  std::vector<std::thread> m_threads;
};

int processorsHere() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// The pause due after three windows' work on a thread of its own (its first call only starts
// the window); *worked: the work's processor time.
int64_t pauseAfterWork(CpuYield& yield, int64_t* worked) {
  int64_t pause = -1;
  std::thread worker([&] {
    EXPECT_EQ(yield.due().count(), 0);
    const int64_t t0 = threadCpuNs();
    spinFor(3 * CpuYield::kWindowCpuNs);
    *worked = threadCpuNs() - t0;
    pause = yield.due().count();
  });
  worker.join();
  return pause;
}

TEST(CpuYieldTest, NeverPausesForAJobElsewhereOrWithAFactorOfZero) {
  Spinners busy(2 * processorsHere());
  int64_t worked = 0;
  CpuYield never(0, getpid());
  EXPECT_EQ(pauseAfterWork(never, &worked), 0);
  CpuYield noJob(3, 0);  // an agent on another host
  EXPECT_EQ(pauseAfterWork(noJob, &worked), 0);
  CpuYield gone(3, 0x3ffffff0);  // no such process
  EXPECT_EQ(pauseAfterWork(gone, &worked), 0);
}

// The processors all taken, but by others: the job (a child that sleeps) wants none of them.
TEST(CpuYieldTest, NeverPausesForOthersLoad) {
  const pid_t idleJob = fork();
  ASSERT_GE(idleJob, 0);
  if (idleJob == 0) {
    ::sleep(60);
    ::_exit(0);
  }
  int64_t pause = -1;
  {
    Spinners busy(2 * processorsHere());
    CpuYield yield(3, idleJob);
    int64_t worked = 0;
    pause = pauseAfterWork(yield, &worked);
  }
  ::kill(idleJob, SIGKILL);
  ::waitpid(idleJob, nullptr, 0);
  EXPECT_EQ(pause, 0);
}

// A real contended machine: twice as many spinning threads as this process may run on (the
// job: this process), and the stream's work among them. Its run-queue wait is then most of its
// time, and it pauses for the factor times its work.
TEST(CpuYieldTest, PausesWhileTheJobWantsTheProcessors) {
  if (access("/proc/thread-self/schedstat", R_OK) != 0)
    GTEST_SKIP() << "this kernel keeps no schedstat: the ingest never pauses here";
  Spinners busy(2 * processorsHere());
  CpuYield yield(3, getpid());
  int64_t worked = 0;
  const int64_t pause = pauseAfterWork(yield, &worked);
  // Three times the work since the window began (a little more than spun: the calls
  // themselves), bounded.
  EXPECT_GE(pause, 3 * worked);
  EXPECT_LE(pause, std::min<int64_t>(3 * worked + 3'000'000, CpuYield::kMaxPauseNs));
}

// The jobs whose streams are open, for the analysis pass: one entry per stream.
TEST(CpuYieldTest, RecordedJobsListEachJobOnceWhileAStreamOfItIsOpen) {
  RecordedJobs jobs;
  EXPECT_TRUE(jobs.pids().empty());
  jobs.add(7);
  jobs.add(3);
  jobs.add(7);  // a second stream of job 7 (a resumed one, say)
  EXPECT_EQ(jobs.pids(), (std::vector<pid_t>{3, 7}));
  jobs.remove(7);
  EXPECT_EQ(jobs.pids(), (std::vector<pid_t>{3, 7}));
  jobs.remove(7);
  jobs.remove(9);  // never listed: nothing
  EXPECT_EQ(jobs.pids(), (std::vector<pid_t>{3}));
  {
    const RecordedJobs::Listing stream(&jobs, 5);
    const RecordedJobs::Listing remote(&jobs, 0);  // a job elsewhere: not listed
    EXPECT_EQ(jobs.pids(), (std::vector<pid_t>{3, 5}));
  }
  EXPECT_EQ(jobs.pids(), (std::vector<pid_t>{3}));
}

// Only the caller's own process (any, for root) is yielded to: a client naming somebody else's
// busy process would otherwise slow the daemon's analysis for everyone.
TEST(CpuYieldTest, YieldsOnlyToTheCallersOwnProcess) {
  const uid_t me = getuid();
  EXPECT_EQ(ownProcessHere(getpid(), me), getpid());
  EXPECT_EQ(ownProcessHere(getpid(), 0), getpid());  // root
  const uid_t other = me == 0 ? 4242 : me + 1;
  EXPECT_EQ(ownProcessHere(getpid(), other), 0);
  EXPECT_EQ(ownProcessHere(0, me), 0);
  EXPECT_EQ(ownProcessHere(0x3ffffff0, me), 0);  // no such process
}

// The analysis pass's form: whichever jobs are listed when it asks.
TEST(CpuYieldTest, YieldsToTheListedJobs) {
  if (access("/proc/thread-self/schedstat", R_OK) != 0)
    GTEST_SKIP() << "this kernel keeps no schedstat: the daemon never pauses here";
  Spinners busy(2 * processorsHere());
  RecordedJobs jobs;
  const auto listed = [&jobs] { return jobs.pids(); };
  int64_t worked = 0;
  CpuYield noJob(3, listed);  // (one object per thread: its clock is the thread's)
  EXPECT_EQ(pauseAfterWork(noJob, &worked), 0);
  jobs.add(getpid());
  CpuYield oneJob(3, listed);
  EXPECT_GE(pauseAfterWork(oneJob, &worked), 3 * worked);
}

}  // namespace
}  // namespace tidemark::server
