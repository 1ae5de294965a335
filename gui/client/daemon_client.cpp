#include "gui/client/daemon_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>

#include "client/channel.h"
#include "src/advisor/plan_json.h"
#include "src/base/daemon_address.h"
#include "tidemark/v1/advisor.grpc.pb.h"
#include "tidemark/v1/control.grpc.pb.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::gui {

struct DaemonClient::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Query::Stub> query;
  std::unique_ptr<v1::Advisor::Stub> advisor;
  std::unique_ptr<v1::Control::Stub> control;
};

namespace {

absl::Status fromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void deadline(grpc::ClientContext& ctx, int seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

SessionRow rowOf(const v1::SessionInfo& si) {
  SessionRow r;
  r.id = si.id();
  r.name = si.name();
  r.command = si.command_line();
  r.live = si.state() == v1::SESSION_STATE_LIVE;
  r.steps = si.steps();
  r.startNs = si.start_ts_ns();
  r.endNs = si.end_ts_ns();
  r.jobId = si.job_id();
  r.rank = si.rank();
  return r;
}

void addItems(const google::protobuf::RepeatedPtrField<v1::PeakItem>& modules,
              const google::protobuf::RepeatedPtrField<v1::PeakItem>& tensors, Moment& m) {
  for (const v1::PeakItem& it : modules)
    m.modules.push_back({it.name(), v1::Category_Name(it.category()).substr(9), it.bytes()});
  for (const v1::PeakItem& it : tensors)
    m.tensors.push_back(
        {it.name(), v1::Category_Name(it.category()).substr(9), it.bytes(), it.address()});
}

Moment fromBreakdown(const v1::Breakdown& b) {
  Moment m;
  m.tsNs = b.ts_ns();
  m.step = b.step();
  m.phase = b.phase();
  m.scope = b.scope();
  m.trackedBytes = b.tracked_bytes();
  m.reservedBytes = b.reserved_bytes();
  for (const v1::CategoryBytes& c : b.categories()) {
    const int i = static_cast<int>(c.category()) - 1;
    if (i >= 0 && i < kCategories) m.bytes[static_cast<size_t>(i)] = c.bytes();
  }
  return m;
}

}  // namespace

DaemonClient::DaemonClient(std::string address)
    : m_address(std::move(address)), m_stubs(std::make_unique<Stubs>()) {
  m_stubs->channel =
      client::makeChannel(client::ChannelOptions::fromEnvironment(m_address), &m_channelError);
  if (!m_stubs->channel) return;  // trusted() says why at every call
  m_stubs->query = v1::Query::NewStub(m_stubs->channel);
  m_stubs->advisor = v1::Advisor::NewStub(m_stubs->channel);
  m_stubs->control = v1::Control::NewStub(m_stubs->channel);
}

DaemonClient::DaemonClient(std::string label, std::shared_ptr<grpc::Channel> channel)
    : m_address(std::move(label)), m_inProcess(true), m_stubs(std::make_unique<Stubs>()) {
  m_stubs->channel = std::move(channel);
  m_stubs->query = v1::Query::NewStub(m_stubs->channel);
  m_stubs->advisor = v1::Advisor::NewStub(m_stubs->channel);
  m_stubs->control = v1::Control::NewStub(m_stubs->channel);
}

DaemonClient::~DaemonClient() = default;

absl::Status DaemonClient::trusted() const {
  if (!m_channelError.empty()) return absl::FailedPreconditionError(m_channelError);
  if (m_inProcess) return absl::OkStatus();
  // Nothing goes to (and nothing is shown from) a daemon not run by this user or root.
  const std::string why =
      base::untrustedDaemon(m_address, !std::string(base::env("TIDEMARK_TLS_CA")).empty());
  if (why.empty()) return absl::OkStatus();
  return absl::PermissionDeniedError("not talking to the daemon at " + m_address + ": " + why);
}

absl::StatusOr<std::vector<SessionRow>> DaemonClient::sessions() {
  if (absl::Status s = trusted(); !s.ok()) return s;
  // Every page: a store holds any number of sessions.
  std::vector<v1::SessionInfo> all;
  v1::ListSessionsRequest req;
  do {
    grpc::ClientContext ctx;
    deadline(ctx, 10);
    v1::ListSessionsResponse resp;
    if (auto s = fromGrpc(m_stubs->query->ListSessions(&ctx, req, &resp)); !s.ok()) return s;
    for (v1::SessionInfo& si : *resp.mutable_sessions()) all.push_back(std::move(si));
    req.set_page_token(resp.next_page_token());
  } while (req.page_token() != 0);
  std::vector<SessionRow> out;
  for (const v1::SessionInfo& si : all) out.push_back(rowOf(si));
  return out;
}

absl::StatusOr<SessionRow> DaemonClient::session(uint64_t id) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 10);
  v1::GetSessionRequest req;
  req.set_session_id(id);
  v1::SessionInfo resp;
  if (auto s = fromGrpc(m_stubs->query->GetSession(&ctx, req, &resp)); !s.ok()) return s;
  return rowOf(resp);
}

