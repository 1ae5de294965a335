#include "server/rpc/query_service.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/rpc/agent_counters.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/step_figures.h"
#include "server/store/store.h"
#include "src/core/breakdown.h"
#include "src/core/categorize.h"
#include "src/core/chrome_trace.h"
#include "src/core/ops.h"
#include "src/core/peak.h"
#include "src/core/timeline.h"
#include "tidemark/v1/checkpoint.pb.h"

namespace tidemark::server {

namespace {
void addStat(const StatRow& s, v1::SessionInfo* out) {
  v1::Stat* st = out->add_stats();
  st->set_name(s.name);
  st->set_severity(s.severity);
  st->set_value(s.value);
  st->set_description(s.description);
}

void fillSession(const SessionRecord& r, uid_t storeOwner, v1::SessionInfo* out) {
  out->set_id(static_cast<uint64_t>(r.id));
  out->set_name(r.header.name);
  out->set_pid(r.header.pid);
  out->set_hostname(r.header.hostname);
  out->set_command_line(r.header.commandLine);
  out->set_start_ts_ns(r.header.startTsNs);
  out->set_end_ts_ns(r.endTsNs);
  out->set_start_wall_ns(r.header.startWallNs);
  out->set_state(static_cast<v1::SessionState>(r.state));
  out->set_events_sent(static_cast<uint64_t>(r.eventsSent.value_or(0)));
  out->set_events_received(static_cast<uint64_t>(r.eventsReceived));
  out->set_events_stored(static_cast<uint64_t>(r.eventsStored));
  out->set_events_dropped(static_cast<uint64_t>(r.eventsDropped.value_or(0)));
  out->set_blocks(static_cast<uint64_t>(r.blocks));
  out->set_live_blocks_at_end(static_cast<uint64_t>(r.liveBlocksAtEnd));
  out->set_steps(r.steps);
  out->set_analyzed(r.analyzed);
  if (r.rawPrunedWallNs) out->set_raw_pruned_wall_ns(*r.rawPrunedWallNs);
  out->set_owner_uid(static_cast<uint32_t>(r.header.ownerUid.value_or(storeOwner)));
  out->set_job_id(static_cast<uint64_t>(r.jobId));
  out->set_rank(r.header.rank);
  out->set_local_rank(r.header.localRank);
  out->set_world_size(r.header.worldSize);
  out->set_daemon(r.daemon);
  for (const StatRow& s : r.stats) addStat(s, out);
}

// A live session's agent counters, as its stats and its events dropped.
void addAgentStats(const v1::AgentCounters& c, v1::SessionInfo* out) {
  out->set_events_dropped(static_cast<uint64_t>(agentEventsDropped(c)));
  std::vector<StatRow> stats{{"agent_counters_early", "info", 1,
                              "agent: the session is live; its counts (the agent_ and "
                              "adapter_failures stats) are as it reported them with the batches "
                              "committed so far"}};
  appendAgentCounterStats(c, &stats);
  for (const StatRow& s : stats) addStat(s, out);
}

// The live sessions' agent counters as their last commits hold them (EventBatch.counters, kept
// in their checkpoints, read with one connection for all): their losses and adapter failures are
// said while they run, not only at their end. Nothing is added where a checkpoint cannot be read
// (the answer is the store's, as before).
void addLiveAgentStats(const std::string& dbPath, const std::vector<v1::SessionInfo*>& infos) {
  std::vector<int64_t> live;
  for (const v1::SessionInfo* info : infos)
    if (info->state() == v1::SESSION_STATE_LIVE) live.push_back(static_cast<int64_t>(info->id()));
  if (live.empty()) return;
  auto states = Store::loadCheckpointStates(dbPath, live);
  if (!states.ok()) return;
  for (v1::SessionInfo* info : infos) {
    if (info->state() != v1::SESSION_STATE_LIVE) continue;
    auto state = states->find(static_cast<int64_t>(info->id()));
    if (state == states->end()) continue;
    v1::IngestCheckpoint checkpoint;
    if (checkpoint.ParseFromString(state->second) && checkpoint.has_agent_counters())
      addAgentStats(checkpoint.agent_counters(), info);
  }
}
}  // namespace

void QueryService::fillSessionInfo(const SessionRecord& r, v1::SessionInfo* out) const {
  fillSession(r, m_access.storeOwner(), out);
  addLiveAgentStats(m_dbPath, {out});
}

grpc::Status QueryService::ListSessions(grpc::ServerContext* ctx,
                                        const v1::ListSessionsRequest* request,
                                        v1::ListSessionsResponse* response) {
  auto caller = m_access.caller(*ctx, "ListSessions", kRead);
  if (!caller.ok()) return toGrpc(caller.status());
  // Only the caller's own sessions, unless it may see every one.
  const std::optional<int64_t> owner = visibleOwner(caller->uid);
  constexpr uint32_t kDefaultPage = 500;
  constexpr uint32_t kMaxPage = 1000;
  constexpr size_t kMaxPageBytes = 1u << 20;  // well under gRPC's 4 MiB message limit
  const uint32_t size =
      request->page_size() == 0 ? kDefaultPage : std::min(request->page_size(), kMaxPage);
  auto sessions = Store::listSessions(m_dbPath, static_cast<int64_t>(request->page_token()),
                                      static_cast<int64_t>(size) + 1, owner,
                                      static_cast<int64_t>(m_access.storeOwner()));
  if (!sessions.ok()) return toGrpc(sessions.status());
  size_t bytes = 0;
  for (size_t i = 0; i < sessions->size(); ++i) {
    const SessionRecord& r = (*sessions)[i];
    if (i == size || (i > 0 && bytes >= kMaxPageBytes)) {
      response->set_next_page_token(static_cast<uint64_t>((*sessions)[i - 1].id));
      break;
    }
    v1::SessionInfo* info = response->add_sessions();
    fillSession(r, m_access.storeOwner(), info);
    bytes += info->ByteSizeLong();
  }
  std::vector<v1::SessionInfo*> infos;
  for (v1::SessionInfo& info : *response->mutable_sessions()) infos.push_back(&info);
  addLiveAgentStats(m_dbPath, infos);
  return grpc::Status::OK;
}

grpc::Status QueryService::GetSession(grpc::ServerContext* ctx,
                                      const v1::GetSessionRequest* request,
                                      v1::SessionInfo* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetSession", kRead);
      !denied.ok())
    return denied;
  auto session = Store::getSession(m_dbPath, static_cast<int64_t>(request->session_id()), true);
  if (!session.ok()) return toGrpc(session.status());
  fillSession(*session, m_access.storeOwner(), response);
  addLiveAgentStats(m_dbPath, {response});
  return grpc::Status::OK;
}

