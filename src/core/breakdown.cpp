#include "src/core/breakdown.h"

#include <algorithm>

namespace tidemark::core {

LivenessReplay::LivenessReplay(const Recording& rec, const std::vector<BlockCategory>& cats) {
  m_edges.reserve(rec.blocks.size() * 2);
  for (size_t i = 0; i < rec.blocks.size(); ++i) {
    const Block& b = rec.blocks[i];
    const int ci = categoryIndex(cats[i].category);
    const auto size = static_cast<int64_t>(b.sizeBytes);
    const bool fromSlack = cats[i].segment >= 0;
    m_edges.push_back({b.allocSeq, b.allocTsNs, size, ci, fromSlack});
    if (!b.live()) m_edges.push_back({b.freeSeq, b.freeTsNs, -size, ci, fromSlack});
  }
  std::sort(m_edges.begin(), m_edges.end(),
            [](const Edge& a, const Edge& b) { return a.seq < b.seq; });
}

MemoryState LivenessReplay::peak(uint64_t fromSeq, uint64_t toSeq) const {
  MemoryState s;
  MemoryState best;
  bool haveBest = false;
  for (const Edge& e : m_edges) {
    if (e.seq >= toSeq) break;
    if (e.seq >= fromSeq && !haveBest) {
      // The state on entering the range is a candidate too.
      best = s;
      best.seq = fromSeq;
      haveBest = true;
    }
    apply(s, e);
    if (e.seq >= fromSeq && s.trackedBytes > best.trackedBytes) best = s;
  }
  if (!haveBest) {
    best = s;
  }
  return best;
}

std::vector<MemoryState> LivenessReplay::peaks(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const {
  RangePeakTracker tracker(ranges);
  MemoryState s;
  for (const Edge& e : m_edges) {
    tracker.before(e.seq, s);
    if (tracker.done()) break;
    apply(s, e);
    tracker.after(s);
  }
  return tracker.finish(s);
}

MemoryState LivenessReplay::at(int64_t tsNs) const {
  MemoryState s;
  for (const Edge& e : m_edges) {
    if (e.tsNs > tsNs) break;
    apply(s, e);
  }
  return s;
}

}  // namespace tidemark::core
