#include "server/rpc/kept_live_analyses.h"

#include <algorithm>
#include <utility>

namespace tidemark::server {

void KeptLiveAnalyses::keep(int64_t sessionId, SessionIngest::KeptLive kept) {
  if (!kept.analysis) return;
  const size_t bytes = kept.analysis->heldBytes();
  std::lock_guard<std::mutex> lock(m_mutex);
  if (auto it = m_entries.find(sessionId); it != m_entries.end()) {
    m_bytes -= it->second.bytes;
    m_entries.erase(it);
  }
  if (bytes > m_maxBytes) return;
  while (m_bytes + bytes > m_maxBytes && !m_entries.empty()) {
    auto oldest = std::min_element(
        m_entries.begin(), m_entries.end(),
        [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    m_bytes -= oldest->second.bytes;
    m_entries.erase(oldest);
  }
  m_bytes += bytes;
  m_entries[sessionId] = Entry{std::move(kept), bytes, ++m_order};
}

SessionIngest::KeptLive KeptLiveAnalyses::take(int64_t sessionId) {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_entries.find(sessionId);
  if (it == m_entries.end()) return {};
  SessionIngest::KeptLive out = std::move(it->second.kept);
  m_bytes -= it->second.bytes;
  m_entries.erase(it);
  return out;
}

size_t KeptLiveAnalyses::count() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_entries.size();
}

size_t KeptLiveAnalyses::heldBytes() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_bytes;
}

}  // namespace tidemark::server
