#include "server/store/retention.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace tidemark::server {

absl::StatusOr<std::chrono::seconds> parseDuration(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  if (unit == "m") scale = 60;
  if (unit == "h") scale = 3600;
  if (unit == "d") scale = 86400;
  if (text.empty() || end == text.c_str() || scale == 0 || !(value > 0) || value * scale > 3e9)
    return absl::InvalidArgumentError("bad duration '" + text + "' (examples: 30d, 12h, 90m, 45s)");
  return std::chrono::seconds(static_cast<int64_t>(value * scale + 0.5));
}

void releaseFreePages(StoreWriter& writer) {
  // In parts, so that ingest waits for none of them long; until no page is left free, or none
  // went (a store made before incremental auto-vacuum only reuses its free pages).
  for (int64_t before = -1;;) {
    auto left = std::make_shared<int64_t>(0);
    const absl::Status s = writer
                               .submit([left](Store& store) -> absl::Status {
                                 if (auto r = store.releaseFreePages(16384); !r.ok()) return r;
                                 auto free = store.freePageCount();
                                 if (!free.ok()) return free.status();
                                 *left = *free;
                                 return absl::OkStatus();
                               })
                               .get();
    if (!s.ok() || *left == 0 || *left == before) return;
    before = *left;
  }
}

absl::Status pruneRawEvents(StoreWriter& writer, int64_t sessionId, int64_t wallNs) {
  if (wallNs != 0) {
    if (auto s =
            writer.submit([=](Store& st) { return st.markRawPruned(sessionId, wallNs); }).get();
        !s.ok())
      return s;
  }
  for (;;) {
    auto deleted = std::make_shared<int64_t>(0);
    const absl::Status s = writer
                               .submit([sessionId, deleted](Store& st) -> absl::Status {
                                 auto n = st.deleteRawSlice(sessionId, 200000);
                                 if (!n.ok()) return n.status();
                                 *deleted = *n;
                                 return absl::OkStatus();
                               })
                               .get();
    if (!s.ok()) return s;
    if (*deleted == 0) return absl::OkStatus();
  }
}

absl::Status deleteSession(StoreWriter& writer, int64_t sessionId) {
  // NOT_FOUND first, before anything is touched.
  if (auto s = Store::getSession(writer.path(), sessionId); !s.ok()) return s.status();
  if (auto s = pruneRawEvents(writer, sessionId, 0); !s.ok()) return s;
  if (auto s = writer.submit([=](Store& st) { return st.deleteSession(sessionId); }).get(); !s.ok())
    return s;
  releaseFreePages(writer);
  return absl::OkStatus();
}

RetentionKeeper::RetentionKeeper(StoreWriter& writer, RetentionLimits limits)
    : m_writer(writer), m_limits(limits) {
  // Always: without limits it only finishes the prunes a stopped daemon left half done.
  m_thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "td-retention");
    run();
  });
}

RetentionKeeper::~RetentionKeeper() { stop(); }

void RetentionKeeper::poke() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_poked = true;
  }
  m_cv.notify_all();
}

void RetentionKeeper::stop() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stopping = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void RetentionKeeper::run() {
  std::unique_lock<std::mutex> lock(m_mutex);
  while (!m_stopping) {
    // At start at once (m_poked), then every minute, or sooner for a short --retain (a quarter of
    // it, at least a second); without limits, only when poked.
    const auto every = std::clamp<std::chrono::seconds>(
        m_limits.retain / 4, std::chrono::seconds(1), std::chrono::seconds(60));
    auto ready = [this] { return m_stopping || m_poked; };
    if (!m_limits.any()) {
      m_cv.wait(lock, ready);
    } else {
      m_cv.wait_for(lock, m_limits.retain.count() > 0 ? every : std::chrono::seconds(60), ready);
    }
    if (m_stopping) return;
    m_poked = false;
    lock.unlock();
    runOnce();
    lock.lock();
  }
}

namespace {
int64_t nowWallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

RetentionKeeper::Pass RetentionKeeper::runOnce() {
  Pass pass;
  auto sessions = Store::listSessions(m_writer.path());
  if (!sessions.ok()) {
    std::fprintf(stderr, "tidemarkd: retention: %s\n", sessions.status().ToString().c_str());
    return pass;
  }
  // A store shared by several daemons: each keeps its own sessions within the limits.
  std::erase_if(*sessions, [&](const SessionRecord& r) {
    return !Store::isOwnSession(m_writer.path(), r, m_writer.daemonName());
  });
  auto say = [](const absl::Status& s, const char* what, int64_t id) {
    if (!s.ok())
      std::fprintf(stderr, "tidemarkd: retention: %s session %lld: %s\n", what,
                   static_cast<long long>(id), s.ToString().c_str());
    return s.ok();
  };
  const int64_t now = nowWallNs();
  if (m_firstPass) {  // a prune a stopped daemon left half done goes on
    m_firstPass = false;
    for (const SessionRecord& r : *sessions)
      if (r.rawPrunedWallNs) say(pruneRawEvents(m_writer, r.id, 0), "pruning", r.id);
  }
  auto prunable = [](const SessionRecord& r) {
    return r.state != 1 && r.analyzed && !r.rawPrunedWallNs;  // ended, summaries stored
  };
  bool changed = false;
  if (m_limits.retain.count() > 0) {
    const int64_t before =
        now - std::chrono::duration_cast<std::chrono::nanoseconds>(m_limits.retain).count();
    for (SessionRecord& r : *sessions) {
      if (!prunable(r) || r.endedWallNs() >= before) continue;
      const int64_t id = r.id;
      if (say(pruneRawEvents(m_writer, id, now), "pruning", id)) {
        r.rawPrunedWallNs = now;
        ++pass.rawPruned;
        changed = true;
      }
    }
  }
  if (changed) releaseFreePages(m_writer);
  if (m_limits.maxStoreBytes > 0) {
    for (;;) {
      auto used = std::make_shared<int64_t>(0);
      if (!m_writer
               .submit([used](Store& s) -> absl::Status {
                 auto b = s.bytesInUse();
                 if (!b.ok()) return b.status();
                 *used = *b;
                 return absl::OkStatus();
               })
               .get()
               .ok() ||
          *used <= m_limits.maxStoreBytes)
        break;
      SessionRecord* victim = nullptr;
      for (SessionRecord& r : *sessions)  // oldest first: raw events of an analyzed one
        if (prunable(r)) {
          victim = &r;
          break;
        }
      if (victim != nullptr) {
        const int64_t id = victim->id;
        if (!say(pruneRawEvents(m_writer, id, now), "pruning", id)) break;
        victim->rawPrunedWallNs = now;
        ++pass.rawPruned;
      } else {
        // Then a whole ended session (analysed: one just ended waits for its analysis).
        for (SessionRecord& r : *sessions)
          if (r.state != 1 && r.id > 0 && (r.analyzed || r.rawPrunedWallNs)) {
            victim = &r;
            break;
          }
        if (victim == nullptr) {
          if (!m_saidOverLimit)
            std::fprintf(stderr,
                         "tidemarkd: retention: the store holds %lld bytes, over --max-store, "
                         "and only live sessions (or ones not analysed yet) are left\n",
                         static_cast<long long>(*used));
          m_saidOverLimit = true;
          break;
        }
        const int64_t id = victim->id;
        if (!say(deleteSession(m_writer, id), "deleting", id)) break;
        victim->id = -1;  // gone
        ++pass.sessionsDeleted;
      }
      releaseFreePages(m_writer);
    }
  }
  return pass;
}

}  // namespace tidemark::server
