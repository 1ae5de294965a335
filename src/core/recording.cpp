#include "src/core/recording.h"

#include <algorithm>

namespace tidemark::core {

namespace {
template <typename T>
void sortByBegin(std::vector<T>& v) {
  std::stable_sort(v.begin(), v.end(),
                   [](const T& a, const T& b) { return a.beginSeq < b.beginSeq; });
}

// The innermost interval containing seq: of those containing it, the one that began last.
// v is sorted by beginSeq; walking back from the last interval begun at or before seq finds it
// after a few steps, since phases, steps and scopes nest rather than overlap.
template <typename T>
const T* innermost(const std::vector<T>& v, uint64_t seq) {
  auto pos = std::upper_bound(v.begin(), v.end(), seq,
                              [](uint64_t s, const T& it) { return s < it.beginSeq; });
  while (pos != v.begin()) {
    --pos;
    if (pos->contains(seq)) return &*pos;
  }
  return nullptr;
}
}  // namespace

void Recording::sortBySeq() {
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& a, const Block& b) { return a.allocSeq < b.allocSeq; });
  std::stable_sort(tags.begin(), tags.end(),
                   [](const Tag& a, const Tag& b) { return a.seq < b.seq; });
  sortByBegin(phases);
  sortByBegin(steps);
  sortByBegin(scopes);
  sortByBegin(ops);
  sortByBegin(kernels);
}

namespace {
template <typename T>
void clipIntervals(std::vector<T>& v, uint64_t seq) {
  std::erase_if(v, [seq](const T& i) { return i.beginSeq >= seq; });
  for (T& i : v) {
    if (i.endSeq != kOpenSeq && i.endSeq >= seq) {
      i.endSeq = kOpenSeq;
      i.endTsNs = 0;
    }
  }
}
}  // namespace

void Recording::clipBefore(uint64_t seq) {
  std::erase_if(blocks, [seq](const Block& b) { return b.allocSeq >= seq; });
  for (Block& b : blocks) {
    if (!b.live() && b.freeSeq >= seq) {
      b.freeSeq = kOpenSeq;
      b.freeTsNs = 0;
    }
  }
  std::erase_if(tags, [seq](const Tag& t) { return t.seq >= seq; });
  clipIntervals(phases, seq);
  clipIntervals(steps, seq);
  clipIntervals(scopes, seq);
  clipIntervals(ops, seq);
  clipIntervals(kernels, seq);
  std::erase_if(launches, [seq](const Launch& l) { return l.seq >= seq; });
}

const StepInterval* Recording::findStep(int64_t step) const {
  for (const StepInterval& s : steps) {
    if (s.step == step) return &s;
  }
  return nullptr;
}

const PhaseInterval* Recording::phaseAt(uint64_t seq) const { return innermost(phases, seq); }
const ScopeInterval* Recording::scopeAt(uint64_t seq) const { return innermost(scopes, seq); }
const StepInterval* Recording::stepAt(uint64_t seq) const { return innermost(steps, seq); }

}  // namespace tidemark::core