namespace {

void fillBreakdown(int64_t sessionId, const core::MemoryState& state, int64_t step,
                   const std::string& phase, const std::string& scope, bool atPeak,
                   v1::Breakdown* out) {
  out->set_session_id(static_cast<uint64_t>(sessionId));
  out->set_ts_ns(state.tsNs);
  out->set_seq(state.seq);
  out->set_step(step);
  out->set_tracked_bytes(state.trackedBytes);
  out->set_at_peak(atPeak);
  out->set_phase(phase);
  out->set_scope(scope);
  for (core::Category c : core::kAllCategories) {
    v1::CategoryBytes* cb = out->add_categories();
    cb->set_category(static_cast<v1::Category>(static_cast<int>(c)));
    cb->set_name(std::string(core::categoryName(c)));
    cb->set_bytes(state.bytes[core::categoryIndex(c)]);
    cb->set_blocks(state.blocks[core::categoryIndex(c)]);
  }
}

std::optional<core::DeviceFilter> deviceOf(const std::string& text) {
  return core::DeviceFilter::parse(text, nullptr);
}

grpc::Status badDevice(const std::string& text) {
  std::string why;
  core::DeviceFilter::parse(text, &why);
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
}

}  // namespace

// A peak report: read from the stored analysis, or (for a session not analyzed yet) computed
// from the recording now. step -1 is the whole session.
absl::StatusOr<core::Recording> QueryService::load(int64_t id, const core::DeviceFilter& device) {
  auto rec = m_loader.load(id);
  if (!rec.ok() || device.all()) return rec;
  // What the session holds, to say so when the filter keeps none of it.
  std::set<int32_t> held;
  for (const core::Block& b : rec->blocks) held.insert(b.device < 0 ? -1 : b.device);
  core::keepDevice(*rec, device);
  if (rec->blocks.empty() && !held.empty()) {
    std::string has;
    for (int32_t d : held) {
      has += has.empty() ? "" : ", ";
      has += d < 0 ? std::string("cpu") : "cuda:" + std::to_string(d);
    }
    return absl::NotFoundError("session " + std::to_string(id) + " recorded no " +
                               (device.kind == core::DeviceFilter::Kind::kHost ? std::string("cpu")
                                : device.kind == core::DeviceFilter::Kind::kDevice
                                    ? "cuda:" + std::to_string(device.device)
                                    : std::string("cuda")) +
                               " memory (it has " + has + ")");
  }
  return rec;
}

bool QueryService::withLive(int64_t id, const std::function<void(const core::LiveAnalysis&)>& fn) {
  bool ran = false;
  m_agents.visit(id, [&](const SessionIngest& ingest) {
    if (const core::LiveAnalysis* live = ingest.live()) {
      fn(*live);
      ran = true;
    }
  });
  return ran;
}

namespace {
std::vector<core::PeakReport> livePeaks(const core::LiveAnalysis& live) {
  std::vector<core::PeakReport> out{live.wholePeak()};
  for (core::LiveAnalysis::StepAnswer& s : live.steps()) out.push_back(std::move(s.peak));
  return out;
}
}  // namespace

