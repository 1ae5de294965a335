#include "server/analysis/analysis_runner.h"

#include <malloc.h>
#include <pthread.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>

#include "server/store/recording_stream.h"
#include "src/core/step_inference.h"
#include "src/core/streaming_analysis.h"

namespace tidemark::server {

namespace {

// Hands the streaming analysis' chunks to the writer a few MiB at a time, with at most one
// write in flight: memory stays bounded however fast the analysis goes.
class WriterSink : public core::AnalysisSink {
 public:
  WriterSink(StoreWriter& writer, int64_t sessionId) : m_writer(writer), m_id(sessionId) {}

  bool blockCodes(int64_t chunk, const std::string& codes) override {
    m_pending->codes.emplace_back(chunk, codes);
    m_pendingBytes += codes.size();
    return maybeFlush();
  }
  bool timelineChunk(int level, int64_t chunk,
                     const std::vector<core::TimelineSample>& samples) override {
    m_pending->timeline.push_back({level, chunk, samples});
    m_pendingBytes += samples.size() * sizeof(core::TimelineSample);
    return maybeFlush();
  }
  // Writes what is buffered and waits for every write.
  absl::Status flush() {
    submit();
    return waitInFlight();
  }

 private:
  struct Part {
    std::vector<std::pair<int64_t, std::string>> codes;
    struct Chunk {
      int level;
      int64_t index;
      std::vector<core::TimelineSample> samples;
    };
    std::vector<Chunk> timeline;
  };
  static constexpr size_t kFlushBytes = 4u << 20;

  bool maybeFlush() {
    if (m_pendingBytes < kFlushBytes) return true;
    submit();
    return m_status.ok();
  }
  absl::Status waitInFlight() {
    if (m_inFlight.valid()) {
      const absl::Status s = m_inFlight.get();
      if (m_status.ok() && !s.ok()) m_status = s;
    }
    return m_status;
  }
  void submit() {
    if (!waitInFlight().ok()) return;
    if (m_pendingBytes == 0) return;
    std::shared_ptr<Part> part = std::move(m_pending);
    m_pending = std::make_shared<Part>();
    m_pendingBytes = 0;
    const int64_t id = m_id;
    m_inFlight = m_writer.submit([part, id](Store& store) {
      for (const auto& [chunk, codes] : part->codes)
        if (auto s = store.writeBlockCodes(id, chunk, codes); !s.ok()) return s;
      for (const auto& c : part->timeline)
        if (auto s = store.writeTimelineChunk(id, c.level, c.index, c.samples); !s.ok()) return s;
      return absl::OkStatus();
    });
  }

  StoreWriter& m_writer;
  int64_t m_id;
  std::shared_ptr<Part> m_pending = std::make_shared<Part>();
  size_t m_pendingBytes = 0;
  std::future<absl::Status> m_inFlight;
  absl::Status m_status;
};

}  // namespace

AnalysisRunner::AnalysisRunner(StoreWriter& writer, size_t memoryBytes,
                               std::function<void(int64_t)> onAnalyzed)
    : m_writer(writer), m_memoryBytes(memoryBytes), m_onAnalyzed(std::move(onAnalyzed)) {
  m_thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "td-analysis");
    run();
  });
}

AnalysisRunner::~AnalysisRunner() { stop(); }

void AnalysisRunner::yieldTo(double factor, const RecordedJobs* jobs) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_yieldFactor = factor;
  m_recordedJobs = jobs;
}

void AnalysisRunner::enqueue(int64_t sessionId) {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_queue.push_back(sessionId);
  }
  m_cv.notify_one();
}

void AnalysisRunner::enqueuePending() {
  auto ids = Store::sessionsToAnalyze(m_writer.path(), m_writer.daemonName());
  if (!ids.ok()) return;
  for (int64_t id : *ids) enqueue(id);
}

void AnalysisRunner::waitIdle() {
  std::unique_lock<std::mutex> lock(m_mutex);
  m_idle.wait(lock, [this] { return (m_queue.empty() && !m_busy) || m_stopping; });
}

