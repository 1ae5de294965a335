#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "server/ingest/live_rebuild.h"
#include "server/store/store.h"
#include "src/core/block_key.h"
#include "src/core/live_analysis.h"
#include "src/core/live_feed.h"
#include "tidemark/v1/checkpoint.pb.h"
#include "tidemark/v1/events.pb.h"

namespace tidemark::server {

// The ingest pipeline of one session, without gRPC or SQLite: validate → order → pair.
//
// Events are released in sequence order (the agent's sequence numbers are dense, so the next
// one to release is always known); a bounded reorder buffer absorbs batches that arrive out of
// order. Released allocs wait for their free in an address map; a block becomes one row when
// freed, or at the end as live. Bad or impossible data (a free of an untracked address, an end
// without a begin) is counted in stats, never an error; only malformed batches are errors.
class SessionIngest {
 public:
  // Events held out of order at most (about 120 MiB); past it the oldest is released early and
  // the hole counted (`reorder_overflow`, `seq_gap`). The agent sends each collector pass in
  // order, but a thread descheduled between taking its sequence number and publishing its
  // record shows up passes later: on a loaded 2-core machine 8 bursting threads reach well past
  // 65,536 events of distance.
  static constexpr size_t kMaxPendingEvents = 1u << 20;
  // Interned strings (module paths, tensor names): one at most 64 KiB, a session's at most
  // 64 MiB in all; past either the batch is malformed.
  static constexpr size_t kMaxStringBytes = 64u << 10;
  static constexpr uint64_t kMaxSessionStringBytes = 64ull << 20;
  // The largest block or tag size taken (256 TiB, beyond any device or host of today): a size
  // past it is a malformed event, so that no sum of sizes can overflow the int64 figures.
  static constexpr uint64_t kMaxSizeBytes = 1ull << 48;
  // The longest range of sequence numbers one Summarized event may stand for.
  static constexpr uint64_t kMaxSummarizedRange = 1ull << 40;

  // liveWindowEdges: what the live analysis holds at most before it replays (its memory share).
  explicit SessionIngest(int64_t sessionId,
                         size_t liveWindowEdges = core::LiveAnalysis::kDefaultWindowEdges)
      : m_live(std::make_unique<core::LiveAnalysis>(liveWindowEdges)) {
    m_rows.sessionId = sessionId;
  }

  // INVALID_ARGUMENT for a malformed batch: a batch_seq past the next one, an event without
  // payload, a zero or repeated sequence number, a zero string id, a size over kMaxSizeBytes,
  // strings past kMaxStringBytes or kMaxSessionStringBytes.
  // A batch_seq before the next one is a batch resent after a reconnect: skipped, counted.
  absl::Status addBatch(const v1::EventBatch& batch);
  // Rows completed since the last call, with the live analysis's step peaks (under its ticket,
  // rowsTicket()); once they are in the store, rowsStored lets the analysis forget those steps.
  SessionRows takeRows();
  uint64_t rowsTicket() const { return m_live ? m_live->handoutTicket() : 0; }
  void rowsStored(uint64_t ticket) {
    if (m_live) m_live->storedThrough(ticket);
  }
  // End of the stream: releases what is buffered (counting gaps), closes open intervals and
  // emits the blocks still live as live rows.
  SessionRows finish();