absl::StatusOr<core::PeakReport> QueryService::peakReport(int64_t id, int64_t step,
                                                          const core::DeviceFilter& device) {
  if (device.all()) {
    std::optional<absl::StatusOr<core::PeakReport>> live;
    withLive(id, [&](const core::LiveAnalysis& a) {
      if (step < 0) {
        live = a.wholePeak();
        return;
      }
      if (step < a.storedBelow()) {  // let go of once committed: the store's
        live = Store::readPeak(m_dbPath, id, step);
        if (live->status().code() == absl::StatusCode::kNotFound)
          live = absl::OutOfRangeError("session " + std::to_string(id) + " has no step " +
                                       std::to_string(step));
        return;
      }
      size_t known = 0;
      for (core::LiveAnalysis::StepAnswer& s : a.stepPage(step, 1, false, &known)) {
        if (s.peak.step == step) {
          live = std::move(s.peak);
          return;
        }
      }
      live = absl::OutOfRangeError("session " + std::to_string(id) + " has no step " +
                                   std::to_string(step) + " yet");
    });
    if (live) return std::move(*live);
  }
  auto analyzed = Store::isAnalyzed(m_dbPath, id);
  if (!analyzed.ok()) return analyzed.status();
  if (*analyzed && device.all()) {
    auto stored = Store::readPeak(m_dbPath, id, step);
    if (stored.status().code() == absl::StatusCode::kNotFound && step >= 0) {
      return absl::OutOfRangeError("session " + std::to_string(id) + " has no step " +
                                   std::to_string(step));
    }
    return stored;
  }
  auto rec = load(id, device);
  if (!rec.ok()) return rec.status();
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  const core::LivenessReplay replay(*rec, cats);
  std::vector<core::PeakReport> peaks = core::computePeaks(*rec, cats, replay);
  for (core::PeakReport& p : peaks) {
    if (p.step == step) return std::move(p);
  }
  return absl::OutOfRangeError("session " + std::to_string(id) + " has no step " +
                               std::to_string(step) + " (it has " +
                               std::to_string(rec->steps.size()) + " steps)");
}

absl::StatusOr<std::vector<core::PeakReport>> QueryService::peakReports(
    int64_t id, const core::DeviceFilter& device, std::optional<StepNumbers> steps) {
  if (device.all()) {
    std::vector<core::PeakReport> live;
    int64_t storedBelow = std::numeric_limits<int64_t>::min();
    if (withLive(id, [&](const core::LiveAnalysis& a) {
          live = livePeaks(a);
          storedBelow = a.storedBelow();
        })) {
      // The steps the live analysis let go of, from the store (committed before): those asked.
      const int64_t first = steps ? steps->first : std::numeric_limits<int64_t>::min();
      const int64_t last = std::min(steps ? steps->last : storedBelow - 1, storedBelow - 1);
      if (storedBelow == std::numeric_limits<int64_t>::min() || first > last) return live;
      auto stored = Store::readPeaks(m_dbPath, id, StepNumbers{first, last});
      if (!stored.ok()) return stored.status();
      std::erase_if(*stored, [](const core::PeakReport& p) { return p.step == -1; });
      stored->insert(stored->end(), live.begin() + 1, live.end());
      stored->insert(stored->begin(), live.front());
      return stored;
    }
  }
  auto analyzed = Store::isAnalyzed(m_dbPath, id);
  if (!analyzed.ok()) return analyzed.status();
  if (*analyzed && device.all()) return Store::readPeaks(m_dbPath, id, steps);
  auto rec = load(id, device);
  if (!rec.ok()) return rec.status();
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  return core::computePeaks(*rec, cats, core::LivenessReplay(*rec, cats));
}

