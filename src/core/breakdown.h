#pragma once

#include <array>
#include <cstdint>
#include <optional>
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
    s.seq = e.seq;
    s.tsNs = e.tsNs;
    s.bytes[e.categoryIndex] += e.delta;
    if (e.fromSlack)
      s.bytes[kSlackIndex] -= e.delta;
    else
      s.trackedBytes += e.delta;
    s.blocks[e.categoryIndex] += e.delta > 0 ? 1 : -1;
  }
  static constexpr int kSlackIndex = categoryIndex(Category::kAllocatorSlack);

  static_assert(sizeof(Edge) == 32, "edges are the analysis's largest array: keep them small");
  std::vector<Edge> m_edges;  // sorted by seq
};

}  // namespace tidemark::core
