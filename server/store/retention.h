#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/store/writer.h"

namespace tidemark::server {

// Keeps the store within its limits (tidemarkd --retain, --max-store): the raw events of ended,
// analyzed sessions go first, oldest first (their summaries stay: the session, its steps, stored
// peaks and timeline), then whole sessions, oldest first; live sessions are never touched. Freed
// pages go back to the file system. Runs at start, after each session ends, and every minute.
struct RetentionLimits {
  std::chrono::seconds retain{0};  // 0: kept however old
  int64_t maxStoreBytes = 0;       // 0: no limit
  bool any() const { return retain.count() > 0 || maxStoreBytes > 0; }
};

// "30d", "12h", "90m", "45s" (a number alone is seconds); an error for anything else.
absl::StatusOr<std::chrono::seconds> parseDuration(const std::string& text);

// Gives the store's free pages back to the file system, 64 MiB a transaction.
void releaseFreePages(StoreWriter& writer);
// Drops a session's raw events a slice at a time (Store::markRawPruned, deleteRawSlice).
absl::Status pruneRawEvents(StoreWriter& writer, int64_t sessionId, int64_t wallNs);
// Deletes a session whole: its raw events in slices, then the rest; the pages back.
absl::Status deleteSession(StoreWriter& writer, int64_t sessionId);

// The daemon's retention thread: a pass at start (it finishes the prunes a stopped daemon left
// half done, limits or not), then with --retain/--max-store every minute (a quarter of --retain
// when shorter) and after each analysis.
class RetentionKeeper {
 public:
  RetentionKeeper(StoreWriter& writer, RetentionLimits limits);
  ~RetentionKeeper();
  // Asks for a pass soon (a session ended).
  void poke();
  // One pass now, on the caller's thread (tests): what it did.
  struct Pass {
    int rawPruned = 0;
    int sessionsDeleted = 0;
  };
  Pass runOnce();
  void stop();

 private:
  void run();
  StoreWriter& m_writer;
  RetentionLimits m_limits;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  bool m_poked = true;  // a pass at start
  bool m_stopping = false;
  bool m_saidOverLimit = false;
  bool m_firstPass = true;  // finishes prunes a stopped daemon left half done
  std::thread m_thread;
};

}  // namespace tidemark::server