grpc::Status QueryService::GetSteps(grpc::ServerContext* ctx, const v1::StepsRequest* request,
                                    v1::Steps* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetSteps", kRead);
      !denied.ok())
    return denied;
  const auto id = static_cast<int64_t>(request->session_id());
  auto session = Store::getSession(m_dbPath, id);
  if (!session.ok()) return toGrpc(session.status());
  const int64_t startTs = session->header.startTsNs;
  std::optional<core::DeviceFilter> device = deviceOf(request->device());
  if (!device) return badDevice(request->device());
  // One page: a session of any number of steps answers in pages of at most kStepsPerPage.
  const int64_t page = request->max_steps() == 0
                           ? kStepsPerPage
                           : std::min<int64_t>(request->max_steps(), kStepsPerPage);
  const std::optional<int64_t> from =
      request->from_step() > 0 ? std::optional<int64_t>(request->from_step()) : std::nullopt;
  // A live session's steps as its ingest knows them (the running one too); else the store's,
  // read after (a session whose stream is ending is committed by then). Either way in step
  // order, the page and the step after it.
  std::vector<core::StepInterval> steps;
  int64_t total = 0;
  const int64_t wanted = request->last() ? page : page + 1;
  // A live session's page carries its peaks (all memory: a device filter reads the recording).
  std::vector<core::PeakReport> livePage;
  int64_t storedBelow = std::numeric_limits<int64_t>::min();
  const bool live = withLive(id, [&](const core::LiveAnalysis& a) {
    size_t known = 0;
    for (core::LiveAnalysis::StepAnswer& s :
         a.stepPage(from, static_cast<size_t>(wanted), request->last(), &known)) {
      steps.push_back(s.interval);
      livePage.push_back(std::move(s.peak));
    }
    total = static_cast<int64_t>(known);
    storedBelow = a.storedBelow();
  });
  // The steps the live analysis let go of are in the store (it lets go once they are committed):
  // the page takes them from there, with their peaks, around those it still holds.
  if (live && storedBelow != std::numeric_limits<int64_t>::min() &&
      (request->last() || !from || *from < storedBelow)) {
    auto rows = Store::loadStepPage(m_dbPath, id, from, wanted, request->last(), storedBelow);
    if (!rows.ok()) return toGrpc(rows.status());
    if (!rows->empty() && device->all()) {
      auto stored =
          Store::readPeaks(m_dbPath, id, StepNumbers{rows->front().step, rows->back().step});
      if (!stored.ok()) return toGrpc(stored.status());
      livePage.insert(livePage.begin(), stored->begin(), stored->end());
    }
    std::map<int64_t, core::StepInterval> merged;
    for (const core::StepInterval& s : *rows) merged[s.step] = s;
    for (const core::StepInterval& s : steps) merged[s.step] = s;  // held: the live one
    steps.clear();
    for (const auto& [n, s] : merged) steps.push_back(s);
    if (static_cast<int64_t>(steps.size()) > wanted) {
      if (request->last()) {
        steps.erase(steps.begin(), steps.end() - wanted);
      } else {
        steps.resize(static_cast<size_t>(wanted));
      }
    }
  }
  if (!live) {
    auto counted = Store::countSteps(m_dbPath, id);
    if (!counted.ok()) return toGrpc(counted.status());
    total = *counted;
    auto rows =
        Store::loadStepPage(m_dbPath, id, from, request->last() ? page : page + 1, request->last());
    if (!rows.ok()) return toGrpc(rows.status());
    steps = std::move(*rows);
  }
  int64_t nextStep = -1;
  if (!request->last() && static_cast<int64_t>(steps.size()) > page) {
    nextStep = steps[page].step;
    steps.resize(page);
  }
  response->set_session_id(static_cast<uint64_t>(id));
  response->set_next_step(nextStep);
  response->set_total_steps(total);
  if (steps.empty()) return grpc::Status::OK;
  const StepNumbers span{steps.front().step, steps.back().step};
  // Live: the stored steps' peaks first, then the held ones' (which win for a step in both).
  absl::StatusOr<std::vector<core::PeakReport>> peaks = std::move(livePage);
  if (!live || !device->all()) peaks = peakReports(id, *device, span);
  if (!peaks.ok()) return toGrpc(peaks.status());
  std::map<int64_t, const core::PeakReport*> byStep;
  for (const core::PeakReport& p : *peaks) byStep[p.step] = &p;
  // Steps a capture schedule summarized: the agent's figures, not the replay of what was sent.
  auto figures = Store::loadStepFigures(m_dbPath, id, span);
  if (!figures.ok()) return toGrpc(figures.status());
  std::map<int64_t, std::vector<StepFigureRow>> figuresByStep;
  for (const StepFigureRow& f : *figures) figuresByStep[f.step].push_back(f);
  for (const core::StepInterval& s : steps) {
    auto summarized = figuresByStep.find(s.step);
    auto it = byStep.find(s.step);
    if (it == byStep.end() && summarized == figuresByStep.end()) continue;
    v1::StepSummary* out = response->add_steps();
    out->set_step(s.step);
    out->set_begin_ts_ns(s.beginTsNs);
    out->set_end_ts_ns(s.endSeq == core::kOpenSeq ? 0 : s.endTsNs);
    out->set_inferred(s.inferred);
    if (summarized != figuresByStep.end()) {
      fillSummarizedStep(summarized->second, *device, id, startTs, out);
      continue;
    }
    fillBreakdown(id, it->second->state, s.step, it->second->phase, it->second->scope, true,
                  out->mutable_peak());
    out->mutable_peak()->set_offset_ns(it->second->state.tsNs - startTs);
  }
  // What the caching allocator reserved at each step's peak (as GetBreakdown gives it).
  std::vector<v1::Breakdown*> replayed;
  std::vector<uint64_t> seqs;
  for (v1::StepSummary& st : *response->mutable_steps()) {
    if (st.peak().summarized()) continue;
    replayed.push_back(st.mutable_peak());
    seqs.push_back(st.peak().seq());
  }
  const bool hostOnly = device->kind == core::DeviceFilter::Kind::kHost;
  auto reserved = Store::countersAt(m_dbPath, id, "reserved_bytes", seqs);
  for (size_t k = 0; k < replayed.size(); ++k)
    replayed[k]->set_reserved_bytes(
        !hostOnly && reserved.ok() && (*reserved)[k].has_value() ? *(*reserved)[k] : -1);
  return grpc::Status::OK;
}

