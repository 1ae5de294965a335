#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "src/core/block_key.h"
#include "src/core/peak.h"
#include "src/core/recording.h"
#include "src/core/streaming_analysis.h"
#include "src/core/timeline.h"

namespace tidemark::core {

// The analysis of a session while its events arrive, at a cost that does not grow with its
// length: what a live session answers (its peak with what holds it, its steps' peaks, its
// timeline) is kept up to date as events come, holding only what is live (open blocks, open
// phases and scopes), the events of the last stretch and a timeline of bounded size.
//
// A block's category is decided at its free (analysis.h), but the replay needs it from its
// allocation. So events wait in a window until a step ends (or the window holds maxWindowEdges),
// then are replayed with each block's category as known then: decided if freed by then, else
// from its facts so far (a tag, the phase it was born in). A fact that comes later (a tag, a
// tensor placed in the block) moves its bytes to the new category from that moment on. Answers
// also replay the window itself, without keeping it. The stored analysis at the session's end is
// exact and replaces these answers; until then they equal it wherever a block's category was
// known one step after its allocation (tests/unit/live_analysis_test.cpp).
//
// Not thread-safe: the ingest feeds it and queries read it under the session's lock.
//
// The timeline keeps each level of detail until it holds kMaxLevelSamples samples, then drops
// it: a live session of any length answers from at most that many samples a level, at the
// finest level still kept.
class LiveAnalysis {
 public:
  // What an event of the window costs, with its block (for a memory share in edges).
  static constexpr size_t kBytesPerWindowEdge = 128;
  static constexpr size_t kDefaultWindowEdges = 1u << 18;
  static constexpr size_t kMaxLevelSamples = 16384;

  explicit LiveAnalysis(size_t maxWindowEdges = kDefaultWindowEdges);
  ~LiveAnalysis();
  LiveAnalysis(const LiveAnalysis&) = delete;
  LiveAnalysis& operator=(const LiveAnalysis&) = delete;

  // Events in sequence order. Names: interned strings, as they come.
  void name(uint32_t iid, std::string text);
  // moduleIid / opIid: the innermost scope of that kind open on the allocating thread (0: none).
  void alloc(const Block& b, uint32_t moduleIid, uint32_t opIid);
  void free(MemoryKind kind, int32_t device, uint64_t address, uint64_t seq, int64_t tsNs);
  void tag(uint64_t seq, uint64_t address, Category category, uint32_t nameIid);
  void phaseBegin(uint64_t beginSeq, Phase phase);
  void phaseEnd(uint64_t beginSeq, uint64_t endSeq);  // of the phase begun at beginSeq
  void moduleBegin(uint64_t beginSeq, uint32_t nameIid);
  void moduleEnd(uint64_t beginSeq);
  void opScopeSeen() { m_anyOps = true; }  // the session records op scopes
  void stepBegin(int64_t step, uint64_t seq, int64_t tsNs);
  void stepEnd(int64_t step, uint64_t seq, int64_t tsNs);

  // What the session answers now.
  struct StepAnswer {
    StepInterval interval;  // endSeq kOpenSeq while the step runs
    PeakReport peak;        // categories, phase and scope (no items)
  };
  // The whole session's peak (with its modules, ops and tensors), and every step held.
  PeakReport wholePeak(size_t topItems = kPeakItemsKept) const;
  std::vector<StepAnswer> steps() const;
  // A page of the steps still held (storedBelow: those before are the store's) in step order:
  // those numbered `from` or more (every one when nullopt), at most `limit` (the caller asks
  // limit + 1 to learn whether more follow); with `last`, the last `limit`. Costs the page, not
  // the session's steps. *known: the steps the session has, held or stored.
  std::vector<StepAnswer> stepPage(std::optional<int64_t> from, size_t limit, bool last,
                                   size_t* known) const;
  // Buckets over [fromTs, toTs] (toTs 0: up to the last event).
  std::vector<TimelineBucket> timeline(int64_t fromTs, int64_t toTs, int buckets) const;
  // The session's end: replays what is left and returns what the stored analysis holds. Exact
  // (`exact`) when every block counted in the category it ends with from its allocation, the
  // events came in order, and the steps were marked one after another: then equal to the
  // analysis pass's (streaming_analysis.h), whose run at the end it spares. Else `why` says
  // what differs and the pass must run. Nothing is fed after it.
  struct Final {
    bool exact = false;
    std::string why;
    // The whole session's (with its items) first, then each step's not handed on by
    // takeStepPeaks.
    std::vector<PeakReport> peaks;
    CategorizeStats stats;
  };
  Final finish(size_t topItems = kPeakItemsKept);
  // The timeline's levels of detail as the analysis pass stores them: the chunks completed since
  // the last call (AnalysisSink::kSamplesPerChunk samples each, the last of a level at finish).
  // Held until the first step begins (a session without step marks is left to the pass: past
  // kMaxHeldChunks held, nothing more is kept for the store).
  static constexpr size_t kMaxHeldChunks = 16;
  std::vector<TimelineChunk> takeChunks() {
    if (noSteps()) return {};
    return std::exchange(m_chunksOut, {});
  }
  // The blocks' categories as the analysis pass stores them (a byte each, category | rule << 4)
  // in the order the ingest stores the blocks' rows (at their free; those live at the end last,
  // by allocation): the chunks of AnalysisSink::kBlocksPerChunk completed since the last call,
  // by index.
  std::vector<std::pair<int64_t, std::string>> takeBlockCodes() {
    if (noSteps()) return {};
    return std::exchange(m_codesOut, {});
  }
  // The peaks of the steps whose end was replayed since the last call (the analysis pass stores
  // the same), each handed on once, under a new ticket (handoutTicket()) that names the commit
  // carrying them to the store. They stay held until storedThrough says that commit is in the
  // store: from then on the steps below the first one still held are answered from the store
  // (storedBelow), not from here, so a live session of any number of steps holds only those of
  // the last commits.
  // Also with answerOnly: what it answers of a step is what the store keeps of it until the pass
  // replaces it (one built again after a restart of the daemon hands on the steps before it at
  // its first take, then lets them go).
  std::vector<SharedPeakReport> takeStepPeaks();
  uint64_t handoutTicket() const { return m_ticket; }
  // What was handed on under every ticket up to `ticket` is in the store.
  void storedThrough(uint64_t ticket);
  // Steps numbered below it are the store's to answer (their peaks and intervals are no longer
  // held); INT64_MIN while none is.
  int64_t storedBelow() const { return m_storedBelow; }