  std::vector<StatRow> stats() const;
  // The agent's counters as its latest batch that had them reported (none: no batch had them):
  // for a session that ends without the agent's goodbye.
  const std::optional<v1::AgentCounters>& agentCounters() const { return m_agentCounters; }
  int64_t liveBlocksAtEnd() const { return m_liveAtEnd; }
  // The blocks allocated and not freed so far (they become rows only when freed or at the end).
  std::vector<BlockRow> openBlocks() const {
    std::vector<BlockRow> out;
    out.reserve(m_open.size());
    for (const auto& [address, b] : m_open) out.push_back(b);
    return out;
  }
  int64_t lastTsNs() const { return m_lastTs; }
  // What a live session answers as its events come (peak, steps, timeline), or nullptr when the
  // ingest did not see the session from its start and took on no live analysis that did (it
  // continues from a checkpoint after a restart of the daemon: it would lack what came before).
  const core::LiveAnalysis* live() const {
    adoptRebuiltLive();
    return m_live.get();
  }
  // After finish(): the session's analysis from its live one (exact or not), or nullopt when it
  // had none.
  std::optional<core::LiveAnalysis::Final> takeLiveFinal() {
    return std::exchange(m_liveFinal, {});
  }
  // About how much memory the rows not taken yet hold: what their vectors have allocated (a
  // vector that grows takes up to twice what it holds; counting its elements only, a session's
  // rows held up to twice their share), and the text of their interned strings.
  size_t pendingRowBytes() const {
    size_t analysis = m_rowStringBytes + m_rows.strings.capacity() * sizeof(m_rows.strings[0]);
    for (const core::TimelineChunk& c : m_rows.timelineChunks)
      analysis += c.samples.capacity() * sizeof(core::TimelineSample);
    for (const auto& [chunk, codes] : m_rows.blockCodes) analysis += codes.capacity();
    // (A step's peak is the live analysis's too, counted in full here all the same: that
    // analysis may go first, with its session's end.)
    analysis +=
        m_rows.stepPeaks.capacity() * (sizeof(core::SharedPeakReport) + sizeof(core::PeakReport));
    return analysis + m_rows.blocks.capacity() * sizeof(BlockRow) +
           m_rows.tags.capacity() * sizeof(TagRow) + m_rows.stacks.capacity() * sizeof(StackRow) +
           m_rows.counters.capacity() * sizeof(CounterRow) +
           m_rows.launches.capacity() * sizeof(LaunchRow) +
           (m_rows.scopes.capacity() + m_rows.phases.capacity()) * sizeof(IntervalRow);
  }
  void setFirstBatchSeq(uint64_t seq) { m_nextBatchSeq = seq; }
  void setFirstEventSeq(uint64_t seq) { m_nextSeq = seq; }
  uint64_t nextBatchSeq() const { return m_nextBatchSeq; }
  // The sequence number of the next event to release: every event before it is applied.
  uint64_t nextEventSeq() const { return m_nextSeq; }

  // The state between batches, for the store, as of the rows taken so far: the small part
  // whole (open intervals and steps, the next sequence numbers, the reorder buffer, the counts)
  // and the open blocks as a change since the previous checkpoint (blocks opened and still open,
  // blocks of the previous checkpoint closed since), so that a long-lived block is written once.
  struct Checkpoint {
    v1::IngestCheckpoint state;
    bool full = false;             // opened holds every open block; closed is empty
    std::vector<BlockRow> opened;  // to add (or replace, at the same key)
    std::vector<BlockRow> closed;  // to remove (memoryKind, device, address are the key)
  };
  // full: every open block rather than the change (the store drops the changes before it).
  Checkpoint takeCheckpoint(bool full);
  size_t openBlockCount() const { return m_open.size(); }
  // The live analysis of a session whose stream broke, taken from its ingest (which has none
  // after) with where that ingest stood, for the stream that resumes the session on this daemon.
  struct KeptLive {
    std::unique_ptr<core::LiveAnalysis> analysis;
    uint64_t nextBatchSeq = 0;
    uint64_t nextEventSeq = 0;
  };
  KeptLive keepLive() { return KeptLive{std::move(m_live), m_nextBatchSeq, m_nextSeq}; }
  // Continues from a checkpoint: its state and every open block the store holds for it, as if
  // the batches it accounts for had just been added. `kept`: the live analysis the stream before
  // left, taken on when it stands where the checkpoint does (it has seen every event the store
  // holds, and none after); else the session continues without one.
  absl::Status restore(const v1::IngestCheckpoint& state, const std::vector<BlockRow>& open,
                       KeptLive kept);
  absl::Status restore(const v1::IngestCheckpoint& state, const std::vector<BlockRow>& open) {
    return restore(state, open, KeptLive());
  }
  // After a restore without a live analysis (a restart of the daemon): builds it again from the
  // store (LiveRebuild, from the same checkpoint and open blocks), taken on at a batch or a
  // takeRows() once it has caught up; live() is nullptr until then.
  void rebuildLive(LiveRebuild::Options options, v1::IngestCheckpoint state,
                   std::vector<BlockRow> open);
  bool rebuildingLive() const { return m_rebuild != nullptr; }

