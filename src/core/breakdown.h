#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "src/core/categorize.h"
#include "src/core/recording.h"

namespace tidemark::core {

// The memory state just after the event with sequence number `seq`.
struct MemoryState {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  int64_t trackedBytes = 0;
  std::array<int64_t, kCategoryCount> bytes{};  // indexed by categoryIndex()
  std::array<int64_t, kCategoryCount> blocks{};
};

// One event of a replay applied to a state: a block of category index ci allocated (delta > 0)
// or freed (delta < 0); fromSlack: a tensor in a segment, whose bytes move from or to the
// segment's slack, leaving the tracked total as it is.
inline void applyBlockEdge(MemoryState& s, uint64_t seq, int64_t tsNs, int64_t delta, int ci,
                           bool fromSlack) {
  constexpr int kSlack = categoryIndex(Category::kAllocatorSlack);
  s.seq = seq;
  s.tsNs = tsNs;
  s.bytes[ci] += delta;
  if (fromSlack)
    s.bytes[kSlack] -= delta;
  else
    s.trackedBytes += delta;
  s.blocks[ci] += delta > 0 ? 1 : -1;
}

// The highest state of each range of sequence numbers (sorted, disjoint), fed one event at a
// time: before(seq, state) just before the event, after(state) just after it, finish(state) with
// the last state. The state on entering a range is a candidate too (a range that only frees
// peaks at its start); a range no event falls in holds the state then, at its first seq.
class RangePeakTracker {
 public:
  explicit RangePeakTracker(std::vector<std::pair<uint64_t, uint64_t>> ranges)
      : m_ranges(std::move(ranges)), m_best(m_ranges.size()), m_entered(m_ranges.size(), false) {}
  void before(uint64_t seq, const MemoryState& s) {
    while (m_r < m_ranges.size() && seq >= m_ranges[m_r].second) {
      if (!m_entered[m_r]) enter(m_r, s);
      ++m_r;
    }
    if (m_r < m_ranges.size() && seq >= m_ranges[m_r].first && !m_entered[m_r]) enter(m_r, s);
  }
  void after(const MemoryState& s) {
    if (m_r < m_ranges.size() && m_entered[m_r] && s.trackedBytes > m_best[m_r].trackedBytes)
      m_best[m_r] = s;
  }
  bool done() const { return m_r == m_ranges.size(); }
  std::vector<MemoryState> finish(const MemoryState& last) {
    for (; m_r < m_ranges.size(); ++m_r)
      if (!m_entered[m_r]) enter(m_r, last);
    return m_best;
  }

 private:
  void enter(size_t i, const MemoryState& s) {
    m_best[i] = s;
    m_best[i].seq = m_ranges[i].first;
    m_entered[i] = true;
  }
  std::vector<std::pair<uint64_t, uint64_t>> m_ranges;
  std::vector<MemoryState> m_best;
  std::vector<bool> m_entered;
  size_t m_r = 0;
};

// Replays a session's blocks in sequence order (allocs and frees interleaved) with their
// categories, answering questions about moments of the recording. A tensor that lies in a segment
// (BlockCategory::segment) moves its bytes from the segment's ALLOCATOR_SLACK to its own category
// while it lives: the tracked total counts the segment once.
class LivenessReplay {
 public:
  // Both must outlive the replay; recording must be sorted (Recording::sortBySeq).
  LivenessReplay(const Recording& recording, const std::vector<BlockCategory>& categories);

  // The moment of highest tracked bytes with seq in [fromSeq, toSeq). The state before the
  // first event of the range counts too (a range that only frees peaks at its start).
  MemoryState peak(uint64_t fromSeq = 0, uint64_t toSeq = kOpenSeq) const;
  // The peak of each range in one pass. Ranges must be sorted and disjoint; same rules as peak().
  std::vector<MemoryState> peaks(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const;
  // The state after every event whose timestamp is <= tsNs (in sequence order).
  MemoryState at(int64_t tsNs) const;
  // Calls fn(state) after every event. For whole-recording checks and tests.
  template <typename Fn>
  void forEachState(Fn&& fn) const {
    MemoryState s;
    for (const Edge& e : m_edges) {
      apply(s, e);
      fn(static_cast<const MemoryState&>(s));
    }
  }

  int64_t firstTsNs() const { return m_edges.empty() ? 0 : m_edges.front().tsNs; }
  int64_t lastTsNs() const { return m_edges.empty() ? 0 : m_edges.back().tsNs; }

 private:
  struct Edge {
    uint64_t seq;
    int64_t tsNs;
    int64_t delta;  // +size at alloc, -size at free
    int32_t categoryIndex;
    // A tensor in a segment: its bytes come from (or go back to) the segment's slack, so the
    // tracked total does not move. A flag beside the index keeps the edge at 32 bytes.
    bool fromSlack;
  };
  static void apply(MemoryState& s, const Edge& e) {
    applyBlockEdge(s, e.seq, e.tsNs, e.delta, e.categoryIndex, e.fromSlack);
  }

  static_assert(sizeof(Edge) == 32, "edges are the analysis's largest array: keep them small");
  std::vector<Edge> m_edges;  // sorted by seq
};

}  // namespace tidemark::core
