#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gui/client/daemon_client.h"

namespace tidemark::gui {

// One plan for every rank of a training job, from the plan panel (as `tidemark plan --job` and
// `tidemark apply --job`, docs/jobs.md). Blocking calls: the window runs them off its thread.

// The job's plan for a budget: made from the rank that sets its memory need (the open session
// when the job has no peak yet). planRank: that rank.
struct JobPlan {
  PlanSummary plan;
  uint64_t fromSession = 0;
  int32_t fromRank = -1;
};
absl::StatusOr<JobPlan> planForJob(DaemonClient& client, uint64_t jobId, uint64_t openSession,
                                   const std::string& budget, const PlanOptions& options = {});

// The plan sent to every running rank, to apply from one step (core::jobApplyStep).
struct JobPlanSent {
  int64_t atStep = 0;
  struct Rank {
    int32_t rank = -1;
    uint64_t session = 0;
    uint64_t planId = 0;  // 0: not sent
    std::string error;    // why not
  };
  std::vector<Rank> ranks;
};
// FAILED_PRECONDITION when the job has no running rank.
absl::StatusOr<JobPlanSent> applyToJob(DaemonClient& client, uint64_t jobId,
                                       const std::string& planJson);

// Each rank's newest plan and what its steps under it measured (ranks without one left out).
struct RankPlanOutcome {
  int32_t rank = -1;
  uint64_t session = 0;
  PlanOutcome outcome;
};
absl::StatusOr<std::vector<RankPlanOutcome>> checkJobPlans(DaemonClient& client, uint64_t jobId);

}  // namespace tidemark::gui