  // Answers only, from now on: no more chunks nor codes are handed to the store (takeChunks,
  // takeBlockCodes; steps' peaks still are) and finish() is not exact, giving `why` (one built
  // again from the store: what it would hand over, the analysis it stands for handed over
  // before).
  void answerOnly(const std::string& why) {
    inexact(why);
    m_storeOutput = false;
  }

  int64_t firstTsNs() const { return m_firstTs; }
  int64_t lastTsNs() const { return m_lastTs; }
  // For tests and stats.
  size_t windowEdges() const { return m_window.size(); }
  size_t maxWindowEdges() const { return m_maxWindowEdges; }
  size_t openBlocks() const { return m_blocks.size(); }
  int64_t recategorized() const { return m_recategorized; }
  int keptLevels() const;
  size_t keptSamples() const;
  // About what it holds: its blocks and window at kBytesPerWindowEdge each, its timeline, its
  // names and the steps held.
  size_t heldBytes() const;
  size_t heldSteps() const { return m_stepIntervals.size(); }
  // No step marked yet (held or let go of).
  bool noSteps() const { return m_stepIntervals.empty() && m_storedSteps == 0; }

 private:
  struct PhaseRec {
    Phase phase = Phase::kNone;
    uint64_t beginSeq = 0;
    uint64_t endSeq = kOpenSeq;
  };
  struct LiveBlock {
    Block block;  // its id is the analysis's own; freeSeq set at its free
    uint32_t moduleIid = 0;
    uint32_t opIid = 0;
    std::shared_ptr<PhaseRec> phase;  // the innermost open at its allocation
    int64_t segment = -1;             // the block it lies in
    bool isSegment = false;           // a tensor was placed in it
    int tagCount = 0;
    Category tagCategory = Category::kUnknown;
    uint32_t tagName = 0;
    bool freedByBackward = false;  // freed inside a backward phase begun after its allocation
    bool replayed = false;  // its allocation is replayed: `code` holds the category it counts in
    uint8_t code = 0;       // category | rule << 4
  };
  enum class EdgeKind : uint8_t { kAlloc, kFree, kRecheck, kStepBegin, kStepEnd };
  // One event of the window, with the phase and module scope open at it.
  struct Edge {
    EdgeKind kind;
    uint64_t seq;
    int64_t tsNs;
    int64_t id;  // the block; the step for step edges
    uint32_t scopeIid;
    Phase phase;
  };
  struct OpenStep {
    StepInterval interval;
    MemoryState best;
    uint32_t scopeIid = 0;
    Phase phase = Phase::kNone;
    bool ended = false;
  };
  // What the replay carries from event to event: small, copied for an answer that replays the
  // window without keeping it.
  struct ReplayState {
    MemoryState state;
    MemoryState peak;  // the whole session's, first of the highest
    uint32_t peakScope = 0;
    Phase peakPhase = Phase::kNone;
    std::map<int64_t, OpenStep> steps;  // by step
    bool peakMoved = false;             // the peak moved in the last replay
    int64_t recategorized = 0;
    int64_t diverged = 0;                       // blocks whose decision at their free differs
    std::set<int32_t> devicesWithDeviceBlocks;  // devices whose device memory was counted
  };
  struct ItemRow {
    uint32_t moduleIid, opIid, tagIid;
    uint64_t address;
    int64_t bytes;
    Category category;
    CategoryRule rule;
  };