absl::StatusOr<JobData> DaemonClient::job(uint64_t jobId) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 60);
  v1::GetJobRequest req;
  req.set_job_id(jobId);
  v1::Job resp;
  if (auto s = fromGrpc(m_stubs->query->GetJob(&ctx, req, &resp)); !s.ok()) return s;
  JobData out;
  out.id = resp.job().id();
  out.key = resp.job().key();
  out.worldSize = resp.job().world_size();
  out.memoryRank = resp.memory_rank();
  out.memorySession = resp.memory_session_id();
  out.peakImbalance = resp.peak_imbalance();
  out.stepImbalance = resp.step_time_imbalance();
  for (int32_t r : resp.missing_ranks()) out.missingRanks.push_back(r);
  for (const v1::JobRank& r : resp.ranks()) {
    JobRank row;
    const v1::SessionInfo& si = r.session();
    row.session = si.id();
    row.rank = si.rank();
    row.host = si.hostname();
    row.state = r.failed()                             ? "failed"
                : r.ended_early()                      ? "early"
                : si.state() == v1::SESSION_STATE_LIVE ? "live"
                                                       : "ended";
    row.steps = r.steps();
    row.medianStepNs = r.median_step_ns();
    row.peakBytes = r.has_peak() ? r.peak().tracked_bytes() : -1;
    row.startNs = si.start_ts_ns();
    row.endNs = si.end_ts_ns();
    row.startWallNs = si.start_wall_ns();
    out.ranks.push_back(std::move(row));
  }
  return out;
}

absl::StatusOr<TimelineData> DaemonClient::timeline(uint64_t session, int64_t fromNs, int64_t toNs,
                                                    int buckets, const std::string& device) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 30);
  v1::TimelineRequest req;
  req.set_session_id(session);
  req.set_from_ts_ns(fromNs);
  req.set_to_ts_ns(toNs);
  req.set_buckets(buckets);
  req.set_device(device);
  v1::Timeline resp;
  if (auto s = fromGrpc(m_stubs->query->GetTimeline(&ctx, req, &resp)); !s.ok()) return s;
  TimelineData out;
  out.fromNs = resp.from_ts_ns();
  out.toNs = resp.to_ts_ns();
  for (const v1::TimelineBucket& b : resp.buckets()) {
    TimelineBucket t;
    t.startNs = b.start_ts_ns();
    t.endNs = b.end_ts_ns();
    for (int k = 0; k <= kCategories && k < b.max_bytes_size() && k < b.last_bytes_size(); ++k) {
      t.maxBytes[static_cast<size_t>(k)] = b.max_bytes(k);
      t.lastBytes[static_cast<size_t>(k)] = b.last_bytes(k);
    }
    out.buckets.push_back(t);
  }
  return out;
}

absl::StatusOr<Moment> DaemonClient::peak(uint64_t session, const std::string& device) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 30);
  v1::PeakRequest req;
  req.set_session_id(session);
  req.set_device(device);
  v1::Peak resp;
  if (auto s = fromGrpc(m_stubs->query->GetPeak(&ctx, req, &resp)); !s.ok()) return s;
  Moment m = fromBreakdown(resp.breakdown());
  addItems(resp.modules(), resp.tensors(), m);
  return m;
}