 private:
  void releaseReady();
  // The sequence number after an event: after the range it stands for, for a Summarized one.
  static uint64_t seqAfter(const v1::Event& e) {
    return (e.has_summarized() ? e.summarized().last_seq() : e.seq()) + 1;
  }
  void release(const v1::Event& e);
  void count(const std::string& name, int64_t n = 1) { m_stats[name] += n; }
  static void openInterval(std::vector<IntervalRow>& stack, IntervalRow row, const v1::Event& e);
  // Closes the innermost open interval that matches, and those still open inside it. False if
  // none matches.
  template <typename Match>
  bool closeInnermost(std::vector<IntervalRow>& stack, Match match, const v1::Event& e,
                      std::vector<IntervalRow>& out);

  SessionRows m_rows;
  uint64_t m_nextBatchSeq = 1;
  uint64_t m_nextSeq = 1;
  uint64_t m_stringBytes = 0;
  size_t m_rowStringBytes = 0;  // the text of m_rows.strings
  int64_t m_lastTs = 0;
  int64_t m_liveAtEnd = 0;
  std::map<uint64_t, v1::Event> m_pending;
  // Sequence ranges [begin, end) the reorder buffer gave up waiting for (lossy or degraded
  // agents drop events): an event of one that still comes is late, not a duplicate. The most
  // recent kMaxSkippedGaps are kept.
  static constexpr size_t kMaxSkippedGaps = 65536;
  std::map<uint64_t, uint64_t> m_skippedGaps;
  bool inSkippedGap(uint64_t seq) const;
  void takeFromSkippedGap(uint64_t seq);
  // Live blocks by memory kind, device and address: a tensor starts at its segment's address,
  // and device addresses are per device.
  using OpenKey = core::BlockKey;
  absl::flat_hash_map<OpenKey, BlockRow> m_open;
  // Changes to m_open since the last checkpoint: keys opened (not in the store yet, or replaced
  // there) and keys of stored blocks closed since.
  absl::flat_hash_set<OpenKey> m_openedSinceCheckpoint;
  absl::flat_hash_set<OpenKey> m_closedSinceCheckpoint;
  void noteOpened(const OpenKey& k) { m_openedSinceCheckpoint.insert(k); }
  void noteClosed(const OpenKey& k) {
    // Opened since the last checkpoint: the store never saw it.
    if (m_openedSinceCheckpoint.erase(k) == 0) m_closedSinceCheckpoint.insert(k);
  }
  // Open scopes per thread and kind (ops nest apart from modules).
  static uint64_t stackKey(uint32_t thread, int kind) {
    return (static_cast<uint64_t>(kind) << 32) | thread;
  }
  std::unordered_map<uint64_t, std::vector<IntervalRow>> m_scopeStacks;
  std::unordered_map<uint32_t, std::vector<IntervalRow>> m_phaseStacks;  // open, per thread
  std::map<int64_t, StepRow> m_openSteps;
  std::map<std::string, int64_t> m_stats;
  // The agent's counters as the latest batch that carried them said (EventBatch.counters).
  std::optional<v1::AgentCounters> m_agentCounters;
  // None once restored without one kept, until m_rebuild has built it again. Mutable: live()
  // takes on a rebuilt one that has caught up (under the ingest's lock, as every caller holds).
  mutable std::unique_ptr<core::LiveAnalysis> m_live;
  mutable std::unique_ptr<LiveRebuild> m_rebuild;
  bool feedingLive() const { return m_live || m_rebuild; }
  void feedLive(const core::LiveCall& c);
  void adoptRebuiltLive() const;
  std::optional<core::LiveAnalysis::Final> m_liveFinal;
  // The innermost scope of a kind (ScopeKind) open on a thread: its name, 0 for none.
  uint32_t innermostScope(uint32_t thread, int kind) const {
    auto it = m_scopeStacks.find(stackKey(thread, kind));
    return it == m_scopeStacks.end() || it->second.empty() ? 0 : it->second.back().nameIid;
  }
};

}  // namespace tidemark::server