  // Replays the window's first `count` events into `rs`, each state after an allocation or a
  // free to onState. The categories it finds go to `overlay` (by block), the blocks left as they
  // are; without one (commitWindow) to the blocks.
  // One step's answer as rs stands (false: nothing of it replayed yet).
  bool answerStep(const ReplayState& rs, const StepInterval& interval, StepAnswer* a) const;
  void replay(ReplayState& rs, absl::flat_hash_map<int64_t, uint8_t>* overlay,
              const std::function<void(const MemoryState&)>& onState,
              size_t count = SIZE_MAX) const;
  // Replays the window for good, but for its last `keep` events (a full window keeps a quarter:
  // a tag that follows its block's allocation closely still finds it not counted yet).
  void commitWindow(size_t keep = 0);
  // The window replayed for an answer (not kept by the analysis): the state after it, the blocks
  // live at its peak when the peak moved in it, its states as finest samples. Computed once per
  // change (a query of peak, steps and timeline together replays the window once).
  struct WindowAnswer {
    uint64_t version = UINT64_MAX;
    ReplayState rs;
    std::vector<ItemRow> peakItems;
    std::vector<TimelineSample> tail;
  };
  const WindowAnswer& windowAnswer() const;
  std::pair<Category, CategoryRule> decide(const LiveBlock& b) const;
  std::vector<ItemRow> itemsAt(uint64_t seq,
                               const absl::flat_hash_map<int64_t, uint8_t>* overlay) const;
  void push(EdgeKind kind, uint64_t seq, int64_t tsNs, int64_t id);
  uint32_t scopeNow() const { return m_openModules.empty() ? 0 : m_openModules.rbegin()->second; }
  Phase phaseNow() const {
    return m_openPhases.empty() ? Phase::kNone : m_openPhases.rbegin()->second->phase;
  }
  const std::string& nameOf(uint32_t iid) const;

  std::unordered_map<uint32_t, std::string> m_names;
  int64_t m_nextId = 1;
  absl::flat_hash_map<int64_t, LiveBlock> m_blocks;    // live, or freed in the window
  absl::flat_hash_map<BlockKey, int64_t> m_byKey;      // live blocks
  absl::flat_hash_map<uint64_t, int64_t> m_byAddress;  // the last block allocated there, if live
  std::map<std::pair<int32_t, uint64_t>, int64_t> m_segments;  // live blocks that are not tensors
  std::set<int32_t> m_tensorDevices;
  std::map<uint64_t, std::shared_ptr<PhaseRec>> m_openPhases;  // by begin
  std::map<uint64_t, uint32_t> m_openModules;                  // by begin: name
  size_t m_maxWindowEdges;
  std::deque<Edge> m_window;
  std::map<int64_t, StepInterval> m_stepIntervals;  // every step seen
  ReplayState m_committed;
  std::vector<ItemRow> m_peakItems;                 // live at m_committed.peak
  std::map<int64_t, SharedPeakReport> m_stepPeaks;  // steps whose end is replayed
  // Steps whose peak is to be handed on; handed on (ticket, step) and not known stored yet;
  // stored but held until the steps before them are (only steps numbered out of order wait).
  std::vector<int64_t> m_peaksToHand;
  std::deque<std::pair<uint64_t, int64_t>> m_handed;
  std::set<int64_t> m_handedSteps;
  std::set<int64_t> m_storedHeld;
  uint64_t m_ticket = 0;
  int64_t m_storedBelow = INT64_MIN;
  size_t m_storedSteps = 0;  // no longer held
  TimelineBuilder m_timeline;
  std::vector<std::vector<TimelineSample>> m_levels;
  std::vector<bool> m_dropped;
  int64_t m_firstTs = 0;
  int64_t m_lastTs = 0;
  int64_t m_recategorized = 0;
  bool m_anyOps = false;
  // Why the answers may differ from the analysis pass's ("" while they cannot).
  std::string m_inexact;
  void inexact(const std::string& why) {
    if (m_inexact.empty()) m_inexact = why;
  }
  uint64_t m_lastSeq = 0;
  int m_openSteps = 0;
  CategorizeStats m_tagStats;
  std::vector<std::vector<TimelineSample>> m_chunkPending;  // per level: the chunk being filled
  std::vector<int64_t> m_chunkIndex;
  std::vector<TimelineChunk> m_chunksOut;
  // Block codes in row order: the blocks freed whose free is not replayed yet wait in line.
  void emitCode(uint8_t code);
  std::deque<int64_t> m_rowOrder;
  absl::flat_hash_map<int64_t, uint8_t> m_freedCodes;
  std::string m_codesPending;
  int64_t m_codesChunk = 0;
  std::vector<std::pair<int64_t, std::string>> m_codesOut;
  bool m_codesKept = true;    // false once they cannot be (an allocation over a live block)
  bool m_storeOutput = true;  // false once the store will get the pass's results instead
  uint64_t m_version = 0;     // changes with every event and replay
  mutable WindowAnswer m_answer;
};

}  // namespace tidemark::core