absl::StatusOr<Moment> DaemonClient::at(uint64_t session, int64_t tsNs, const std::string& device) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 30);
  v1::BreakdownRequest req;
  req.set_session_id(session);
  req.set_device(device);
  req.set_ts_ns(tsNs);
  req.set_items(kMomentItems);
  v1::Breakdown resp;
  if (auto s = fromGrpc(m_stubs->query->GetBreakdown(&ctx, req, &resp)); !s.ok()) return s;
  Moment m = fromBreakdown(resp);
  addItems(resp.modules(), resp.tensors(), m);
  return m;
}

absl::StatusOr<std::vector<StepRow>> DaemonClient::steps(uint64_t session,
                                                         const std::string& device) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  v1::StepsRequest req;
  req.set_session_id(session);
  req.set_device(device);
  std::vector<StepRow> out;
  // The daemon answers a page of steps at a time (StepsRequest): every page, in turn.
  for (;;) {
    grpc::ClientContext ctx;  // one per call
    deadline(ctx, 30);
    v1::Steps resp;
    if (auto s = fromGrpc(m_stubs->query->GetSteps(&ctx, req, &resp)); !s.ok()) return s;
    for (const v1::StepSummary& st : resp.steps())
      out.push_back({st.step(), st.begin_ts_ns(), st.end_ts_ns(), fromBreakdown(st.peak()),
                     st.summarized(), st.inferred()});
    if (resp.next_step() < 0 || resp.next_step() <= req.from_step()) break;
    req.set_from_step(resp.next_step());
  }
  return out;
}

absl::StatusOr<std::vector<LaneSpan>> DaemonClient::scopes(uint64_t session, int64_t fromNs,
                                                           int64_t toNs, int64_t minNs) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 30);
  v1::ScopesRequest req;
  req.set_session_id(session);
  req.set_from_ts_ns(fromNs);
  req.set_to_ts_ns(toNs);
  req.set_min_duration_ns(minNs);
  req.set_limit(4000);
  v1::Scopes resp;
  if (auto s = fromGrpc(m_stubs->query->GetScopes(&ctx, req, &resp)); !s.ok()) return s;
  std::vector<LaneSpan> out;
  for (const v1::ScopeSpan& s : resp.scopes()) {
    LaneSpan l;
    l.kind = s.kind() == v1::SCOPE_KIND_KERNEL ? LaneSpan::Kind::kKernel
             : s.kind() == v1::SCOPE_KIND_OP   ? LaneSpan::Kind::kOp
                                               : LaneSpan::Kind::kModule;
    l.name = s.name();
    l.depth = s.depth();
    l.beginNs = s.begin_ts_ns();
    l.endNs = s.end_ts_ns();
    out.push_back(std::move(l));
  }
  for (const v1::PhaseSpan& ph : resp.phases()) {
    LaneSpan l;
    l.kind = LaneSpan::Kind::kPhase;
    l.name = ph.phase();
    l.beginNs = ph.begin_ts_ns();
    l.endNs = ph.end_ts_ns();
    out.push_back(std::move(l));
  }
  return out;
}