namespace {
// What a peak or moment's item says over the wire (a tensor's rule and block too).
void toProto(const core::PeakItem& it, bool tensor, v1::PeakItem* out) {
  out->set_name(it.name);
  out->set_category(static_cast<v1::Category>(static_cast<int>(it.category)));
  out->set_bytes(it.bytes);
  out->set_blocks(it.blocks);
  if (tensor) {
    out->set_rule(std::string(core::ruleName(it.rule)));
    out->set_address(it.address);
  }
}
}  // namespace

grpc::Status QueryService::GetBreakdown(grpc::ServerContext* ctx,
                                        const v1::BreakdownRequest* request,
                                        v1::Breakdown* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetBreakdown", kRead);
      !denied.ok())
    return denied;
  grpc::Status s = breakdown(request, response);
  if (!s.ok() || response->summarized()) return s;  // a summary carries its own reserved
  // What the caching allocator reserved: a device figure, not given for host memory alone.
  const bool hostOnly = deviceOf(request->device())->kind == core::DeviceFilter::Kind::kHost;
  auto reserved = Store::counterAt(m_dbPath, static_cast<int64_t>(request->session_id()),
                                   "reserved_bytes", response->seq());
  response->set_reserved_bytes(!hostOnly && reserved.ok() && reserved->has_value() ? **reserved
                                                                                   : -1);
  return grpc::Status::OK;
}

grpc::Status QueryService::breakdown(const v1::BreakdownRequest* request, v1::Breakdown* response) {
  const auto id = static_cast<int64_t>(request->session_id());
  auto session = Store::getSession(m_dbPath, id);
  if (!session.ok()) return toGrpc(session.status());
  const int64_t startTs = session->header.startTsNs;
  std::optional<core::DeviceFilter> device = deviceOf(request->device());
  if (!device) return badDevice(request->device());
  if (request->at_case() != v1::BreakdownRequest::kTsNs && request->has_step()) {
    // A step a capture schedule summarized: the agent's figures, not a replay of what was sent.
    auto figures =
        Store::loadStepFigures(m_dbPath, id, StepNumbers{request->step(), request->step()});
    if (!figures.ok()) return toGrpc(figures.status());
    if (!figures->empty()) {
      v1::StepSummary summary;
      summary.set_step(request->step());
      fillSummarizedStep(*figures, *device, id, startTs, &summary);
      *response = summary.peak();
      response->set_summarized(true);
      return grpc::Status::OK;
    }
  }
  if (request->at_case() != v1::BreakdownRequest::kTsNs) {
    auto peak = peakReport(id, request->has_step() ? request->step() : -1, *device);
    if (!peak.ok()) return toGrpc(peak.status());
    fillBreakdown(id, peak->state, request->has_step() ? request->step() : -1, peak->phase,
                  peak->scope, true, response);
    response->set_offset_ns(peak->state.tsNs - startTs);
    if (!request->has_step()) {
      // The whole session's peak lies in some step (or between steps).
      auto step = Store::stepAt(m_dbPath, id, peak->state.seq);
      if (step.ok()) response->set_step(*step ? (*step)->step : -1);
    }
    return grpc::Status::OK;
  }
  if (request->items() < 0 || request->items() > kMaxMomentItems)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "items must be 0 to " + std::to_string(kMaxMomentItems));
  auto rec = load(id, *device);
  if (!rec.ok()) return toGrpc(rec.status());
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  const core::LivenessReplay replay(*rec, cats);
  int64_t ts = request->ts_ns();
  // After the last event and before the session ended, memory is as the last event left it.
  if (ts > replay.lastTsNs() && ts <= session->endTsNs) ts = replay.lastTsNs();
  if (ts < replay.firstTsNs() || ts > replay.lastTsNs()) {
    // Said as the user gives it: seconds from the session's start.
    auto offset = [&](int64_t t) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%+.3f s", static_cast<double>(t - startTs) / 1e9);
      return std::string(buf);
    };
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        offset(ts) + " is outside the recording (" + offset(replay.firstTsNs()) +
                            " to " + offset(replay.lastTsNs()) + " from the session's start)");
  }
  const core::MemoryState state = replay.at(ts);
  const core::StepInterval* step = rec->stepAt(state.seq);
  const core::PhaseInterval* phase = rec->phaseAt(state.seq);
  const core::ScopeInterval* scope = rec->scopeAt(state.seq);
  fillBreakdown(id, state, step ? step->step : -1,
                phase ? std::string(core::phaseName(phase->phase)) : std::string(),
                scope ? scope->name : std::string(), false, response);
  response->set_offset_ns(state.tsNs - startTs);
  if (request->items() > 0) {
    core::PeakReport items;
    items.state = state;
    core::fillItems(*rec, cats, items, static_cast<size_t>(request->items()));
    for (const core::PeakItem& it : items.modules) toProto(it, false, response->add_modules());
    for (const core::PeakItem& it : items.tensors) toProto(it, true, response->add_tensors());
  }
  return grpc::Status::OK;
}

