#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "server/ingest/session_ingest.h"

namespace tidemark::server {

// The live analyses of sessions whose stream broke, each kept for the stream that resumes its
// session on this daemon (an agent reconnecting after a network break or a stalled store, a
// file handed over at exit), so that the session goes on answering as it grows and is stored
// analysed at its end, instead of loading its recording for every query and running the
// analysis pass. Bounded: past maxBytes in all the oldest are dropped (their sessions then
// continue without one, as after a restart of the daemon). Thread-safe.
class KeptLiveAnalyses {
 public:
  explicit KeptLiveAnalyses(size_t maxBytes) : m_maxBytes(maxBytes) {}

  void keep(int64_t sessionId, SessionIngest::KeptLive kept);
  // The session's kept analysis, no longer kept here (an empty one if none).
  SessionIngest::KeptLive take(int64_t sessionId);
  void drop(int64_t sessionId) { take(sessionId); }

  size_t count() const;
  size_t heldBytes() const;

 private:
  struct Entry {
    SessionIngest::KeptLive kept;
    size_t bytes = 0;
    uint64_t order = 0;  // when kept: the lowest goes first
  };
  const size_t m_maxBytes;
  mutable std::mutex m_mutex;
  std::map<int64_t, Entry> m_entries;
  size_t m_bytes = 0;
  uint64_t m_order = 0;
};

}  // namespace tidemark::server
