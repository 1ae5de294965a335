#include "server/rpc/advisor_service.h"

#include "server/rpc/grpc_status.h"
#include "server/store/store.h"
#include "src/advisor/plan_json.h"
#include "src/advisor/planner.h"
#include "src/advisor/simulator.h"

namespace tidemark::server {

absl::StatusOr<core::RecordedChain> AdvisorService::chainFor(const v1::ChainSelector& selector) {
  auto rec = Store::loadRecording(m_dbPath, static_cast<int64_t>(selector.session_id()));
  if (!rec.ok()) return rec.status();
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  return core::chainFromRecording(*rec, cats, selector.step(), selector.blocks());
}

grpc::Status AdvisorService::GetChainProfile(grpc::ServerContext*,
                                             const v1::ChainProfileRequest* request,
                                             v1::ChainProfileResponse* response) {
  auto chain = chainFor(request->chain());
  if (!chain.ok()) return toGrpc(chain.status());
  response->set_profile_json(core::chainProfileToJson(chain->profile));
  response->set_step(chain->step);
  response->set_recorded_plan(core::planSignature(chain->recordedPlan));
  response->set_recorded_predicted_peak_bytes(
      core::simulate(chain->profile, chain->recordedPlan).peakBytes);
  response->set_recorded_measured_peak_bytes(chain->measuredPeakBytes);
  response->set_measured_step_ns(chain->measuredStepNs);
  return grpc::Status::OK;
}

grpc::Status AdvisorService::Plan(grpc::ServerContext*, const v1::PlanRequest* request,
                                  v1::PlanResponse* response) {
  auto budget = core::parseBudget(request->budget());
  if (!budget.ok()) return toGrpc(budget.status());
  auto strategy =
      core::parseStrategy(request->strategy().empty() ? "optimal" : request->strategy());
  if (!strategy.ok()) return toGrpc(strategy.status());
  auto chain = chainFor(request->chain());
  if (!chain.ok()) return toGrpc(chain.status());
  core::PlanReport report =
      core::makePlan(chain->profile, core::resolveBudget(*budget, chain->profile), *strategy);
  report.source.session = std::to_string(request->chain().session_id());
  report.source.step = chain->step;
  response->set_plan_json(core::planToJson(chain->profile, report));
  response->set_feasible(report.feasible);
  response->set_min_feasible_budget_bytes(report.minFeasibleBudgetBytes);
  return grpc::Status::OK;
}

grpc::Status AdvisorService::Pareto(grpc::ServerContext*, const v1::ParetoRequest* request,
                                    v1::ParetoResponse* response) {
  auto chain = chainFor(request->chain());
  if (!chain.ok()) return toGrpc(chain.status());
  const core::OptimalChainSolver solver(chain->profile);
  const core::ParetoSummary sum = core::paretoSummary(chain->profile, solver);
  response->set_chain_name(sum.chainName);
  response->set_store_all_peak_bytes(sum.storeAllPeakBytes);
  response->set_static_bytes(sum.staticBytes);
  response->set_base_step_ns(sum.baseStepNs);
  response->set_step(chain->step);
  for (const auto& p : sum.points) {
    v1::ParetoPoint* out = response->add_points();
    out->set_budget_bytes(p.budgetBytes);
    out->set_extra_ns(p.extraNs);
    out->set_plan(p.plan);
  }
  return grpc::Status::OK;
}

}  // namespace tidemark::server
