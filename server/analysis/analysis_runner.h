#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "server/ingest/cpu_yield.h"
#include "server/store/writer.h"

namespace tidemark::server {

// Runs the analysis pass of ended sessions on its own thread, streaming (src/core/
// streaming_analysis.h: memory bounded by memoryBytes plus what is live at a moment, whatever the
// session's length), and stores the results through the writer as they come. Queries never wait
// for it: until a session is analyzed they compute what they need themselves. A pass that fails
// (the disk full under its sorts or the store) is tried again later: after 5 s, then twice as
// long each time, at most 10 minutes apart, as long as the daemon runs.
class AnalysisRunner {
 public:
  static constexpr size_t kDefaultMemoryBytes = 96u << 20;
  static constexpr std::chrono::seconds kFirstRetry{5};
  static constexpr std::chrono::seconds kLongestRetry{600};
  // onAnalyzed: called on the runner's thread after each session's analysis is stored.
  explicit AnalysisRunner(StoreWriter& writer, size_t memoryBytes = kDefaultMemoryBytes,
                          std::function<void(int64_t)> onAnalyzed = nullptr);
  ~AnalysisRunner();  // abandons queued and running work (it is redone at the next start)

  // While the jobs listed there want the processors, the passes pause (CpuYield; factor 0:
  // never). Set before the first enqueue.
  void yieldTo(double factor, const RecordedJobs* jobs);

  void enqueue(int64_t sessionId);
  // Queues every ended session that has no stored analysis (after a restart).
  void enqueuePending();
  // Blocks until the queue is empty and nothing runs. For tests and benchmarks.
  void waitIdle();
  void stop();

 private:
  void run();
  absl::Status analyze(int64_t sessionId);

  StoreWriter& m_writer;
  size_t m_memoryBytes;
  double m_yieldFactor = 0;
  const RecordedJobs* m_recordedJobs = nullptr;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::condition_variable m_idle;
  std::deque<int64_t> m_queue;
  // Sessions whose pass failed: when to try again, and the wait after that.
  struct Retry {
    std::chrono::steady_clock::time_point at;
    std::chrono::seconds next;
  };
  std::map<int64_t, Retry> m_retries;
  bool m_busy = false;
  bool m_stopping = false;
  std::atomic<bool> m_cancel{false};  // stops the running analysis
  std::function<void(int64_t)> m_onAnalyzed;
  std::thread m_thread;
};

}  // namespace tidemark::server
