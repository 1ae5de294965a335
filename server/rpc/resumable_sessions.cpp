#include "server/rpc/resumable_sessions.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "src/base/host_name.h"

namespace tidemark::server {

namespace {
// A session's process is given this long to come back even when it looks gone (a pid check is
// only a hint: another pid namespace shares the host name).
constexpr auto kGoneProcessGrace = std::chrono::seconds(2);
}  // namespace

void ResumableSessions::hold(int64_t id, grpc::ServerContext* context) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_entries[id] = Entry{context, false, {}, false, false, 0, ""};
}

absl::Status ResumableSessions::holdForResume(int64_t id, grpc::ServerContext* context) {
  std::unique_lock<std::mutex> lock(m_mutex);
  auto it = m_entries.find(id);
  if (it == m_entries.end()) {
    return absl::NotFoundError("session " + std::to_string(id) +
                               " is not a live session of this tidemarkd");
  }
  const auto closing = [&] {
    return absl::FailedPreconditionError(
        "session " + std::to_string(id) +
        " has been closed: its agent did not come back within the resume grace period");
  };
  if (it->second.closing) return closing();
  if (it->second.holder != nullptr) {
    // The old stream of this agent has not noticed it is gone yet (a hung daemon resumed): end
    // it; its handler commits what it received before releasing the session.
    it->second.holder->TryCancel();
    const bool released = m_released.wait_for(lock, std::chrono::seconds(10), [&] {
      auto e = m_entries.find(id);
      return e == m_entries.end() || e->second.holder == nullptr;
    });
    it = m_entries.find(id);
    if (it != m_entries.end() && it->second.closing) return closing();
    if (!released || it == m_entries.end()) {
      return absl::FailedPreconditionError("session " + std::to_string(id) +
                                           " is held by another stream or was closed meanwhile");
    }
  }
  it->second.holder = context;
  return absl::OkStatus();
}

void ResumableSessions::release(int64_t id, bool resumable, int32_t pid,
                                const std::string& hostname) {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (!resumable) {
      m_entries.erase(id);
      m_handedOver.erase(id);
      m_liveAtStart.erase(id);
    } else {
      // (A session whose rest its agent handed over in a file waits for the file, not for its
      // process, gone by design: see takeExpired.)
      const auto old = m_entries.find(id);
      const bool looked = old != m_entries.end() && old->second.lookedForFile;
      m_entries[id] = Entry{nullptr, false, Clock::now(), true, looked, pid, hostname};
    }
  }
  m_released.notify_all();
}

void ResumableSessions::markHandedOver(int64_t id) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_handedOver.insert(id);
}

void ResumableSessions::fileDone(int64_t id) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_handedOver.erase(id);
}

void ResumableSessions::detachAtStart(int64_t id, int32_t pid, const std::string& hostname) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_entries[id] = Entry{nullptr, false, Clock::now(), false, false, pid, hostname};
  m_liveAtStart.insert(id);
}

bool ResumableSessions::wasLiveAtStart(int64_t id) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_liveAtStart.count(id) != 0;
}

bool ResumableSessions::processGone(const Entry& e) const {
  if (e.pid <= 0 || e.hostname.empty() || e.hostname != base::hostName()) return false;
  return kill(e.pid, 0) != 0 && errno == ESRCH;
}

void ResumableSessions::keepWaiting(int64_t id) {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_entries.find(id);
  if (it != m_entries.end()) it->second.closing = false;
}

void ResumableSessions::restTakenUp(int64_t id) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_handedOver.insert(id);
  auto it = m_entries.find(id);
  if (it != m_entries.end()) {
    it->second.closing = false;
    it->second.since = Clock::now();  // the full grace for the file (a store that cannot be
                                      // written meanwhile)
  }
}

std::vector<ResumableSessions::Expired> ResumableSessions::takeExpired() {
  std::vector<Expired> out;
  std::lock_guard<std::mutex> lock(m_mutex);
  const Clock::time_point now = Clock::now();
  for (auto& [id, e] : m_entries) {
    if (e.holder != nullptr || e.closing) continue;
    const auto detached = now - e.since;
    // A session whose rest is being taken from a file waits for the file — not for its process
    // (gone by design), nor for its grace: a store that cannot be written (a full disk) for
    // longer than the grace would otherwise see the session closed as aborted first, and the
    // rest, refused then, become a second session. The file's taker says when it is done.
    const bool waitsForFile = m_handedOver.count(id) != 0;
    const bool gone = !waitsForFile && detached >= kGoneProcessGrace && processGone(e);
    // Sessions found at start wait the full grace even when their process is gone (once looked
    // for the file its agent left): `tidemark upload` of a spool elsewhere still resumes them.
    const bool due = (!waitsForFile && detached >= m_grace) || (gone && e.brokeWhileRunning);
    const bool lookFirst = gone && !e.lookedForFile;
    if (due || lookFirst) {
      e.closing = true;
      e.lookedForFile = e.lookedForFile || gone;
      out.push_back({id, lookFirst, due});
    }
  }
  return out;
}

}  // namespace tidemark::server
