#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/recorder/record.h"
#include "src/core/block_key.h"
#include "src/core/capture_schedule.h"

namespace tidemark::agent {

// A capture schedule at work (`tidemark run --steps 3-4`): between the collector, which hands it
// each pass's records in sequence order, and the buffer the sender reads.
//
// In the steps the schedule details (and before the first step mark), records go on as they
// came. Elsewhere (summarized: the other steps and what comes between them) allocations, frees,
// tags, scopes, phases, counters and launches are measured and not sent: each step ends with its
// summary (its peak of tracked bytes, per device and in all, the bytes by tag category at that
// peak, the reserved bytes then and how many events it had), and the sequence numbers of what was
// left out go as Summarized ranges, so that the daemon knows they are not lost. Step marks always
// go.
//
// Blocks cross the boundary whole: the free of a block the daemon has seen always goes (even
// from a summarized step), the free of one it has not never does, and when full detail begins
// every live block it has not seen goes then (a restated Alloc, with its strongest tag), under
// the sequence numbers the step's begin mark reserved right after its own (the C ABI asks
// startsDetail and restateBound), so that they come before anything of the step; numbers not
// used go as unused.
//
// Memory: the live blocks (what is live, not what was allocated), a few figures a device, and
// the records held while a late one is waited for.
// Runs on the collector thread only; startsDetail and restateBound may be asked from any thread.
// The figures of a step summary (tidemark.v1.SummaryFigure).
enum class SummaryFigure : uint8_t {
  kPeakBytes = 1,
  kBytesAtPeak = 2,
  kReservedAtPeak = 3,
  kEvents = 4,
};

class CaptureFilter {
 public:
  // reserveSeqs(n): takes n fresh sequence numbers and returns the first.
  CaptureFilter(core::CaptureSchedule schedule, std::function<uint64_t(uint64_t)> reserveSeqs,
                uint32_t reservedCounterIid);

  void process(const std::vector<Record>& in, std::vector<Record>& out);
  // The collector's last pass: what still waits for a late record goes now, in order.
  void finish(std::vector<Record>& out);

  // Whether a step of this number, begun now, would start full detail after summarizing.
  bool startsDetail(int64_t step) const {
    return !m_detail.load(std::memory_order_acquire) && m_schedule.detailed(step);
  }
  // How many sequence numbers such a step's mark reserves right after its own (Record.sizeBytes
  // of the kStepBegin), enough for the blocks it will send again; recorded: the numbers taken so
  // far. What is not used is told as such.
  uint64_t restateBound(uint64_t recorded) const;
  const core::CaptureSchedule& schedule() const { return m_schedule; }
  uint64_t summarized() const { return m_summarized.load(std::memory_order_relaxed); }
  uint64_t restated() const { return m_restated.load(std::memory_order_relaxed); }
  // Times a step's reserved numbers were too few and the blocks went under fresh ones.
  uint64_t restatedLate() const { return m_restatedLate.load(std::memory_order_relaxed); }

  static constexpr int32_t kAllDevices = -2;  // the summary of all memory together

 private:
  using Key = core::BlockKey;
  struct Live {
    uint64_t size = 0;
    uint64_t allocSeq = 0;
    uint32_t threadId = 0;
    bool sent = false;        // the daemon has its alloc
    uint64_t restatedAt = 0;  // the sequence number of its restated alloc (0: none)
    bool inSegment = false;   // a tensor inside a live segment: its bytes are the segment's
    uint8_t tagCategory = 0;  // the strongest tag's (0: untagged)
    uint32_t tagName = 0;
    uint64_t tagSize = 0;
  };
  // Index 0: untagged; else the category's wire number.
  using ByCategory = std::array<int64_t, 12>;
  struct DeviceFigures {
    int64_t tracked = 0;
    ByCategory byCategory{};
    // The summarized step's so far.
    int64_t peak = -1;
    int64_t peakTsNs = 0;
    uint64_t peakSeq = 0;
    ByCategory atPeak{};
    int64_t reservedAtPeak = -1;
  };

