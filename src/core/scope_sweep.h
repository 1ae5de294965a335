#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/core/streaming_analysis.h"

namespace tidemark::core {

// The innermost scope of a thread open at seq, for increasing seq (peak.cpp's ScopeSweep, from a
// cursor: begins in order, ends from a heap of the open scopes).
class ThreadScopeSweep {
 public:
  explicit ThreadScopeSweep(std::unique_ptr<Cursor<ScopeRef>> cursor)
      : m_cursor(std::move(cursor)) {
    m_have = m_cursor->next(m_next);
  }
  bool any() const { return m_have || m_key > 0; }
  const ScopeRef* innermostAt(uint32_t thread, uint64_t seq) {
    for (;;) {
      const bool begin = m_have && m_next.beginSeq <= seq;
      const bool end = !m_ends.empty() && m_ends.top().first <= seq;
      if (!begin && !end) break;
      if (end && (!begin || m_ends.top().first <= m_next.beginSeq)) {
        const auto [endSeq, key] = m_ends.top();
        m_ends.pop();
        auto it = m_where.find(key);
        if (it == m_where.end()) continue;
        auto& stack = m_open[it->second];
        auto pos = std::find_if(stack.rbegin(), stack.rend(),
                                [key = key](const auto& e) { return e.first == key; });
        if (pos != stack.rend()) stack.erase(std::next(pos).base());
        m_where.erase(it);
        continue;
      }
      const uint64_t key = ++m_key;
      m_open[m_next.threadId].emplace_back(key, m_next);
      if (m_next.endSeq != kOpenSeq) {
        m_ends.emplace(m_next.endSeq, key);
        m_where.emplace(key, m_next.threadId);
      }
      m_have = m_cursor->next(m_next);
    }
    auto it = m_open.find(thread);
    if (it == m_open.end() || it->second.empty()) return nullptr;
    return &it->second.back().second;
  }

 private:
  std::unique_ptr<Cursor<ScopeRef>> m_cursor;
  ScopeRef m_next;
  bool m_have = false;
  uint64_t m_key = 0;
  std::unordered_map<uint32_t, std::vector<std::pair<uint64_t, ScopeRef>>> m_open;
  std::unordered_map<uint64_t, uint32_t> m_where;  // open scope -> its thread
  std::priority_queue<std::pair<uint64_t, uint64_t>, std::vector<std::pair<uint64_t, uint64_t>>,
                      std::greater<>>
      m_ends;
};

}  // namespace tidemark::core