void AnalysisRunner::stop() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stopping = true;
  }
  m_cancel = true;
  m_cv.notify_all();
  m_idle.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

absl::Status AnalysisRunner::analyze(int64_t id) {
  // Analysed as its events came (src/core/live_analysis.h), stored with its end: nothing to do.
  if (auto done = Store::isAnalyzed(m_writer.path(), id); done.ok() && *done) {
    return absl::OkStatus();
  }
  auto in = StoredRecordingStream::open(m_writer.path(), id);
  if (!in.ok()) return in.status();
  if (auto s = m_writer.submit([id](Store& store) { return store.clearAnalysis(id); }).get();
      !s.ok())
    return s;
  WriterSink sink(m_writer, id);
  core::StreamingOptions options;
  options.tempDir = scratchDirFor(m_writer.path());
  // Three quarters to the sorts, a quarter to the totals kept for step inference.
  options.memoryBytes = m_memoryBytes / 4 * 3;
  options.maxInferencePoints =
      std::max<size_t>(1u << 16, m_memoryBytes / 4 / sizeof(core::TotalPoint));
  options.cancel = &m_cancel;
  double factor = 0;
  const RecordedJobs* jobs = nullptr;
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    factor = m_yieldFactor;
    jobs = m_recordedJobs;
  }
  CpuYield yield(factor, jobs != nullptr ? CpuYield::JobPids([jobs] { return jobs->pids(); })
                                         : CpuYield::JobPids());
  options.pace = [&yield] { yield.afterWork(); };
  core::StreamingResult result = core::analyzeStream(**in, sink, options);
  // The writer's own error first: the analysis only knows that its sink refused.
  const absl::Status written = sink.flush();
  if (!written.ok()) return written;
  if (!result.error.empty()) return absl::InternalError(result.error);
  auto shared = std::make_shared<core::StreamingResult>(std::move(result));
  return m_writer
      .submit([id, shared](Store& store) {
        return store.finishAnalysis(id, shared->peaks, shared->stats, shared->inferredSteps);
      })
      .get();
}

void AnalysisRunner::run() {
  for (;;) {
    int64_t id = 0;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_busy = false;
      m_idle.notify_all();
      for (;;) {
        if (m_stopping) return;
        if (!m_queue.empty()) break;
        // The earliest retry due, if any, else wait for work or for it.
        auto due = m_retries.end();
        for (auto it = m_retries.begin(); it != m_retries.end(); ++it)
          if (due == m_retries.end() || it->second.at < due->second.at) due = it;
        if (due == m_retries.end()) {
          m_cv.wait(lock);
        } else if (std::chrono::steady_clock::now() >= due->second.at) {
          m_queue.push_back(due->first);
        } else {
          m_cv.wait_until(lock, due->second.at);
        }
      }
      id = m_queue.front();
      m_queue.pop_front();
      m_busy = true;
    }
    const absl::Status s = analyze(id);
    if (s.ok()) {
      {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_retries.erase(id);
      }
      if (m_onAnalyzed) m_onAnalyzed(id);
    } else if (absl::IsNotFound(s)) {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_retries.erase(id);  // deleted meanwhile: nothing to analyse
    } else if (!m_cancel) {
      // Kept for later (a full disk empties again); the session stays unanalyzed meanwhile.
      std::lock_guard<std::mutex> lock(m_mutex);
      auto it = m_retries.try_emplace(id, Retry{{}, kFirstRetry}).first;
      const std::chrono::seconds wait = it->second.next;
      it->second.at = std::chrono::steady_clock::now() + wait;
      it->second.next = std::min(kLongestRetry, wait * 2);
      std::fprintf(stderr, "tidemarkd: analysis of session %lld: %s; trying again in %lld s\n",
                   static_cast<long long>(id), s.ToString().c_str(),
                   static_cast<long long>(wait.count()));
    }
    // What the pass took goes back to the system, not to the allocator's free lists.
    malloc_trim(0);
  }
}

}  // namespace tidemark::server