  void handle(const Record& r, std::vector<Record>& out);
  void releaseWaiting(std::vector<Record>& out);
  void advancePast(const Record& r);
  void skipOwnSeqs();
  // Fresh numbers for records made here; never waited for.
  uint64_t takeSeqs(uint64_t n);
  // The numbers first..last were reserved and not used.
  void tellUnused(uint64_t first, uint64_t last, const Record& at, std::vector<Record>& out);
  void onAlloc(const Record& r);
  void onFree(const Record& r);
  void onTag(const Record& r);
  // A device's figures (and all memory's) change: a category's bytes by bytes, the tracked
  // total by trackedDelta; in a summarized step, a new high is the step's peak so far.
  void addBytes(int32_t device, int category, int64_t bytes, int64_t trackedDelta, uint64_t seq,
                int64_t tsNs);
  void beginSummarizedStep(const Record& r);
  void endSummarizedStep(const Record& r, std::vector<Record>& out);
  void restateLiveBlocks(const Record& stepBegin, std::vector<Record>& out);
  // Whether an end (scope or phase) goes: its begin went (with no begin known, as detail says).
  static bool endGoes(std::vector<bool>& stack, bool detail);
  void forward(const Record& r, std::vector<Record>& out);
  // A free or tag of a restated block that was recorded before the restated alloc (a thread
  // published it late): goes with a fresh sequence number, so that it follows the alloc.
  void forwardAfter(const Record& r, uint64_t restatedAt, std::vector<Record>& out);
  void leaveOut(const Record& r, std::vector<Record>& out);
  void flushRun(std::vector<Record>& out);

  const core::CaptureSchedule m_schedule;
  const std::function<uint64_t(uint64_t)> m_reserveSeqs;
  const uint32_t m_reservedIid;

  // Full detail until the first step mark: a program that never marks a step (no adapter, not
  // Python) is recorded whole rather than not at all, and what a job builds before training
  // (its model) goes as it is made.
  std::atomic<bool> m_detail{true};
  // Ordering: the next sequence number to handle, the records that came before it (at most
  // kMaxWaiting, 12 MiB, for kMaxWaitPasses passes), the numbers taken here ([begin, end)).
  static constexpr int kMaxWaitPasses = 8;
  static constexpr size_t kMaxWaiting = 1u << 18;
  uint64_t m_nextSeq = 0;
  std::map<uint64_t, Record> m_waiting;
  int m_waitedPasses = 0;
  std::map<uint64_t, uint64_t> m_ownSeqs;
  std::atomic<uint64_t> m_processedUpTo{0};
  std::atomic<int64_t> m_unsentLive{0};
  std::atomic<uint64_t> m_restatedLate{0};
  bool m_stepSummarized = false;  // inside a summarized step (figures being kept)
  int64_t m_step = 0;
  uint64_t m_stepEvents = 0;
  int64_t m_reserved = -1;

  absl::flat_hash_map<Key, Live> m_live;
  absl::flat_hash_map<uint64_t, Key> m_byAddress;  // the block last allocated at an address
  std::map<std::pair<int32_t, uint64_t>, uint64_t> m_segments;  // live device blocks: end
  // Frees of no block we knew, and whether they went: a thread that published its alloc late
  // makes its free come first, and the alloc must then share its free's fate. At most
  // kMaxUnmatchedFrees (frees of blocks from before the recording are such frees too).
  struct UnmatchedFree {
    uint64_t seq;
    bool went;
  };
  static constexpr size_t kMaxUnmatchedFrees = 1u << 16;
  absl::flat_hash_map<Key, UnmatchedFree> m_unmatchedFrees;
  // Blocks an alloc at their address replaced before their free came (published late): whether
  // each went, for that free. At most kMaxUnmatchedFrees.
  absl::flat_hash_map<Key, bool> m_superseded;
  std::map<int32_t, DeviceFigures> m_devices;  // kAllDevices included
  // Begun scopes (per thread and kind) and phases (per thread): whether each begin went.
  absl::flat_hash_map<uint64_t, std::vector<bool>> m_openScopes;
  absl::flat_hash_map<uint32_t, std::vector<bool>> m_openPhases;

  // The run of left-out sequence numbers not yet told: [m_runFirst, m_runLast].
  uint64_t m_runFirst = 0;
  uint64_t m_runLast = 0;
  int64_t m_runTsNs = 0;
  std::atomic<uint64_t> m_summarized{0};
  std::atomic<uint64_t> m_restated{0};
};

}  // namespace tidemark::agent
