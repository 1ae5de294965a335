#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/advisor/chain.h"
#include "src/advisor/planner.h"

namespace tidemark::core {

inline constexpr char kChainProfileFormat[] = "tidemark-chain-profile";
inline constexpr char kPlanFormat[] = "tidemark-plan";
inline constexpr int kChainProfileVersion = 1;
// Version 2 adds nested recomputed segments ("inner"); a plan without them is written as version
// 1, which readers of version 1 apply as before.
inline constexpr int kPlanVersion = 2;
// The deepest nesting a plan document may have (a chain of kNestedStagesMax stages nests less).
inline constexpr int kPlanMaxDepth = 64;

// The chain profile file of docs/chain-model.md. Unknown keys are errors (a misspelt key would
// otherwise silently read as 0).
absl::StatusOr<ChainProfile> parseChainProfile(std::string_view json);
std::string chainProfileToJson(const ChainProfile& profile);

// The plan document of docs/plan-format.md, written from a report on its profile.
std::string planToJson(const ChainProfile& profile, const PlanReport& report);

// What a consumer of a plan document needs: the modes by module name and the prediction.
struct PlanSegmentDoc {
  std::string mode;  // "store", "recompute", "selective" or "offload"
  std::vector<std::string> modules;
  std::string option;                  // selective only
  std::vector<std::string> recompute;  // selective only: child modules re-run
  std::string policy;       // selective only: an op-level option's policy (StageOption::policy)
  int64_t inputBytes = -1;  // the first module's input in the recording (-1: unsaid)
  // recompute only: the plan the segment's re-run follows (empty: every module stored).
  std::vector<PlanSegmentDoc> inner;
};
struct PlanDocument {
  std::string strategy;
  int64_t budgetBytes = 0;
  int64_t marginBytes = 0;
  bool marginMet = true;
  bool feasible = false;
  int64_t predictedPeakBytes = 0;
  std::string predictedPeakPhase;  // "forward", "end of forward", "recompute", "backward"
  std::string predictedPeakStage;  // empty at the end of the forward
  int64_t predictedExtraNs = 0;
  int64_t predictedStepNs = 0;
  double predictedOverhead = 0;
  int64_t baselinePeakBytes = 0;  // store-all
  int64_t baselineStepNs = 0;
  int64_t lowerBoundExtraNs = 0;
  int64_t minFeasibleBudgetBytes = 0;
  int64_t epsilonBytes = 0;  // PlanReport::epsilonBytes
  std::string chainName;
  int64_t staticBytes = 0;
  PlanSource source;
  std::vector<PlanSegmentDoc> segments;
  // The step the plan takes effect from (0: the next one): `tidemark apply --job` sets it so
  // that every rank of a job switches at the same step.
  int64_t applyAtStep = 0;
  std::vector<std::string> warnings;  // what the model did not capture (may not hold)
};
absl::StatusOr<PlanDocument> parsePlanDocument(std::string_view json);

// One plan for every rank of a training job (docs/jobs.md): its running ranks switch at one step,
// far enough after the furthest one's last that every rank is sent the plan before it gets
// there: at least kJobApplyLeadSteps steps, and at least kJobApplyLeadNs plus twice the time it
// took to read the ranks' progress (they stepped on meanwhile, and sending the plan to each rank
// takes as many calls) at the fastest rank's pace. 2 s was too little on a loaded machine: four
// ranks of a PostgreSQL-backed daemon got the plan after the chosen step had begun.
inline constexpr int64_t kJobApplyLeadSteps = 3;
inline constexpr int64_t kJobApplyLeadNs = 5'000'000'000;
// A step of a rank as its steps list gives it (endTsNs 0 while open).
struct StepSpan {
  int64_t step = 0;
  int64_t beginTsNs = 0;
  int64_t endTsNs = 0;
};
// What the choice knows of a running rank: its last step and the median time of its last few
// closed steps (0: none closed yet).
struct RankProgress {
  int64_t lastStep = 0;
  int64_t stepNs = 0;
};
RankProgress rankProgress(const std::vector<StepSpan>& steps);
int64_t jobApplyStep(const std::vector<RankProgress>& ranks, int64_t readingNs = 0);
// The plan document with its apply_at_step set to `step`.
absl::StatusOr<std::string> withApplyAtStep(std::string_view planJson, int64_t step);

}  // namespace tidemark::core
