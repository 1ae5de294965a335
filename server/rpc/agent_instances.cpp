#include "server/rpc/agent_instances.h"

namespace tidemark::server {

AgentInstances::Found AgentInstances::claim(uid_t owner, uint64_t instance,
                                            std::chrono::steady_clock::time_point deadline,
                                            const std::function<bool()>& stillWanted) {
  const Key key{owner, instance};
  std::unique_lock<std::mutex> lock(m_mutex);
  for (;;) {
    auto it = m_sessions.find(key);
    if (it == m_sessions.end()) {
      m_sessions.emplace(key, kMaking);
      m_order.push_back(key);
      while (m_order.size() > kMaxEntries) {
        // The oldest, unless it is still being made (then it goes when made() says so).
        auto oldest = m_sessions.find(m_order.front());
        if (oldest != m_sessions.end() && oldest->second != kMaking) m_sessions.erase(oldest);
        m_order.pop_front();
      }
      return {true, 0};
    }
    if (it->second != kMaking) return {false, it->second};
    if (std::chrono::steady_clock::now() >= deadline || !stillWanted()) return {false, 0};
    // In slices: the caller's stream may be cancelled meanwhile.
    m_madeCv.wait_for(lock, std::chrono::milliseconds(100));
  }
}

void AgentInstances::made(uid_t owner, uint64_t instance, int64_t session) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (session > 0) {
    m_sessions[{owner, instance}] = session;
  } else {
    m_sessions.erase({owner, instance});
  }
  m_madeCv.notify_all();
}

int64_t AgentInstances::sessionOf(uid_t owner, uint64_t instance) {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_sessions.find({owner, instance});
  return it == m_sessions.end() || it->second == kMaking ? 0 : it->second;
}

}  // namespace tidemark::server