grpc::Status QueryService::GetPeak(grpc::ServerContext* ctx, const v1::PeakRequest* request,
                                   v1::Peak* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetPeak", kRead);
      !denied.ok())
    return denied;
  if (request->items() < 0 || request->items() > kMaxMomentItems)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "items must be 0 to " + std::to_string(kMaxMomentItems));
  v1::BreakdownRequest breq;
  breq.set_session_id(request->session_id());
  breq.set_has_step(request->has_step());
  breq.set_step(request->step());
  breq.set_peak(true);
  breq.set_device(request->device());
  if (grpc::Status s = GetBreakdown(ctx, &breq, response->mutable_breakdown()); !s.ok()) return s;
  if (request->has_step()) return grpc::Status::OK;  // items are kept for the session's peak
  const auto id = static_cast<int64_t>(request->session_id());
  const core::DeviceFilter device = *deviceOf(request->device());
  auto peak = peakReport(id, -1, device);
  if (!peak.ok()) return toGrpc(peak.status());
  const size_t wanted =
      request->items() == 0 ? core::kPeakItemsKept : static_cast<size_t>(request->items());
  if (wanted > core::kPeakItemsKept) {
    // More than the analysis keeps: found again at the peak's moment, from the live analysis or
    // a replay of the stored session.
    if (!(device.all() &&
          withLive(id, [&](const core::LiveAnalysis& a) { *peak = a.wholePeak(wanted); }))) {
      auto rec = load(id, device);
      if (!rec.ok()) return toGrpc(rec.status());
      core::PeakReport items;
      items.state = peak->state;
      core::fillItems(*rec, core::categorize(*rec), items, wanted);
      peak->modules = std::move(items.modules);
      peak->ops = std::move(items.ops);
      peak->tensors = std::move(items.tensors);
    }
  }
  auto put = [wanted](const std::vector<core::PeakItem>& items, bool tensor, auto add) {
    for (size_t i = 0; i < items.size() && i < wanted; ++i) toProto(items[i], tensor, add());
  };
  put(peak->modules, false, [&] { return response->add_modules(); });
  put(peak->ops, false, [&] { return response->add_ops(); });
  put(peak->tensors, true, [&] { return response->add_tensors(); });
  return grpc::Status::OK;
}

grpc::Status QueryService::GetTimeline(grpc::ServerContext* ctx, const v1::TimelineRequest* request,
                                       v1::Timeline* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetTimeline", kRead);
      !denied.ok())
    return denied;
  const auto id = static_cast<int64_t>(request->session_id());
  auto session = Store::getSession(m_dbPath, id);
  if (!session.ok()) return toGrpc(session.status());
  const int buckets = request->buckets() == 0 ? 1000 : request->buckets();
  if (buckets < 1 || buckets > 100000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "buckets must be 1 to 100000");
  }
  int64_t from = request->from_ts_ns();
  int64_t to = request->to_ts_ns();
  // The whole session; a live one (no end yet) up to its last event, found below.
  const bool wholeLive = from == 0 && to == 0 && session->endTsNs == 0;
  if (from == 0 && to == 0) {
    from = session->header.startTsNs;
    to = std::max(session->endTsNs, from);
  }
  if (to < from) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the range ends before it starts");
  }
  std::optional<core::DeviceFilter> device = deviceOf(request->device());
  if (!device) return badDevice(request->device());
  auto analyzed = Store::isAnalyzed(m_dbPath, id);
  if (!analyzed.ok()) return toGrpc(analyzed.status());
  std::vector<core::TimelineBucket> result;
  if (*analyzed && device->all()) {
    auto stored = Store::readTimeline(m_dbPath, id, from, to, buckets);
    if (stored.ok()) {
      result = std::move(*stored);
      response->set_precomputed(true);
    } else if (stored.status().code() != absl::StatusCode::kNotFound) {
      return toGrpc(stored.status());
    } else {
      result = core::foldTimeline({}, from, to, buckets);  // nothing recorded in the range
    }
  } else if (device->all() && withLive(id, [&](const core::LiveAnalysis& a) {
               if (wholeLive) to = std::max(from, a.lastTsNs());
               result = a.timeline(from, to, buckets);
             })) {
    // answered by the live analysis
  } else {
    auto rec = load(id, *device);
    if (!rec.ok()) return toGrpc(rec.status());
    const std::vector<core::BlockCategory> cats = core::categorize(*rec);
    const core::LivenessReplay replay(*rec, cats);
    if (wholeLive) to = std::max(from, replay.lastTsNs());
    const core::Timeline timeline = core::buildTimeline(replay);
    const int level = core::chooseLevel(timeline, from, to, buckets);
    result = core::foldTimeline(core::samplesInRange(timeline.levels[level], from, to), from, to,
                                buckets, level, core::finerSamplesOf(timeline));
  }
  response->set_session_id(static_cast<uint64_t>(id));
  response->set_from_ts_ns(from);
  response->set_to_ts_ns(to);
  response->add_series("TOTAL");
  for (core::Category c : core::kAllCategories) {
    response->add_series(std::string(core::categoryName(c)));
  }
  for (const core::TimelineBucket& b : result) {
    v1::TimelineBucket* out = response->add_buckets();
    out->set_start_ts_ns(b.startTsNs);
    out->set_end_ts_ns(b.endTsNs);
    out->set_empty(b.empty);
    for (int i = 0; i < core::kSeriesCount; ++i) {
      out->add_min_bytes(b.min[i]);
      out->add_max_bytes(b.max[i]);
      out->add_last_bytes(b.last[i]);
    }
  }
  return grpc::Status::OK;
}

