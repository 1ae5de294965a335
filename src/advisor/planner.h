#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "src/advisor/chain.h"
#include "src/advisor/nested_solver.h"
#include "src/advisor/simulator.h"
#include "src/advisor/solvers.h"

namespace tidemark::core {

// Where a plan's profile came from: a recorded session and step, or a profile file.
struct PlanSource {
  std::string session;
  int64_t step = -1;
  std::string profile;
  // When the recorded step re-ran blocks itself (the job checkpoints already): that plan, as the
  // model predicts it (`source.as_recorded` in the document). Empty plan: it stored every block.
  struct AsRecorded {
    std::string plan;  // planSignature: S stored, R re-run, one letter a block
    int64_t peakBytes = 0;
    int64_t extraNs = 0;
    int64_t stepNs = 0;
  } asRecorded;
};

// A plan with everything it predicts: the content of a plan document (docs/plan-format.md).
struct PlanReport {
  Strategy strategy = Strategy::kOptimal;
  int64_t budgetBytes = 0;
  int64_t marginBytes = 0;  // the plan was chosen to fit budgetBytes - marginBytes
  bool marginMet = true;    // its predicted peak is within budgetBytes - marginBytes
  bool feasible = false;    // the predicted peak is within the budget
  ChainPlan plan;
  SimResult predicted;                 // peak and extra time, by simulation
  int64_t baseStepNs = 0;              // the step without recomputation
  int64_t lowerBoundExtraNs = 0;       // no plan within the budget adds less
  int64_t storeAllPeakBytes = 0;       // the peak without recomputation
  int64_t minFeasibleBudgetBytes = 0;  // the least budget any plan fits
  // 0: the plan is the optimum within the budget. Otherwise (a long chain, solved on a grid) it
  // adds no more than the optimum within budgetBytes - marginBytes - epsilonBytes.
  int64_t epsilonBytes = 0;
  PlanSource source;
  // What the model of the recording does not capture, said with the plan (RecordedChain).
  std::vector<std::string> warnings;

  double predictedOverhead() const {
    return baseStepNs > 0 ? static_cast<double>(predicted.extraNs) / baseStepNs : 0.0;
  }
};

// The default safety margin: plans are chosen to fit 1 % under the budget, because a measured
// peak also holds small blocks no model sees (and a plan chosen to fit exactly would exceed the
// budget by them).
inline constexpr double kDefaultMarginFraction = 0.01;

// Chains of up to this many stages are solved exactly (OptimalChainSolver); longer ones on a grid
// (GridChainSolver), within a bound each solve states.
inline constexpr int kExactStagesMax = 200;
// The solve of a chain for budgets up to maxBudgetBytes (a cap the exact solvers use to keep
// only what fits; the grid solves every budget). nested: plans may nest recomputed segments
// (NestedChainSolver), on chains of up to kNestedStagesMax stages; longer ones are planned one
// level deep.
std::unique_ptr<ChainFront> solveChain(const ChainProfile& profile,
                                       int64_t maxBudgetBytes = std::numeric_limits<int64_t>::max(),
                                       bool nested = false);

// Plans the chain for a budget with one strategy and predicts the result by simulation. The
// optimal and greedy strategies pick the cheapest plan within budget - margin (margin =
// marginFraction of the budget). When none fits there, the optimal strategy takes the plan with
// the lowest peak (the most room under the budget), the greedy one its plan for the budget itself;
// marginMet says so. When the store-all plan fits the budget, the optimal strategy keeps it (that
// is the step as it ran: nothing to recompute, whatever the margin). When no plan of the strategy
// fits the budget, the report says so (feasible = false) and carries the strategy's lowest-peak
// plan; minFeasibleBudgetBytes names the budget that would fit. `solved` may pass a solve
// already made for this profile (solveChain). nested: the optimal plan may nest recomputed
// segments (solveChain).
PlanReport makePlan(const ChainProfile& profile, int64_t budgetBytes, Strategy strategy,
                    double marginFraction = kDefaultMarginFraction,
                    const ChainFront* solved = nullptr, bool nested = false);

// The optimal plans' curve with what a reader needs beside it.
struct ParetoSummary {
  struct Point {
    int64_t budgetBytes = 0;
    int64_t extraNs = 0;
    std::string plan;  // planSignature() of the optimal plan at that budget
  };
  std::string chainName;
  std::vector<Point> points;  // ascending budget, descending extra time
  int64_t storeAllPeakBytes = 0;
  int64_t staticBytes = 0;
  int64_t baseStepNs = 0;
  // 0: the exact curve. Otherwise each point's plan adds no more than the optimum at its budget
  // less this (a long chain, solved on a grid).
  int64_t epsilonBytes = 0;
};
ParetoSummary paretoSummary(const ChainProfile& profile, const ChainFront& solved);

// A budget as users write it: "6GiB", "512 MiB", "1.5GB", "123456" (bytes), or "70%": that share
// of the memory the store-all plan's peak holds above the static bytes (what recomputation can
// act on), on top of the static bytes.
struct BudgetSpec {
  int64_t bytes = -1;    // when given in bytes
  double fraction = -1;  // when given in percent
};
absl::StatusOr<BudgetSpec> parseBudget(std::string_view text);
// A host link's speed as users write it: "25GB/s", "16GiB/s", "1000000/s" (bytes per second).
absl::StatusOr<int64_t> parseSpeed(std::string_view text);
int64_t resolveBudget(const BudgetSpec& spec, const ChainProfile& profile);

}  // namespace tidemark::core
