#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace tidemark::server {

// Which live sessions have a stream now, and which wait for their agent to come back.
//
// A stream holds its session while it runs. When it breaks without a goodbye (the agent's
// process died, the network broke, the daemon was stopped) the session is *detached*: its last
// checkpoint is in the store and a new stream may resume it. A detached session is closed as
// aborted (by the caller, from its checkpoint) once its grace period passed, or sooner when its
// process is known to be gone (same host, no such pid). Sessions found live when the daemon
// starts are detached as of then, with the full grace: their agents may be retrying.
class ResumableSessions {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ResumableSessions(std::chrono::seconds grace) : m_grace(grace) {}

  // A new session's stream holds it.
  void hold(int64_t id, grpc::ServerContext* context);
  // A resume: a stream still holding the session is cancelled and waited for (bounded); then
  // the caller holds it. FAILED_PRECONDITION when the session is being closed or the old stream
  // did not end in time; NOT_FOUND when it is not a live session of this store.
  absl::Status holdForResume(int64_t id, grpc::ServerContext* context);
  // The holding stream ended. resumable: detach (wait for the agent); else forget it.
  void release(int64_t id, bool resumable, int32_t pid, const std::string& hostname);
  // The session's agent handed the rest over in a file (IngestService::Handoff): from now on
  // its process being gone does not close it early.
  void markHandedOver(int64_t id);
  // At start: sessions left live by the previous run of the daemon.
  void detachAtStart(int64_t id, int32_t pid, const std::string& hostname);
  // Detached sessions due to be closed, now held by the caller (release(id, false) after).
  std::vector<int64_t> takeExpired();

 private:
  struct Entry {
    grpc::ServerContext* holder = nullptr;  // null: detached (or being closed)
    bool closing = false;                   // taken by takeExpired
    Clock::time_point since{};              // detached since
    bool brokeWhileRunning = false;         // detached by this daemon (not found at start)
    int32_t pid = 0;
    std::string hostname;
  };
  bool processGone(const Entry& e) const;

  std::chrono::seconds m_grace;
  mutable std::mutex m_mutex;
  std::condition_variable m_released;
  std::map<int64_t, Entry> m_entries;
  std::set<int64_t> m_handedOver;
};

}  // namespace tidemark::server
