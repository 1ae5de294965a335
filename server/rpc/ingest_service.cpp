#include "server/rpc/ingest_service.h"

#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>

#include "server/ingest/session_ingest.h"
#include "server/rpc/grpc_status.h"
#include "tidemark/v1/query.pb.h"

namespace tidemark::server {

namespace {
absl::Status checkHandshake(const v1::Handshake& h, const std::string& db) {
  if (h.magic() != kHandshakeMagic) {
    return absl::FailedPreconditionError("bad handshake magic: not a tidemark agent");
  }
  if (h.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        "protocol version " + std::to_string(h.protocol_version()) +
        " is not supported; this tidemarkd speaks version " + std::to_string(kProtocolVersion));
  }
  if (h.resume_session_id() != 0) {
    auto s = Store::getSession(db, static_cast<int64_t>(h.resume_session_id()));
    if (!s.ok()) return s.status();
    return absl::FailedPreconditionError("resuming session " +
                                         std::to_string(h.resume_session_id()) +
                                         " is not supported by this tidemarkd");
  }
  return absl::OkStatus();
}
// An agent's counter (or a sum of them) as a stored figure: saturated at the int64 limit, so
// that a wrong or hostile value never wraps into a negative figure.
int64_t counterValue(std::initializer_list<uint64_t> values) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t sum = 0;
  for (uint64_t v : values) sum = (v > kMax - sum) ? kMax : sum + v;
  return static_cast<int64_t>(sum);
}
int64_t counterValue(uint64_t value) { return counterValue({value}); }
}  // namespace

