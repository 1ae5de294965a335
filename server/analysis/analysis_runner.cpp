#include "server/analysis/analysis_runner.h"

#include <cstdio>

#include "src/core/analysis.h"

namespace tidemark::server {

AnalysisRunner::AnalysisRunner(StoreWriter& writer) : m_writer(writer) {
  m_thread = std::thread([this] { run(); });
}

AnalysisRunner::~AnalysisRunner() { stop(); }

void AnalysisRunner::enqueue(int64_t sessionId) {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_queue.push_back(sessionId);
  }
  m_cv.notify_one();
}

void AnalysisRunner::enqueuePending() {
  auto ids = Store::sessionsToAnalyze(m_writer.path());
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
  m_cv.notify_all();
  m_idle.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void AnalysisRunner::run() {
  for (;;) {
    int64_t id = 0;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_busy = false;
      m_idle.notify_all();
      m_cv.wait(lock, [this] { return m_stopping || !m_queue.empty(); });
      if (m_stopping) return;
      id = m_queue.front();
      m_queue.pop_front();
      m_busy = true;
    }
    auto rec = Store::loadRecording(m_writer.path(), id);
    if (!rec.ok()) {
      std::fprintf(stderr, "tidemarkd: analysis of session %lld: %s\n", static_cast<long long>(id),
                   rec.status().ToString().c_str());
      continue;
    }
    auto analysis = std::make_shared<core::Analysis>(core::analyze(*rec));
    auto blockIds = std::make_shared<std::vector<int64_t>>();
    blockIds->reserve(rec->blocks.size());
    for (const core::Block& b : rec->blocks) blockIds->push_back(b.id);
    const absl::Status s = m_writer
                               .submit([id, analysis, blockIds](Store& store) {
                                 return store.writeAnalysis(id, *analysis, *blockIds);
                               })
                               .get();
    if (!s.ok()) {
      std::fprintf(stderr, "tidemarkd: storing the analysis of session %lld: %s\n",
                   static_cast<long long>(id), s.ToString().c_str());
    }
  }
}

}  // namespace tidemark::server
