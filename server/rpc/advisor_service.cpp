#include "server/rpc/advisor_service.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "src/core/breakdown.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/recording_loader.h"
#include "server/store/store.h"
#include "src/advisor/megatron_flags.h"
#include "src/advisor/plan_json.h"
#include "src/advisor/planner.h"
#include "src/advisor/simulator.h"
#include "src/core/device_filter.h"

namespace tidemark::server {

absl::StatusOr<core::Recording> AdvisorService::loadRecording(int64_t session) {
  auto rec = RecordingLoader(m_dbPath, m_writer, m_agents, m_maxLoadedBlocks).load(session);
  // A GPU job's: its tensors (core::keepTensorLevel), which recomputation changes.
  if (rec.ok()) core::keepTensorLevel(*rec);
  return rec;
}

grpc::Status AdvisorService::checkChainAccess(const grpc::ServerContext& ctx,
                                              const v1::ChainSelector& selector,
                                              const char* method) {
  grpc::Status denied =
      m_access.check(ctx, static_cast<int64_t>(selector.session_id()), method, kRead);
  for (uint64_t other : selector.rerun_times_from())
    if (denied.ok()) denied = m_access.check(ctx, static_cast<int64_t>(other), method, kRead);
  return denied;
}

namespace {

// The op-level policies a session's steps ran blocks under: those of the plans it applied, each
// from its step on (a plan replaces the one before it whole).
absl::StatusOr<core::PlannedPolicies> plannedPolicies(const std::string& dbPath, int64_t session,
                                                      int64_t* firstPlannedStep) {
  auto plans = Store::appliedPlans(dbPath, session);
  if (!plans.ok()) return plans.status();
  std::vector<const AppliedPlanRow*> applied;
  for (const AppliedPlanRow& p : *plans)
    if (p.state == 1 && p.fromStep > 0) applied.push_back(&p);
  std::stable_sort(
      applied.begin(), applied.end(),
      [](const AppliedPlanRow* a, const AppliedPlanRow* b) { return a->fromStep < b->fromStep; });
  core::PlannedPolicies out;
  for (const AppliedPlanRow* p : applied) {
    std::map<std::string, std::string> policies;
    // A plan the job applied was read by it; one this reader cannot read names no policy.
    if (auto doc = core::parsePlanDocument(p->planJson); doc.ok())
      for (const core::PlanSegmentDoc& seg : doc->segments)
        if (seg.mode == "selective" && !seg.policy.empty())
          for (const std::string& module : seg.modules) policies[module] = seg.policy;
    out.fromStep.emplace_back(p->fromStep, std::move(policies));
  }
  if (firstPlannedStep != nullptr)
    *firstPlannedStep = applied.empty() ? 0 : applied.front()->fromStep;
  return out;
}

}  // namespace

absl::StatusOr<core::RecordedChain> AdvisorService::chainFor(const v1::ChainSelector& selector) {
  const auto session = static_cast<int64_t>(selector.session_id());
  // Other recordings of the job whose re-runs time the recomputation: their intervals only (no
  // blocks: cheap, and never refused for their size; a live one as far as it is committed), taken
  // one at a time before the session's own is loaded, their re-run durations kept.
  constexpr int kMaxRerunSessions = 64;
  if (selector.rerun_times_from_size() > kMaxRerunSessions)
    return absl::InvalidArgumentError(absl::StrCat("--rerun-times-from takes at most ",
                                                   kMaxRerunSessions, " sessions, not ",
                                                   selector.rerun_times_from_size()));
  std::optional<core::RerunSamples> rerunsFrom;
  for (uint64_t other : selector.rerun_times_from()) {
    auto failed = [&](const absl::Status& st) {
      return absl::Status(st.code(),
                          absl::StrCat("--rerun-times-from ", other, ": ", st.message()));
    };
    // NOT_FOUND for a session not there (the intervals alone would read as an empty one).
    if (auto info = Store::getSession(m_dbPath, static_cast<int64_t>(other)); !info.ok())
      return failed(info.status());
    auto r = Store::loadRecording(m_dbPath, static_cast<int64_t>(other), /*withBlocks=*/false);
    if (!r.ok()) return failed(r.status());
    auto policies = plannedPolicies(m_dbPath, static_cast<int64_t>(other), nullptr);
    if (!policies.ok()) return failed(policies.status());
    if (!rerunsFrom) rerunsFrom.emplace();
    core::addRecordedReruns(*r, *policies, &*rerunsFrom);
  }
  auto rec = loadRecording(session);
  if (!rec.ok()) return rec.status();
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  // A job that applied a plan is modelled from a step before it (chainFromRecording), and its
  // re-runs under op-level policies time those.
  int64_t firstPlannedStep = 0;
  auto policies = plannedPolicies(m_dbPath, session, &firstPlannedStep);
  if (!policies.ok()) return policies.status();
  return core::chainFromRecording(*rec, cats, selector.step(), selector.blocks(),
                                  selector.step() == 0 ? firstPlannedStep : 0,
                                  rerunsFrom ? &*rerunsFrom : nullptr, &*policies);
}

grpc::Status AdvisorService::GetChainProfile(grpc::ServerContext* ctx,
                                             const v1::ChainProfileRequest* request,
                                             v1::ChainProfileResponse* response) {
  if (grpc::Status denied = checkChainAccess(*ctx, request->chain(), "GetChainProfile");
      !denied.ok())
    return denied;
  auto chain = chainFor(request->chain());
  if (!chain.ok()) return toGrpc(chain.status());
  response->set_profile_json(core::chainProfileToJson(chain->profile));
  response->set_step(chain->step);
  response->set_recorded_plan(core::planSignature(chain->recordedPlan));
  response->set_recorded_predicted_peak_bytes(
      core::simulate(chain->profile, chain->recordedPlan).peakBytes);
  response->set_recorded_measured_peak_bytes(chain->measuredPeakBytes);
  response->set_recorded_carried_peak_bytes(chain->carriedPeakBytes);
  response->set_measured_step_ns(chain->measuredStepNs);
  for (const std::string& w : chain->warnings) response->add_warnings(w);
  return grpc::Status::OK;
}

namespace {

// A chain planned with offloading over a link of `speed`: refused for a CPU job, whose
// activations are host memory already.
grpc::Status offloadTo(core::RecordedChain& chain, const std::string& speed, uint64_t session) {
  auto bytesPerSecond = core::parseSpeed(speed);
  if (!bytesPerSecond.ok()) return toGrpc(bytesPerSecond.status());
  if (!chain.onDevice)
    return toGrpc(absl::FailedPreconditionError(
        absl::StrCat("session ", session,
                     " records host memory only (a CPU job): offloading moves a GPU "
                     "job's activations to the host, and here they are there already")));
  chain.profile.offloadBytesPerSecond = *bytesPerSecond;
  return grpc::Status::OK;
}

// Whether the plan does anything but store every block.
bool recomputesAny(const core::ChainPlan& plan) {
  for (const core::Segment& s : plan.segments)
    if (s.mode != core::SegmentMode::kStore || s.option >= 0) return true;
  return false;
}

}  // namespace

grpc::Status AdvisorService::Plan(grpc::ServerContext* ctx, const v1::PlanRequest* request,
                                  v1::PlanResponse* response) {
  if (grpc::Status denied = checkChainAccess(*ctx, request->chain(), "Plan"); !denied.ok())
    return denied;
  auto budget = core::parseBudget(request->budget());
  if (!budget.ok()) return toGrpc(budget.status());
  auto strategy =
      core::parseStrategy(request->strategy().empty() ? "optimal" : request->strategy());
  if (!strategy.ok()) return toGrpc(strategy.status());
  if (request->has_margin() && !(request->margin() >= 0 && request->margin() < 0.5))
    return toGrpc(absl::InvalidArgumentError("margin must be in [0, 0.5)"));
  auto chain = chainFor(request->chain());
  if (!chain.ok()) return toGrpc(chain.status());
  if (!request->offload().empty()) {
    if (grpc::Status s = offloadTo(*chain, request->offload(), request->chain().session_id());
        !s.ok())
      return s;
  }
  core::PlanReport report =
      core::makePlan(chain->profile, core::resolveBudget(*budget, chain->profile), *strategy,
                     request->has_margin() ? request->margin() : core::kDefaultMarginFraction,
                     nullptr, request->nested());
  report.source.session = std::to_string(request->chain().session_id());
  report.source.step = chain->step;
  if (recomputesAny(chain->recordedPlan)) {
    const core::SimResult ran = core::simulate(chain->profile, chain->recordedPlan);
    report.source.asRecorded = {core::planSignature(chain->recordedPlan), ran.peakBytes,
                                ran.extraNs, ran.stepNs};
  }
  report.warnings.insert(report.warnings.begin(), chain->warnings.begin(), chain->warnings.end());
  response->set_plan_json(core::planToJson(chain->profile, report));
  if (request->megatron()) {
    response->set_megatron_json(core::megatronToJson(
        core::megatronExport(chain->profile, report.budgetBytes, report.marginBytes, report.plan)));
  }
  for (const core::SimPoint& pt : report.predicted.points) {
    int64_t ts = 0;
    switch (pt.phase) {
      case core::SimPhase::kForward:
        ts = chain->forwardEndNs[pt.stage];
        break;
      case core::SimPhase::kEndOfForward:
        ts = chain->endOfForwardNs;
        break;
      case core::SimPhase::kRecompute:
        ts = chain->backwardBeginNs[pt.stage];
        break;
      case core::SimPhase::kBackward:
        ts = chain->backwardMidNs[pt.stage];
        break;
      case core::SimPhase::kOutside:
        continue;
    }
    v1::PredictedPoint* out = response->add_predicted();
    out->set_ts_ns(ts);
    out->set_live_bytes(pt.liveBytes);
  }
  response->set_feasible(report.feasible);
  response->set_min_feasible_budget_bytes(report.minFeasibleBudgetBytes);
  const core::PlanSource::AsRecorded& ran = report.source.asRecorded;
  response->set_recorded_plan(ran.plan);
  response->set_recorded_peak_bytes(ran.peakBytes);
  response->set_recorded_extra_ns(ran.extraNs);
  response->set_recorded_step_ns(ran.stepNs);
  return grpc::Status::OK;
}

grpc::Status AdvisorService::Pareto(grpc::ServerContext* ctx, const v1::ParetoRequest* request,
                                    v1::ParetoResponse* response) {
  if (grpc::Status denied = checkChainAccess(*ctx, request->chain(), "Pareto"); !denied.ok())
    return denied;
  auto chain = chainFor(request->chain());
  if (!chain.ok()) return toGrpc(chain.status());
  if (!request->offload().empty()) {
    if (grpc::Status s = offloadTo(*chain, request->offload(), request->chain().session_id());
        !s.ok())
      return s;
  }
  const std::unique_ptr<core::ChainFront> solved =
      core::solveChain(chain->profile, std::numeric_limits<int64_t>::max(), request->nested());
  const core::ParetoSummary sum = core::paretoSummary(chain->profile, *solved);
  response->set_chain_name(sum.chainName);
  response->set_store_all_peak_bytes(sum.storeAllPeakBytes);
  response->set_static_bytes(sum.staticBytes);
  response->set_base_step_ns(sum.baseStepNs);
  response->set_step(chain->step);
  response->set_epsilon_bytes(sum.epsilonBytes);
  for (const auto& p : sum.points) {
    v1::ParetoPoint* out = response->add_points();
    out->set_budget_bytes(p.budgetBytes);
    out->set_extra_ns(p.extraNs);
    out->set_plan(p.plan);
  }
  return grpc::Status::OK;
}

namespace {

// What one complete step measured.
struct StepFigures {
  int64_t step = 0;
  int64_t peakBytes = 0;
  int64_t ns = 0;
  int64_t recomputeNs = 0;  // inside its recorded recompute phases (the outermost ones)
};

int64_t median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The highest peak and the median time (and recomputation time) of the steps in [from, to).
void measure(const std::vector<StepFigures>& steps, int64_t from, int64_t to, int64_t* peak,
             int64_t* ns, int64_t* count, int64_t* recomputeNs = nullptr) {
  std::vector<int64_t> times, recomputes;
  *peak = 0;
  for (const StepFigures& s : steps) {
    if (s.step < from || s.step >= to) continue;
    *peak = std::max(*peak, s.peakBytes);
    times.push_back(s.ns);
    recomputes.push_back(s.recomputeNs);
  }
  *ns = median(times);
  if (count != nullptr) *count = static_cast<int64_t>(times.size());
  if (recomputeNs != nullptr) *recomputeNs = median(recomputes);
}

// Each complete step's peak, time and recomputation time.
std::vector<StepFigures> stepFigures(const core::Recording& rec,
                                     const core::LivenessReplay& replay) {
  std::vector<StepFigures> steps;
  for (const core::StepInterval& s : rec.steps) {
    if (s.endSeq == core::kOpenSeq) continue;
    steps.push_back(
        {s.step, replay.peak(s.beginSeq, s.endSeq).trackedBytes, s.endTsNs - s.beginTsNs, 0});
  }
  // Phases come in begin order: a recompute phase inside the last one counted is nested.
  uint64_t coveredUntil = 0;
  for (const core::PhaseInterval& ph : rec.phases) {
    if (ph.phase != core::Phase::kRecompute || ph.endSeq == core::kOpenSeq) continue;
    if (ph.beginSeq < coveredUntil) continue;
    coveredUntil = ph.endSeq;
    auto it = std::upper_bound(
        rec.steps.begin(), rec.steps.end(), ph.beginSeq,
        [](uint64_t seq, const core::StepInterval& s) { return seq < s.beginSeq; });
    if (it == rec.steps.begin() || !(it - 1)->contains(ph.beginSeq)) continue;
    for (StepFigures& f : steps)
      if (f.step == (it - 1)->step) f.recomputeNs += ph.endTsNs - ph.beginTsNs;
  }
  return steps;
}

}  // namespace

grpc::Status AdvisorService::PlanCheck(grpc::ServerContext* ctx,
                                       const v1::PlanCheckRequest* request,
                                       v1::PlanCheckResponse* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "PlanCheck", kRead);
      !denied.ok())
    return denied;
  const auto id = static_cast<int64_t>(request->session_id());
  auto plans = Store::appliedPlans(m_dbPath, id);
  if (!plans.ok()) return toGrpc(plans.status());
  if (plans->empty()) {
    auto session = Store::getSession(m_dbPath, id);
    if (!session.ok()) return toGrpc(session.status());
    return grpc::Status::OK;  // a session no plan was sent to
  }
  auto rec = loadRecording(id);
  if (!rec.ok()) return toGrpc(rec.status());
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  const core::LivenessReplay replay(*rec, cats);
  const std::vector<StepFigures> steps = stepFigures(*rec, replay);
  // Each applied plan holds from its first step until the next applied plan's.
  std::vector<int64_t> starts;
  for (const AppliedPlanRow& p : *plans)
    if (p.state == 1) starts.push_back(p.fromStep);
  for (const AppliedPlanRow& p : *plans) {
    v1::PlanOutcome* o = response->add_plans();
    o->set_plan_id(static_cast<uint64_t>(p.id));
    o->set_state(p.state == 1   ? v1::PLAN_STATE_APPLIED
                 : p.state == 2 ? v1::PLAN_STATE_REFUSED
                                : v1::PLAN_STATE_SENT);
    o->set_message(p.message);
    o->set_strategy(p.strategy);
    o->set_budget_bytes(p.budgetBytes);
    o->set_predicted_peak_bytes(p.predictedPeakBytes);
    o->set_predicted_extra_ns(p.predictedExtraNs);
    if (p.state != 1) continue;
    o->set_from_step(p.fromStep);
    int64_t until = std::numeric_limits<int64_t>::max();
    for (int64_t s : starts)
      if (s > p.fromStep) until = std::min(until, s);
    int64_t peak = 0, ns = 0, count = 0, recomputeNs = 0;
    measure(steps, p.fromStep, until, &peak, &ns, &count, &recomputeNs);
    o->set_measured_peak_bytes(peak);
    o->set_measured_step_ns(ns);
    o->set_steps_measured(count);
    o->set_measured_extra_ns(recomputeNs);
    // Before: the steps since the previous plan (or the start), less the first step, which
    // creates the optimizer's state, when there are others.
    int64_t since = 1;
    for (int64_t s : starts)
      if (s < p.fromStep) since = std::max(since, s);
    if (since == 1 && p.fromStep > 2) since = 2;
    int64_t before = 0;
    measure(steps, since, p.fromStep, &peak, &ns, &before);
    o->set_before_peak_bytes(peak);
    o->set_before_step_ns(ns);
    o->set_steps_before(before);
  }
  return grpc::Status::OK;
}

}  // namespace tidemark::server