grpc::Status IngestService::Stream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) {
  v1::AgentMessage message;
  if (!stream->Read(&message)) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "stream closed before handshake");
  }
  if (!message.has_handshake()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the first message of a stream must be a handshake");
  }
  const v1::Handshake& hello = message.handshake();
  if (auto s = checkHandshake(hello, m_writer.path()); !s.ok()) return toGrpc(s);

  SessionHeader header;
  header.name = hello.session_name();
  header.pid = hello.pid();
  header.hostname = hello.hostname();
  header.commandLine = hello.command_line();
  header.protocolVersion = hello.protocol_version();
  header.agentVersion = hello.agent_version();
  header.startTsNs = hello.start_ts_ns();
  header.startWallNs = hello.start_wall_ns();
  auto sessionId = std::make_shared<int64_t>(0);
  absl::Status created = m_writer
                             .submit([header, sessionId](Store& store) -> absl::Status {
                               auto id = store.createSession(header);
                               if (!id.ok()) return id.status();
                               *sessionId = *id;
                               return absl::OkStatus();
                             })
                             .get();
  if (!created.ok()) return toGrpc(created);

  v1::ServerMessage reply;
  reply.mutable_handshake_reply()->set_session_id(static_cast<uint64_t>(*sessionId));
  reply.mutable_handshake_reply()->set_server_protocol_version(kProtocolVersion);
  stream->Write(reply);
  SessionIngest ingest(*sessionId);
  if (hello.first_batch_seq() != 0) ingest.setFirstBatchSeq(hello.first_batch_seq());
  // Held while a batch goes through `ingest`, so that the advisor can read its open blocks.
  std::mutex ingestMutex;
  // From here on Control may write commands to this stream; the guard unregisters it on every
  // way out, before the stream's status goes back.
  m_agents.add(*sessionId, stream, [&ingest, &ingestMutex] {
    std::lock_guard<std::mutex> lock(ingestMutex);
    return ingest.openBlocks();
  });
  struct Unregister {
    LiveAgents& agents;
    int64_t id;
    ~Unregister() { agents.remove(id); }
  } unregister{m_agents, *sessionId};

  std::optional<v1::Goodbye> goodbye;
  absl::Status error;
  while (stream->Read(&message)) {
    if (message.has_batch()) {
      if (goodbye) {
        error = absl::InvalidArgumentError("batch after goodbye");
        break;
      }
      std::unique_lock<std::mutex> lock(ingestMutex);
      error = ingest.addBatch(message.batch());
      if (!error.ok()) break;
      SessionRows rows = ingest.takeRows();
      lock.unlock();
      if (!rows.empty()) {
        m_writer.post([rows = std::move(rows)](Store& s) { return s.writeRows(rows); });
      }
    } else if (message.has_plan_result()) {
      const v1::PlanResult& r = message.plan_result();
      m_writer.post([sid = *sessionId, r](Store& s) {
        return s.setPlanResult(sid, static_cast<int64_t>(r.plan_id()), r.applied() ? 1 : 2,
                               r.message(), r.step());
      });
    } else if (message.has_goodbye()) {
      goodbye = message.goodbye();
    } else if (message.has_handshake()) {
      error = absl::InvalidArgumentError("second handshake on one stream");
      break;
    } else {
      error = absl::InvalidArgumentError("empty agent message");
      break;
    }
  }

  m_agents.remove(*sessionId);  // no command nor snapshot once the stream winds down
  SessionRows rows = ingest.finish();
  SessionEnd end;
  end.sessionId = *sessionId;
  end.state = (goodbye && error.ok()) ? v1::SESSION_STATE_ENDED : v1::SESSION_STATE_ABORTED;
  end.endTsNs = goodbye ? std::max(goodbye->end_ts_ns(), ingest.lastTsNs()) : ingest.lastTsNs();
  if (goodbye) {
    const v1::AgentCounters& c = goodbye->counters();
    end.eventsSent = counterValue(c.events_sent());
    end.eventsDropped =
        counterValue({c.dropped_ring_full(), c.dropped_no_ring(), c.dropped_table_full(),
                      c.dropped_spool_full(), c.dropped_disconnected(), c.dropped_buffer_full()});
    auto agentStat = [&](const char* name, uint64_t v, const char* what,
                         const char* severity = "data_loss") {
      if (v != 0) end.stats.push_back({name, severity, counterValue(v), what});
    };
    agentStat("agent_dropped_ring_full", c.dropped_ring_full(), "agent: a thread's ring was full");
    agentStat("agent_dropped_no_ring", c.dropped_no_ring(), "agent: no ring left for a thread");
    agentStat("agent_dropped_table_full", c.dropped_table_full(),
              "agent: the block table was full");
    agentStat("agent_dropped_spool_full", c.dropped_spool_full(), "agent: the spool was full");
    agentStat("agent_dropped_disconnected", c.dropped_disconnected(),
              "agent: the stream broke mid-run");
    agentStat("agent_dropped_buffer_full", c.dropped_buffer_full(),
              "agent: its buffer (memory and file) was full while the stream could not take more");
    agentStat("agent_degraded", c.degraded() ? 1 : 0,
              "agent: a thread waited past the deadline for room; full rings dropped from then on");
    agentStat("agent_lossy", c.lossy() ? 1 : 0,
              "agent: lossy mode (TIDEMARK_LOSSY=1): full rings dropped instead of waiting",
              "info");
    agentStat("agent_ring_waits", c.ring_waits(),
              "agent: times a thread waited for room in its full ring (nothing lost)", "info");
    agentStat("agent_buffered_to_disk", c.events_buffered_to_disk(),
              "agent: records that went through its buffer file (the stream was slower)", "info");
  }
  if (!error.ok()) {
    end.stats.push_back({"stream_error", "error", 1, std::string(error.message())});
  }
  end.liveBlocksAtEnd = ingest.liveBlocksAtEnd();
  for (StatRow& s : ingest.stats()) end.stats.push_back(std::move(s));
  absl::Status written = m_writer
                             .submit([rows = std::move(rows), end](Store& s) -> absl::Status {
                               if (auto st = s.writeRows(rows); !st.ok()) return st;
                               return s.endSession(end);
                             })
                             .get();
  if (written.ok() && m_onEnded) m_onEnded(*sessionId);
  if (!error.ok()) return toGrpc(error);
  if (context->IsCancelled()) return grpc::Status::CANCELLED;
  return toGrpc(written);
}

}  // namespace tidemark::server