grpc::Status QueryService::Export(grpc::ServerContext* ctx, const v1::ExportRequest* request,
                                  grpc::ServerWriter<v1::ExportChunk>* writer) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "Export", kRead);
      !denied.ok())
    return denied;
  if (request->format() != "chrome") {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "unknown export format '" + request->format() + "' (known: chrome)");
  }
  const auto id = static_cast<int64_t>(request->session_id());
  auto session = Store::getSession(m_dbPath, id);
  if (!session.ok()) return toGrpc(session.status());
  auto rec = m_loader.load(id);
  if (!rec.ok()) return toGrpc(rec.status());
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  const core::Timeline timeline = core::buildTimeline(core::LivenessReplay(*rec, cats));
  bool ok = true;
  core::writeChromeTrace(*rec, timeline, session->header.startTsNs, session->header.commandLine,
                         [&](std::string_view piece) {
                           if (!ok) return;
                           v1::ExportChunk chunk;
                           chunk.set_data(std::string(piece));
                           ok = writer->Write(chunk);
                         });
  return ok ? grpc::Status::OK : grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
}

grpc::Status QueryService::GetOps(grpc::ServerContext* ctx, const v1::OpsRequest* request,
                                  v1::Ops* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetOps", kRead);
      !denied.ok())
    return denied;
  const auto id = static_cast<int64_t>(request->session_id());
  if (auto s = Store::getSession(m_dbPath, id); !s.ok()) return toGrpc(s.status());
  auto rec = Store::loadRecording(m_dbPath, id, /*withBlocks=*/false);
  if (!rec.ok()) return toGrpc(rec.status());
  response->set_session_id(static_cast<uint64_t>(id));
  for (const core::OpStat& o : core::moduleTimes(*rec)) {
    v1::OpStat* out = response->add_ops();
    out->set_name(o.name);
    out->set_calls(o.calls);
    out->set_total_ns(o.totalNs);
    out->set_self_ns(o.selfNs);
    out->set_is_op(o.isOp);
    out->set_is_kernel(o.isKernel);
    out->set_launched_by(o.launchedBy);
    out->set_gpu_ns(o.gpuNs);
  }
  return grpc::Status::OK;
}

grpc::Status QueryService::GetScopes(grpc::ServerContext* ctx, const v1::ScopesRequest* request,
                                     v1::Scopes* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetScopes", kRead);
      !denied.ok())
    return denied;
  const auto id = static_cast<int64_t>(request->session_id());
  if (auto s = Store::getSession(m_dbPath, id); !s.ok()) return toGrpc(s.status());
  auto rec = Store::loadRecording(m_dbPath, id, /*withBlocks=*/false);
  if (!rec.ok()) return toGrpc(rec.status());
  const bool whole = request->from_ts_ns() == 0 && request->to_ts_ns() == 0;
  const int64_t from = request->from_ts_ns(), to = request->to_ts_ns();
  if (!whole && to < from) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the range ends before it starts");
  }
  const size_t limit = request->limit() > 0 ? static_cast<size_t>(request->limit()) : 5000;
  struct Found {
    const core::ScopeInterval* s;
    v1::ScopeKind kind;
  };
  std::vector<Found> found;
  // Ended, at least min_duration_ns long, and in the range.
  auto shown = [&](const core::Interval& s) {
    return s.endSeq != core::kOpenSeq && s.endTsNs - s.beginTsNs >= request->min_duration_ns() &&
           (whole || (s.endTsNs >= from && s.beginTsNs <= to));
  };
  auto take = [&](const std::vector<core::ScopeInterval>& list, v1::ScopeKind kind) {
    for (const core::ScopeInterval& s : list)
      if (shown(s)) found.push_back({&s, kind});
  };
  take(rec->scopes, v1::SCOPE_KIND_MODULE);
  take(rec->ops, v1::SCOPE_KIND_OP);
  take(rec->kernels, v1::SCOPE_KIND_KERNEL);
  // The longest first: a limited answer keeps what is widest on screen.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.s->endTsNs - a.s->beginTsNs > b.s->endTsNs - b.s->beginTsNs;
  });
  response->set_session_id(static_cast<uint64_t>(id));
  response->set_truncated(found.size() > limit);
  for (size_t i = 0; i < found.size() && i < limit; ++i) {
    v1::ScopeSpan* out = response->add_scopes();
    out->set_name(found[i].s->name);
    out->set_kind(found[i].kind);
    out->set_depth(found[i].s->depth);
    out->set_thread_id(found[i].s->threadId);
    out->set_begin_ts_ns(found[i].s->beginTsNs);
    out->set_end_ts_ns(found[i].s->endTsNs);
  }
  size_t phases = 0;
  for (const core::PhaseInterval& ph : rec->phases) {
    if (!shown(ph)) continue;
    if (++phases > limit) {
      response->set_truncated(true);
      break;
    }
    v1::PhaseSpan* out = response->add_phases();
    out->set_phase(std::string(core::phaseName(ph.phase)));
    out->set_begin_ts_ns(ph.beginTsNs);
    out->set_end_ts_ns(ph.endTsNs);
  }
  return grpc::Status::OK;
}

