#include "gui/client/job_plan.h"

#include <chrono>

#include "src/advisor/plan_json.h"

namespace tidemark::gui {

absl::StatusOr<JobPlan> planForJob(DaemonClient& client, uint64_t jobId, uint64_t openSession,
                                   const std::string& budget, const PlanOptions& options) {
  auto job = client.job(jobId);
  if (!job.ok()) return job.status();
  JobPlan out;
  out.fromSession = job->memorySession != 0 ? job->memorySession : openSession;
  for (const JobRank& r : job->ranks)
    if (r.session == out.fromSession) out.fromRank = r.rank;
  auto plan = client.plan(out.fromSession, budget, options);
  if (!plan.ok()) return plan.status();
  out.plan = std::move(*plan);
  return out;
}

absl::StatusOr<JobPlanSent> applyToJob(DaemonClient& client, uint64_t jobId,
                                       const std::string& planJson) {
  auto job = client.job(jobId);
  if (!job.ok()) return job.status();
  JobPlanSent out;
  const auto reading = std::chrono::steady_clock::now();
  std::vector<core::RankProgress> progress;
  for (const JobRank& r : job->ranks) {
    if (r.state != "live") continue;
    auto steps = client.steps(r.session);
    if (!steps.ok()) return steps.status();
    std::vector<core::StepSpan> spans;
    for (const StepRow& s : *steps) spans.push_back({s.step, s.beginNs, s.endNs});
    progress.push_back(core::rankProgress(spans));
    out.ranks.push_back({r.rank, r.session, 0, {}});
  }
  if (out.ranks.empty())
    return absl::FailedPreconditionError("job " + std::to_string(jobId) + " has no running rank");
  out.atStep = core::jobApplyStep(progress, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - reading)
                                                .count());
  auto stamped = core::withApplyAtStep(planJson, out.atStep);
  if (!stamped.ok()) return stamped.status();
  for (JobPlanSent::Rank& r : out.ranks) {
    auto id = client.apply(r.session, *stamped);
    if (id.ok()) {
      r.planId = *id;
    } else {
      r.error = std::string(id.status().message());
    }
  }
  return out;
}

absl::StatusOr<std::vector<RankPlanOutcome>> checkJobPlans(DaemonClient& client, uint64_t jobId) {
  auto job = client.job(jobId);
  if (!job.ok()) return job.status();
  std::vector<RankPlanOutcome> out;
  for (const JobRank& r : job->ranks) {
    auto plans = client.planCheck(r.session);
    if (!plans.ok()) return plans.status();
    if (!plans->empty()) out.push_back({r.rank, r.session, plans->back()});
  }
  return out;
}

}  // namespace tidemark::gui
