#include "server/rpc/query_service.h"

#include "server/rpc/grpc_status.h"
#include "server/store/store.h"
#include "src/core/breakdown.h"
#include "src/core/categorize.h"

namespace tidemark::server {

namespace {
void fillSession(const SessionRecord& r, v1::SessionInfo* out) {
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
  for (const StatRow& s : r.stats) {
    v1::Stat* st = out->add_stats();
    st->set_name(s.name);
    st->set_severity(s.severity);
    st->set_value(s.value);
    st->set_description(s.description);
  }
}
}  // namespace

grpc::Status QueryService::ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                                        v1::ListSessionsResponse* response) {
  auto sessions = Store::listSessions(m_dbPath);
  if (!sessions.ok()) return toGrpc(sessions.status());
  for (const SessionRecord& r : *sessions) fillSession(r, response->add_sessions());
  return grpc::Status::OK;
}

grpc::Status QueryService::GetSession(grpc::ServerContext*, const v1::GetSessionRequest* request,
                                      v1::SessionInfo* response) {
  auto session = Store::getSession(m_dbPath, static_cast<int64_t>(request->session_id()));
  if (!session.ok()) return toGrpc(session.status());
  fillSession(*session, response);
  return grpc::Status::OK;
}

grpc::Status QueryService::GetBreakdown(grpc::ServerContext*, const v1::BreakdownRequest* request,
                                        v1::Breakdown* response) {
  const auto id = static_cast<int64_t>(request->session_id());
  if (auto s = Store::getSession(m_dbPath, id); !s.ok()) return toGrpc(s.status());
  auto rec = Store::loadRecording(m_dbPath, id);
  if (!rec.ok()) return toGrpc(rec.status());
  const std::vector<core::BlockCategory> cats = core::categorize(*rec);
  const core::LivenessReplay replay(*rec, cats);

  uint64_t from = 0;
  uint64_t to = core::kOpenSeq;
  if (request->has_step()) {
    const core::StepInterval* step = rec->findStep(request->step());
    if (step == nullptr) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          "session " + std::to_string(id) + " has no step " +
                              std::to_string(request->step()) + " (it has " +
                              std::to_string(rec->steps.size()) + " steps)");
    }
    from = step->beginSeq;
    to = step->endSeq;
  }
  core::MemoryState state;
  if (request->at_case() == v1::BreakdownRequest::kTsNs) {
    const int64_t ts = request->ts_ns();
    if (ts < replay.firstTsNs() || ts > replay.lastTsNs()) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          "time " + std::to_string(ts) + " is outside the recording [" +
                              std::to_string(replay.firstTsNs()) + ", " +
                              std::to_string(replay.lastTsNs()) + "]");
    }
    state = replay.at(ts);
  } else {
    state = replay.peak(from, to);
    response->set_at_peak(true);
  }

  response->set_session_id(static_cast<uint64_t>(id));
  response->set_ts_ns(state.tsNs);
  response->set_seq(state.seq);
  const core::StepInterval* step = rec->stepAt(state.seq);
  response->set_step(step ? step->step : -1);
  response->set_tracked_bytes(state.trackedBytes);
  for (core::Category c : core::kAllCategories) {
    v1::CategoryBytes* cb = response->add_categories();
    cb->set_category(static_cast<v1::Category>(static_cast<int>(c)));
    cb->set_name(std::string(core::categoryName(c)));
    cb->set_bytes(state.bytes[core::categoryIndex(c)]);
    cb->set_blocks(state.blocks[core::categoryIndex(c)]);
  }
  if (const core::PhaseInterval* p = rec->phaseAt(state.seq)) {
    response->set_phase(std::string(core::phaseName(p->phase)));
  }
  if (const core::ScopeInterval* s = rec->scopeAt(state.seq)) response->set_scope(s->name);
  return grpc::Status::OK;
}

}  // namespace tidemark::server