absl::StatusOr<PlanSummary> DaemonClient::plan(uint64_t session, const std::string& budget,
                                               const PlanOptions& options) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 60);
  v1::PlanRequest req;
  req.mutable_chain()->set_session_id(session);
  req.set_budget(budget);
  req.set_nested(options.nested);
  req.set_offload(options.offload);
  v1::PlanResponse resp;
  if (auto s = fromGrpc(m_stubs->advisor->Plan(&ctx, req, &resp)); !s.ok()) return s;
  absl::StatusOr<core::PlanDocument> d = core::parsePlanDocument(resp.plan_json());
  if (!d.ok()) return d.status();
  PlanSummary p;
  p.feasible = d->feasible;
  p.json = resp.plan_json();
  p.budgetBytes = d->budgetBytes;
  p.predictedPeakBytes = d->predictedPeakBytes;
  p.predictedExtraNs = d->predictedExtraNs;
  p.baseStepNs = d->baselineStepNs;
  p.storeAllPeakBytes = d->baselinePeakBytes;
  p.minFeasibleBudgetBytes = d->minFeasibleBudgetBytes;
  for (const v1::PredictedPoint& pt : resp.predicted())
    p.predicted.emplace_back(pt.ts_ns(), pt.live_bytes());
  for (const core::PlanSegmentDoc& s : d->segments) {
    std::string mods = s.modules.front();
    if (s.modules.size() > 1) mods += " .. " + s.modules.back();
    if (s.mode == "selective") mods += " (" + s.option + ")";
    if (!s.inner.empty()) mods += " (nested: its re-run checkpoints parts again)";
    p.segments.emplace_back(s.mode, mods);
  }
  return p;
}

absl::StatusOr<ParetoData> DaemonClient::pareto(uint64_t session, const PlanOptions& options) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 60);
  v1::ParetoRequest req;
  req.mutable_chain()->set_session_id(session);
  req.set_nested(options.nested);
  req.set_offload(options.offload);
  v1::ParetoResponse resp;
  if (auto s = fromGrpc(m_stubs->advisor->Pareto(&ctx, req, &resp)); !s.ok()) return s;
  ParetoData out;
  out.storeAllPeakBytes = resp.store_all_peak_bytes();
  out.baseStepNs = resp.base_step_ns();
  for (const v1::ParetoPoint& p : resp.points())
    out.points.emplace_back(p.budget_bytes(), p.extra_ns());
  return out;
}

absl::StatusOr<std::vector<std::string>> DaemonClient::blockStack(uint64_t session,
                                                                  uint64_t address, int64_t tsNs) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 60);
  v1::BlockRequest req;
  req.set_session_id(session);
  req.set_address(address);
  v1::BlockHistory resp;
  if (auto s = fromGrpc(m_stubs->query->GetBlock(&ctx, req, &resp)); !s.ok()) return s;
  for (const v1::BlockLife& b : resp.blocks()) {
    if (b.alloc_ts_ns() > tsNs || (b.freed() && b.free_ts_ns() <= tsNs)) continue;
    return std::vector<std::string>(b.frames().begin(), b.frames().end());
  }
  return std::vector<std::string>();
}

absl::StatusOr<std::vector<PlanOutcome>> DaemonClient::planCheck(uint64_t session) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 60);
  v1::PlanCheckRequest req;
  req.set_session_id(session);
  v1::PlanCheckResponse resp;
  if (auto s = fromGrpc(m_stubs->advisor->PlanCheck(&ctx, req, &resp)); !s.ok()) return s;
  std::vector<PlanOutcome> out;
  for (const v1::PlanOutcome& o : resp.plans()) {
    PlanOutcome p;
    p.planId = o.plan_id();
    p.state = o.state() == v1::PLAN_STATE_APPLIED   ? "applied"
              : o.state() == v1::PLAN_STATE_REFUSED ? "refused"
                                                    : "sent";
    p.message = o.message();
    p.fromStep = o.from_step();
    p.stepsMeasured = o.steps_measured();
    p.budgetBytes = o.budget_bytes();
    p.predictedPeakBytes = o.predicted_peak_bytes();
    p.measuredPeakBytes = o.measured_peak_bytes();
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<uint64_t> DaemonClient::apply(uint64_t session, const std::string& planJson) {
  if (absl::Status s = trusted(); !s.ok()) return s;
  grpc::ClientContext ctx;
  deadline(ctx, 30);
  v1::ApplyPlanRequest req;
  req.set_session_id(session);
  req.set_plan_json(planJson);
  v1::ApplyPlanResponse resp;
  if (auto s = fromGrpc(m_stubs->control->ApplyPlan(&ctx, req, &resp)); !s.ok()) return s;
  return resp.plan_id();
}

}  // namespace tidemark::gui
