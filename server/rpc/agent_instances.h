#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace tidemark::server {

// The sessions this daemon made, by the number their agent drew for them
// (Handshake.agent_instance) and their owner. An agent whose handshake was answered too late (the
// daemon slow to create the session: a loaded machine) ends that stream and sends its handshake
// again with the same number: it continues the session the first one made, never a second one
// (the first stays, empty and aborted, otherwise). Kept for this daemon's life, at most
// kMaxEntries (the oldest forgotten first).
class AgentInstances {
 public:
  static constexpr size_t kMaxEntries = 65536;

  // What a handshake with this number finds: nothing (`claimed`: this stream makes the session
  // and says which with made()), or the session an earlier handshake made. Waits while that
  // earlier one is still making it, until `deadline` or while `stillWanted` says so; 0 when it
  // came to nothing.
  struct Found {
    bool claimed = false;
    int64_t session = 0;
  };
  Found claim(uid_t owner, uint64_t instance, std::chrono::steady_clock::time_point deadline,
              const std::function<bool()>& stillWanted);
  // The claimed number's session (0: none was made; a later handshake may claim it again).
  void made(uid_t owner, uint64_t instance, int64_t session);
  // The session made for this number (0: none, or not yet).
  int64_t sessionOf(uid_t owner, uint64_t instance);

 private:
  using Key = std::pair<uid_t, uint64_t>;
  static constexpr int64_t kMaking = -1;
  std::mutex m_mutex;
  std::condition_variable m_madeCv;
  std::map<Key, int64_t> m_sessions;  // kMaking while its first handshake creates it
  std::deque<Key> m_order;            // oldest first, for the bound
};

}  // namespace tidemark::server
