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
// starts are detached as of then, with the full grace: their agents may be retrying. Before a
// session whose process is gone is closed, the caller looks once for the rest of its run that the
// agent left in a file (its spool, written at an exit the daemon did not answer in time) and takes
// that up instead (restTakenUp).
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
  // The session's agent handed the rest over in a file (IngestService::Handoff), or the daemon
  // takes up such a file left by its previous run: from now until fileDone neither its process
  // being gone nor its grace closes it.
  void markHandedOver(int64_t id);
  // Done with the file handed over: a session still live after it (the file could not be taken,
  // or ended early) is closed once its process is gone, after a look for a file its agent left
  // (its spool) when none was looked for yet.
  void fileDone(int64_t id);
  // At start: sessions left live by the previous run of the daemon.
  void detachAtStart(int64_t id, int32_t pid, const std::string& hostname);
  // Whether the session was found live at this daemon's start (detachAtStart) and has not been
  // closed since: the daemon that made it, and knew which agent's number it was made for, is
  // gone.
  bool wasLiveAtStart(int64_t id) const;

  struct Expired {
    int64_t id = 0;
    bool processGone = false;  // look for a file its agent left before closing it (once)
    bool due = false;          // closed unless such a file is found; else it waits on
  };
  // Detached sessions due to be closed, or whose process is gone (not looked at before), now held
  // by the caller: then release(id, false) once closed, keepWaiting(id) when not due, or
  // restTakenUp(id) when the rest of its run was found.
  std::vector<Expired> takeExpired();
  // Not closed after all: detached as before (its grace counted from when it was detached).
  void keepWaiting(int64_t id);
  // The rest of its run was found in a file and is being taken up (its process is gone): it
  // waits for that, as for a file handed over (until fileDone).
  void restTakenUp(int64_t id);

 private:
  struct Entry {
    grpc::ServerContext* holder = nullptr;  // null: detached (or being closed)
    bool closing = false;                   // taken by takeExpired
    Clock::time_point since{};              // detached since
    bool brokeWhileRunning = false;         // detached by this daemon (not found at start)
    bool lookedForFile = false;             // its process gone, a file of its agent looked for
    int32_t pid = 0;
    std::string hostname;
  };
  bool processGone(const Entry& e) const;

  std::chrono::seconds m_grace;
  mutable std::mutex m_mutex;
  std::condition_variable m_released;
  std::map<int64_t, Entry> m_entries;
  std::set<int64_t> m_handedOver;
  std::set<int64_t> m_liveAtStart;
};

}  // namespace tidemark::server
