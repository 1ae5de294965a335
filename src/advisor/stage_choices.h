#pragma once

#include <cstdint>
#include <vector>

#include "src/advisor/chain.h"

namespace tidemark::core {

// What one choice at a stage means to the solvers' recurrence (docs/chain-model.md): the
// headroom it needs above what earlier stages keep (`local`), what it keeps through the rest of
// the forward (`kept`), the recomputation it adds (`extraNs`). The exact and the grid solvers
// read the same figures, so they solve one model.
struct StageChoice {
  int64_t local = 0;
  int64_t kept = 0;
  int64_t extraNs = 0;
  int option = -1;       // stored with this option; -1: all activations
  bool offload = false;  // offloaded: kept on the host, none of it on the device
};

// Stage i stored: with all its activations first, then with each of its options in order, then
// offloaded (when the profile has an offload speed): as stored in its forward and backward, but
// keeping nothing on the device in between, for the copies' time.
void storedChoices(const ChainProfile& p, int i, std::vector<StageChoice>* out);

// For each stage k, the least output of k and of the stages after it that a segment reaching k may
// still end at (each checkpointable and linked to the one before, as extends() says): the least
// incoming gradient such a segment can hold through its re-run.
std::vector<int64_t> leastOutputAhead(const ChainProfile& p);

// A recomputed segment that starts at stage `first`, grown one stage at a time: it keeps only its
// input through the forward and re-runs its stages at the start of its backward. Its need grows
// with its length, but for its last stage's incoming gradient, held through the re-run: a longer
// segment whose last output is smaller may need less.
class RecomputedSegment {
 public:
  RecomputedSegment(const ChainProfile& p, int first);
  // Adds the next stage (first, first + 1, ...: the caller checks it is checkpointable) and
  // returns the segment's choice up to it.
  StageChoice grow();
  int last() const { return m_next - 1; }
  // No segment from `first` through last() or further needs less: the need of the segment grown
  // so far with the least incoming gradient a segment from here on can hold (leastOutputAhead at
  // last(); 0 when not known). What a search for segments may stop growing at.
  int64_t leastNeedFromHereOn(int64_t leastGradientAhead = 0) const {
    return std::max({m_forwardMax, m_recomputeMax + leastGradientAhead, m_backwardMax});
  }

 private:
  const ChainProfile& m_profile;
  int m_first = 0;
  int m_next = 0;
  int64_t m_in = 0;
  int64_t m_forwardMax = 0, m_recomputeMax = 0, m_backwardMax = 0, m_held = 0, m_extra = 0;
};

}  // namespace tidemark::core