grpc::Status QueryService::GetDiff(grpc::ServerContext* ctx, const v1::DiffRequest* request,
                                   v1::Diff* response) {
  auto side = [&](uint64_t id, v1::Breakdown* peak, int64_t* steps) -> grpc::Status {
    v1::BreakdownRequest req;
    req.set_session_id(id);
    req.set_peak(true);
    if (grpc::Status s = GetBreakdown(ctx, &req, peak); !s.ok()) return s;
    auto session = Store::getSession(m_dbPath, static_cast<int64_t>(id), true);
    if (!session.ok()) return toGrpc(session.status());
    *steps = session->steps;
    return grpc::Status::OK;
  };
  int64_t stepsA = 0;
  int64_t stepsB = 0;
  if (grpc::Status s = side(request->session_a(), response->mutable_peak_a(), &stepsA); !s.ok()) {
    return s;
  }
  if (grpc::Status s = side(request->session_b(), response->mutable_peak_b(), &stepsB); !s.ok()) {
    return s;
  }
  response->set_steps_a(stepsA);
  response->set_steps_b(stepsB);
  return grpc::Status::OK;
}

namespace {

// The innermost scope of `list` open on `thread` at seq (nullptr: none).
const core::ScopeInterval* innermostOn(const std::vector<core::ScopeInterval>& list,
                                       uint32_t thread, uint64_t seq) {
  const core::ScopeInterval* found = nullptr;
  for (const core::ScopeInterval& s : list)
    if (s.threadId == thread && s.contains(seq) && (!found || s.beginSeq > found->beginSeq))
      found = &s;
  return found;
}

}  // namespace

grpc::Status QueryService::GetBlock(grpc::ServerContext* ctx, const v1::BlockRequest* request,
                                    v1::BlockHistory* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "GetBlock", kRead);
      !denied.ok())
    return denied;
  const auto id = static_cast<int64_t>(request->session_id());
  auto session = Store::getSession(m_dbPath, id);
  if (!session.ok()) return toGrpc(session.status());
  auto rec = m_loader.load(id);
  if (!rec.ok()) return toGrpc(rec.status());
  rec->sortBySeq();
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  auto stacks = Store::loadStacks(m_dbPath, id, request->address());
  if (!stacks.ok()) return toGrpc(stacks.status());
  response->set_session_id(request->session_id());
  for (size_t i = 0; i < rec->blocks.size(); ++i) {
    const core::Block& b = rec->blocks[i];
    if (b.address != request->address()) continue;
    v1::BlockLife* out = response->add_blocks();
    out->set_address(b.address);
    out->set_size_bytes(b.sizeBytes);
    out->set_kind(static_cast<v1::MemoryKind>(static_cast<int>(b.kind)));
    out->set_device(b.device);
    out->set_thread_id(b.threadId);
    out->set_alloc_seq(b.allocSeq);
    out->set_alloc_ts_ns(b.allocTsNs);
    out->set_alloc_offset_ns(b.allocTsNs - session->header.startTsNs);
    out->set_freed(!b.live());
    if (!b.live()) {
      out->set_free_seq(b.freeSeq);
      out->set_free_ts_ns(b.freeTsNs);
    }
    const core::StepInterval* step = rec->stepAt(b.allocSeq);
    out->set_step(step ? step->step : -1);
    if (const core::PhaseInterval* p = rec->phaseAt(b.allocSeq))
      out->set_phase(std::string(core::phaseName(p->phase)));
    if (const auto* m = innermostOn(rec->scopes, b.threadId, b.allocSeq)) out->set_module(m->name);
    if (const auto* o = innermostOn(rec->ops, b.threadId, b.allocSeq)) out->set_op(o->name);
    out->set_category(static_cast<v1::Category>(static_cast<int>(cats[i].category)));
    out->set_rule(std::string(core::ruleName(cats[i].rule)));
    for (const core::Tag& t : rec->tags) {
      if (t.address != b.address || t.seq < b.allocSeq || t.seq >= b.freeSeq) continue;
      v1::BlockTag* tag = out->add_tags();
      tag->set_seq(t.seq);
      tag->set_ts_ns(t.tsNs);
      tag->set_category(static_cast<v1::Category>(static_cast<int>(t.category)));
      tag->set_name(t.name);
    }
    for (const auto& [seq, text] : *stacks) {
      if (seq < b.allocSeq || seq >= b.freeSeq) continue;
      for (absl::string_view line : absl::StrSplit(text, '\n')) out->add_frames(std::string(line));
      break;  // the first: its allocation's
    }
  }
  if (response->blocks_size() == 0)
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("session ", id, " held no block at 0x", absl::Hex(request->address())));
  return grpc::Status::OK;
}

}  // namespace tidemark::server
