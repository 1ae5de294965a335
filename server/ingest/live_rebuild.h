#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/store/store.h"
#include "src/core/live_analysis.h"
#include "src/core/live_feed.h"
#include "tidemark/v1/checkpoint.pb.h"

namespace tidemark::server {

// A session's live analysis built again from the store, for a session resumed after a restart
// of the daemon (the analysis that saw it from its start went with the old process). A thread of
// its own reads every event the store holds from before the checkpoint the session resumed from
// and feeds them in sequence order as the ingest fed them: the blocks sorted by allocation on
// disk (the store keeps them by free), the frees, tags, phases, module scopes and steps merged
// by sequence number, each allocation with the module and op scopes open on its thread. The
// ingest meanwhile logs what it feeds from the checkpoint on; the thread applies the log after
// the store, and once it has caught up the ingest takes the analysis on (takeIfCaughtUp).
//
// It answers (peak, steps, timeline) as the lost one would; it hands nothing to the store (the
// lost one handed over its chunks and categories until the restart): the analysis pass still
// runs at the session's end. Bounded: two sessions' stores are read at once at most (the others
// wait their turn, logging); the sorts take sortBytes; the log keeps memoryLogCalls
// calls in memory and the older ones in a temporary file beside the sorts' runs, maxLogCalls in
// all (past them, or when the file cannot be written, the rebuild is given up and the session
// answers from its recording, as without one).
class LiveRebuild {
 public:
  struct Options {
    std::string dbPath;
    int64_t sessionId = 0;
    size_t windowEdges = core::LiveAnalysis::kDefaultWindowEdges;
    size_t maxLogCalls = size_t{1} << 24;  // 16M calls: about 1.1 GiB of file
    size_t memoryLogCalls = 65536;         // the log's calls held in memory; older ones in the file
    std::string tempDir = "/tmp";
    size_t sortBytes = size_t{32} << 20;
    bool quiet = false;  // no line on the daemon's stderr
  };
  // Starts the thread. state, open: the checkpoint the session resumed from and its open blocks.
  LiveRebuild(Options options, v1::IngestCheckpoint state, std::vector<BlockRow> open);
  ~LiveRebuild();  // stops the thread (soon) and waits for it
  LiveRebuild(const LiveRebuild&) = delete;
  LiveRebuild& operator=(const LiveRebuild&) = delete;

  // What the ingest feeds from the checkpoint on, in order. False once the rebuild is given up
  // (error() says why); nothing need be logged after.
  bool log(const core::LiveCall& call);
  void logName(uint32_t iid, std::string text);
  // The analysis with everything logged applied, once the thread has caught up; else nullptr.
  std::unique_ptr<core::LiveAnalysis> takeIfCaughtUp();
  bool failed() const;
  std::string error() const;
  // For tests: the events read from the store.
  int64_t replayedEvents() const { return m_replayed.load(); }

  // What is left in the log when the thread hands over (the ingest applies it under its lock).
  static constexpr size_t kHandOverCalls = 4096;
  // The file's calls read back at a time.
  static constexpr size_t kReadCalls = 65536;

 private:
  void run();
  bool replayStore(core::LiveAnalysis& live);
  void fail(const std::string& why);
  // Under m_mutex: the memory log appended to the file; up to `max` calls of the file not read
  // yet, read.
  bool spillLocked();
  std::vector<core::LiveCall> readSpilledLocked(size_t max);

  Options m_options;
  v1::IngestCheckpoint m_state;
  std::vector<BlockRow> m_open;
  std::atomic<bool> m_cancel{false};
  std::atomic<int64_t> m_replayed{0};
  mutable std::mutex m_mutex;
  std::deque<core::LiveCall> m_log;  // the newest calls; the older ones in the file
  int m_spillFd = -1;
  uint64_t m_spilled = 0;    // calls in the file
  uint64_t m_spillRead = 0;  // of them, applied
  std::vector<std::pair<uint32_t, std::string>> m_names;
  std::unique_ptr<core::LiveAnalysis> m_built;  // caught up with the log
  bool m_caughtUp = false;
  std::string m_error;
  std::thread m_thread;
};

}  // namespace tidemark::server
