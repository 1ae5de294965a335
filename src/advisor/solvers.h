#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/advisor/chain.h"
#include "src/advisor/chain_front.h"

namespace tidemark::core {

enum class Strategy { kStoreAll, kCheckpointAll, kSqrtN, kGreedy, kOptimal };
const char* strategyName(Strategy s);  // "store-all", "checkpoint-all", "sqrt-n", ...
absl::StatusOr<Strategy> parseStrategy(std::string_view name);

// Keep every activation: no recomputation.
ChainPlan storeAllPlan(const ChainProfile& profile);
// Every checkpointable stage is its own recomputed segment (what wrapping each block in
// torch.utils.checkpoint does).
ChainPlan checkpointAllPlan(const ChainProfile& profile);
// Chen et al. 2016: segments of ceil(sqrt(c)) checkpointable stages (c of them in all), each
// recomputed, except the last segment, which is stored (its backward follows its forward).
ChainPlan sqrtNPlan(const ChainProfile& profile);
// Chen's greedy (Alg. 3) for one threshold: grow a segment while the bytes its stages would store
// stay within thresholdBytes, then start the next; the last segment is stored.
ChainPlan greedyPlan(const ChainProfile& profile, int64_t thresholdBytes);
// Chen's budget search around greedyPlan: tries a spread of thresholds and keeps the cheapest plan
// whose simulated peak fits budgetBytes, or the lowest-peak plan when none fits.
ChainPlan greedySearchPlan(const ChainProfile& profile, int64_t budgetBytes);

// A point of the Pareto curve: with budgetBytes of memory (static included), extraNs of
// recomputation is the least any plan needs.
struct ParetoPoint {
  int64_t budgetBytes = 0;
  int64_t extraNs = 0;
};

// What a solve of the chain gives its readers: the curve of the least extra time per budget, the
// plan for a budget, the least feasible budget. epsilonBytes() says how far the curve may be from
// the exact one: every plan the solve names at budget b + epsilonBytes() costs no more than the
// optimum at b (0: exact).
class ChainFront {
 public:
  virtual ~ChainFront() = default;
  // Ascending budget, strictly descending extra time; the first point is the least budget the
  // solve has a plan for, the last is free of recomputation (or the last within its cap).
  virtual std::vector<ParetoPoint> curve() const = 0;
  // The least budget any plan fits (exact).
  virtual int64_t minFeasibleBudget() const = 0;
  // The cheapest plan the solve has within budgetBytes, or nullopt when it has none.
  virtual std::optional<ChainPlan> planFor(int64_t budgetBytes) const = 0;
  virtual int64_t epsilonBytes() const { return 0; }
};

// The optimal plan under the chain model for every budget at once: a dynamic program over the
// stages from the last to the first, whose table at stage i is the exact Pareto front (headroom
// needed, least extra time) of the stages i.. given what earlier stages keep. No discretisation:
// sizes stay in bytes. See docs/chain-model.md for the recurrence.
//
// With maxBudgetBytes the fronts keep only what fits under that budget: planFor answers exactly as
// the whole solve does for every budget up to it (the same plan), and curve() is the part of the
// curve up to it, at a fraction of the time and memory when the budget is tight (a recomputed
// segment stops growing where it no longer fits). minFeasibleBudget() is exact either way.
class OptimalChainSolver : public ChainFront {
 public:
  explicit OptimalChainSolver(const ChainProfile& profile,
                              int64_t maxBudgetBytes = std::numeric_limits<int64_t>::max());

  // Ascending budget, strictly descending extra time; the first point is the least feasible
  // budget, the last is free of recomputation (or the last within maxBudgetBytes).
  std::vector<ParetoPoint> curve() const override;
  int64_t minFeasibleBudget() const override { return m_minFeasibleBudget; }
  // The cheapest plan within budgetBytes (at most maxBudgetBytes), or nullopt when no plan fits.
  std::optional<ChainPlan> planFor(int64_t budgetBytes) const override;

 private:
  const ChainProfile& m_profile;
  int64_t m_maxBudget = 0;
  int64_t m_minFeasibleBudget = 0;
  std::vector<Front> m_front;  // m_front[i]: stages i..n-1; m_front[n]: the end
};

// A lower bound on the extra time of any plan within budgetBytes under the chain model, nested
// plans included: every plan passes through each stage's forward and backward and the end of the
// forward, where it holds what the stages before keep; at each such moment the stages before must
// have dropped (the moment with everything stored) - budget bytes, and a stage can drop at most
// what it stores at no better than its cheapest time per byte (a fractional knapsack per moment;
// the bound is the largest). Returns 0 when storing everything fits.
int64_t extraTimeLowerBound(const ChainProfile& profile, int64_t budgetBytes);

}  // namespace tidemark::core
