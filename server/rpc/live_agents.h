#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/ingest/session_ingest.h"
#include "server/store/store.h"
#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::server {

// The agents connected now, by session: how Control reaches a live job. The Ingest handler of a
// stream registers it after the handshake and removes it before the stream ends; writes to a
// stream happen under that stream's own write lock (never the registry's: an agent slow to read
// holds up no other), so they never race each other or the end of the stream (closeWrites).
class LiveAgents {
 public:
  using Stream = grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>;
  using IngestFn = std::function<void(const SessionIngest&)>;
  // A stream's ingest, as queries reach it: under `mutex` (which its batches take too), and only
  // while `ingest` is set (the stream's handler clears it, under the mutex, before the ingest
  // ends). Shared, so that a query holds it without holding the registry.
  struct IngestGuard {
    std::mutex mutex;
    const SessionIngest* ingest = nullptr;
    // The rows of the batches up to postedBatch are handed to the store's writer (under mutex).
    // A reader that needs what came before now sets commitWanted: the stream's handler then
    // hands its rows over at its next message instead of waiting for its checkpoint interval.
    uint64_t postedBatch = 0;
    std::atomic<bool> commitWanted{false};
    std::condition_variable posted;
    // Writes to the stream, one at a time; none once its handler closed them.
    std::mutex writeMutex;
    bool writable = true;
    void closeWrites() {
      std::lock_guard<std::mutex> lock(writeMutex);
      writable = false;
    }
    void detach() {
      {
        std::lock_guard<std::mutex> lock(mutex);
        ingest = nullptr;
      }
      posted.notify_all();
    }
    void setPosted(uint64_t batch) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        postedBatch = batch;
      }
      commitWanted.store(false, std::memory_order_relaxed);
      posted.notify_all();
    }
  };

  void add(int64_t session, Stream* stream, std::shared_ptr<IngestGuard> guard) {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_streams[session] = {stream, std::move(guard)};
  }
  // Only if `stream` is still the session's (a resumed session registers its new stream
  // before the old one's handler has wound down).
  void remove(int64_t session, Stream* stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_streams.find(session);
    if (it != m_streams.end() && it->second.stream == stream) m_streams.erase(it);
  }
  // The stream's handler is committing what the ingest held (its end, or a checkpoint): until
  // endingDone, a query waits for the commit rather than read a store without the ingest's
  // open blocks and rows. Counted: a resumed session's two handlers may overlap.
  void removeEnding(int64_t session, Stream* stream) {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_streams.find(session);
    if (it != m_streams.end() && it->second.stream == stream) m_streams.erase(it);
    ++m_ending[session];
  }
  void endingDone(int64_t session) {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      auto it = m_ending.find(session);
      if (it == m_ending.end()) return;
      if (--it->second == 0) m_ending.erase(it);
    }
    m_endingChanged.notify_all();
  }
  // A write by the stream's own handler (acknowledgements), serialized with Control's.
  static bool write(IngestGuard& guard, Stream* stream, const v1::ServerMessage& message) {
    std::lock_guard<std::mutex> lock(guard.writeMutex);
    return guard.writable && stream->Write(message);
  }
  // FAILED_PRECONDITION when the session has no connected agent or the write fails.
  absl::Status send(int64_t session, const v1::ServerMessage& message) {
    Entry entry;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      auto it = m_streams.find(session);
      if (it == m_streams.end())
        return absl::FailedPreconditionError("session " + std::to_string(session) +
                                             " is not running (no agent connected for it)");
      entry = it->second;
    }
    if (!write(*entry.guard, entry.stream, message))
      return absl::FailedPreconditionError("session " + std::to_string(session) +
                                           "'s agent stream is closing");
    return absl::OkStatus();
  }
  // Runs fn on the session's ingest (its blocks not freed yet, which the store gets only when
  // freed or at the end; its live analysis), under the ingest's own lock only: other streams'
  // writes do not wait for it. False when the session has no connected agent.
  // A session whose stream is ending is waited for (up to kEndingWait), then false.
  bool visit(int64_t session, const IngestFn& fn) {
    std::shared_ptr<IngestGuard> guard = findGuard(session);
    if (!guard) return false;
    std::lock_guard<std::mutex> lock(guard->mutex);
    if (guard->ingest == nullptr) return false;
    fn(*guard->ingest);
    return true;
  }
  // The blocks the session's ingest holds open, taken at a moment when the rows of every batch
  // it took are handed to the store's writer: one cut of the session, so that a block freed in a
  // batch is either open here or in a row the writer commits next, never in neither (a snapshot
  // taken after later batches, whose rows are not handed over yet, loses the blocks they freed).
  // Waits up to `timeout` for the stream's handler to hand its rows over (it does at its next
  // message when asked). nullopt: the session has no connected agent (a stream that was ending
  // is waited for, as visit does, so that its rows are committed); UNAVAILABLE: no cut in time.
  struct Cut {
    std::vector<BlockRow> openBlocks;
    uint64_t nextEventSeq = 0;  // every event before it is in the cut, none after
  };
  absl::StatusOr<std::optional<Cut>> openBlocksAtPostedCut(int64_t session,
                                                           std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::shared_ptr<IngestGuard> guard = findGuard(session);
      if (!guard) return std::nullopt;
      std::unique_lock<std::mutex> lock(guard->mutex);
      auto behind = [&] {
        return guard->ingest != nullptr && guard->postedBatch + 1 < guard->ingest->nextBatchSeq();
      };
      while (behind()) {
        guard->commitWanted.store(true, std::memory_order_relaxed);
        if (guard->posted.wait_until(lock, deadline) == std::cv_status::timeout && behind())
          return absl::UnavailableError(
              "session " + std::to_string(session) +
              " is live and its latest rows were not handed to the store in time (a busy "
              "daemon): ask again");
      }
      if (guard->ingest == nullptr) continue;  // its stream ended meanwhile: wait for its end
      return std::optional<Cut>(Cut{guard->ingest->openBlocks(), guard->ingest->nextEventSeq()});
    }
    return std::nullopt;
  }

 private:
  // The session's guard; a session whose stream is ending is waited for (up to kEndingWait),
  // then none.
  std::shared_ptr<IngestGuard> findGuard(int64_t session) {
    std::unique_lock<std::mutex> lock(m_mutex);
    auto it = m_streams.find(session);
    if (it == m_streams.end()) {
      m_endingChanged.wait_for(lock, kEndingWait, [&] {
        return m_ending.count(session) == 0 || m_streams.count(session) != 0;
      });
      it = m_streams.find(session);
      if (it == m_streams.end()) return nullptr;
    }
    return it->second.guard;
  }
  struct Entry {
    Stream* stream = nullptr;
    std::shared_ptr<IngestGuard> guard;
  };
  static constexpr std::chrono::seconds kEndingWait{30};
  std::mutex m_mutex;
  std::condition_variable m_endingChanged;
  std::map<int64_t, Entry> m_streams;
  std::map<int64_t, int> m_ending;
};

}  // namespace tidemark::server
