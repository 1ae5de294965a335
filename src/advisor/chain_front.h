#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "src/advisor/chain.h"

namespace tidemark::core {

struct ParetoPoint;

// One entry of an exact solver's Pareto front for the stages from one on (docs/chain-model.md):
// the headroom it needs, the extra time it costs, and the first choice that gets there (what it
// keeps while the later stages run, where they start, and how the first stage is kept). The
// one-level and the nested solvers keep their fronts in these.
struct FrontEntry {
  int64_t need = 0;  // headroom over what is kept below the stages
  int64_t cost = 0;  // extra ns from these stages on
  int64_t kept = 0;  // what the first choice keeps while the later stages run
  int next = 0;      // the first stage after the first choice
  int option = -1;   // stored with this option (-1: all activations)
  bool recompute = false;
  bool offload = false;

  // The mode of the segment the first choice makes.
  SegmentMode mode() const {
    return recompute ? SegmentMode::kRecompute
           : offload ? SegmentMode::kOffload
                     : SegmentMode::kStore;
  }
};
using Front = std::vector<FrontEntry>;

// The lower envelope of `candidates` into *out (which it replaces): ascending need, strictly
// descending cost. Among equals, storing before recomputing and offloading, then shorter first
// choices, then lower options, so that plans stay simple (and nest no deeper than they gain
// by). `candidates` is left empty.
void lowerEnvelope(std::vector<FrontEntry>* candidates, Front* out);

// The last entry whose need fits is the cheapest that fits; nullptr when none does.
const FrontEntry* cheapestWithin(const Front& front, int64_t headroom);

// The Pareto curve of a chain from its first stage's front: budget (static included, at least the
// profile's floor) against extra time, up to maxBudgetBytes.
std::vector<ParetoPoint> curveOfFront(const Front& first, const ChainProfile& profile,
                                      int64_t maxBudgetBytes);

// A plan for budgetBytes read back from the fronts of the stages from 0 on (`frontAt(i)`): at each
// stage the cheapest entry within the headroom left, less what it keeps for the next. `finish`
// may complete each segment (a nested solver's inner segments, read at that headroom). nullopt
// when nothing fits.
template <typename FrontAt, typename Finish>
std::optional<ChainPlan> readPlan(const ChainProfile& profile, int64_t budgetBytes,
                                  int64_t maxBudgetBytes, FrontAt frontAt, Finish finish) {
  if (budgetBytes < profile.floorBytes) return std::nullopt;
  int64_t headroom = std::min(budgetBytes, maxBudgetBytes) - profile.staticBytes;
  ChainPlan plan;
  int i = 0;
  while (i < profile.size()) {
    const FrontEntry* e = cheapestWithin(frontAt(i), headroom);
    if (e == nullptr) return std::nullopt;
    Segment seg{i, e->next - 1, e->mode(), e->option};
    finish(*e, headroom, &seg);
    plan.segments.push_back(std::move(seg));
    headroom -= e->kept;
    i = e->next;
  }
  return plan;
}

}  // namespace tidemark::core
