#include "server/rpc/ingest_service.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>

#include "google/protobuf/arena.h"
#include "server/ingest/cpu_yield.h"
#include "server/ingest/session_ingest.h"
#include "server/rpc/agent_counters.h"
#include "server/rpc/agent_identity.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/plan_courier.h"
#include "src/base/host_name.h"
#include "tidemark/v1/query.pb.h"

namespace tidemark::server {

namespace {
using Clock = std::chrono::steady_clock;

// A checkpoint is committed at most this often; more rarely when writing its state costs more
// (the interval is kept at ten times that cost, so checkpoints take at most a tenth of the
// handler's time however many blocks are open).
constexpr auto kMinCheckpointInterval = std::chrono::milliseconds(200);

absl::Status checkHandshake(const v1::Handshake& h) {
  if (h.magic() != kHandshakeMagic) {
    return absl::FailedPreconditionError("bad handshake magic: not a tidemark agent");
  }
  if (h.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        "protocol version " + std::to_string(h.protocol_version()) +
        " is not supported; this tidemarkd speaks version " + std::to_string(kProtocolVersion));
  }
  return absl::OkStatus();
}

// A store that cannot be written is the agent's cue to keep its events and retry.
absl::Status storeUnavailable(const absl::Status& s) {
  return absl::UnavailableError("the store cannot be written (" + std::string(s.message()) +
                                "); the agent keeps its events and retries");
}

// What the agent counted, as the session's figures and stats: at its goodbye (final), or as it
// last reported them in a batch, for a session that ends without one (the job killed): then the
// events it sent are not a total to check the store against, and a stat says the figures are
// early.
void addAgentCounters(const v1::AgentCounters& c, bool final, SessionEnd* end) {
  if (final) end->eventsSent = counterValue(c.events_sent());
  end->eventsDropped = agentEventsDropped(c);
  if (!final) {
    end->stats.push_back({"agent_counters_early", "info", 1,
                          "agent: the session ended without its goodbye; its counts (the agent_ "
                          "and adapter_failures stats) are as it reported them with its last "
                          "batch that had them, not at its end"});
  }
  appendAgentCounterStats(c, &end->stats);
}

// A session's ingest as of its last checkpoint in the store (as new when it has none).
// kept: the live analysis the session's previous stream left on this daemon, if any. rebuild:
// when none is taken on, build it again from the store with these options (none: not).
absl::Status restoreFromStore(const std::string& path, int64_t id, SessionIngest* ingest,
                              SessionIngest::KeptLive kept,
                              const LiveRebuild::Options* rebuild = nullptr) {
  auto stored = Store::loadCheckpoint(path, id);
  if (!stored.ok()) return stored.status();
  if (!*stored) return absl::OkStatus();
  v1::IngestCheckpoint state;
  if (!state.ParseFromString((*stored)->state)) return absl::DataLossError("damaged checkpoint");
  if (auto s = ingest->restore(state, (*stored)->openBlocks, std::move(kept)); !s.ok()) return s;
  if (rebuild && !ingest->live())
    ingest->rebuildLive(*rebuild, std::move(state), std::move((*stored)->openBlocks));
  return absl::OkStatus();
}

// Rows and the ingest state of one session, committed together; one in flight at a time, so
// that a failed commit is never followed by a later one (the store stays at a checkpoint).
class Checkpointer {
 public:
  Checkpointer(StoreWriter& writer, int64_t sessionId, uint64_t committedBatchSeq)
      : m_writer(writer),
        m_sessionId(sessionId),
        m_committed(committedBatchSeq),
        m_posted(committedBatchSeq),
        m_acked(committedBatchSeq) {}

  // Takes the result of the commit in flight, if it is done (or waits for it). False while
  // one is still in flight.
  bool collect(bool wait) {
    if (!m_inflight.valid()) return true;
    if (!wait && m_inflight.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return false;
    }
    absl::Status s = m_inflight.get();
    if (s.ok()) {
      m_committed = m_inflightSeq;
      m_committedTicket = m_inflightTicket;
    } else if (m_error.ok()) {
      m_error = s;
    }
    return true;
  }
  // asked: the agent waits for an acknowledgement (its window is full, or it has nothing else
  // to send): a quarter of the interval is enough.
  bool due(uint64_t batchSeq, bool asked) const {
    const auto since = Clock::now() - m_last;
    return batchSeq > m_posted && (since >= m_interval || (asked && since >= m_interval / 4));
  }
  // Posts the rows and state (taken under the caller's lock) accounting for batches up to
  // batchSeq; ticket: the rows' (SessionIngest::rowsTicket).
  void post(SessionRows rows, SessionIngest::Checkpoint checkpoint, uint64_t batchSeq,
            uint64_t ticket, Clock::duration takeCost) {
    const Clock::time_point t0 = Clock::now();
    std::string blob = checkpoint.state.SerializeAsString();
    m_interval =
        std::max<Clock::duration>(kMinCheckpointInterval, (Clock::now() - t0 + takeCost) * 10);
    m_last = Clock::now();
    m_posted = batchSeq;
    m_inflightSeq = batchSeq;
    m_inflightTicket = ticket;
    if (checkpoint.full) {
      m_wroteFull = true;
      m_changesSinceFull = 0;
    } else {
      m_changesSinceFull += checkpoint.opened.size() + checkpoint.closed.size();
    }
    m_inflight = m_writer.submit([rows = std::move(rows), blob = std::move(blob),
                                  full = checkpoint.full, opened = std::move(checkpoint.opened),
                                  closed = std::move(checkpoint.closed), sid = m_sessionId,
                                  batchSeq](Store& s) -> absl::Status {
      if (auto st = s.writeRows(rows); !st.ok()) return st;
      return s.saveCheckpoint(sid, batchSeq, blob, full, opened, closed);
    });
  }
  // Whether the next checkpoint writes every open block: the first one, and whenever the
  // changes written since the last full list outweigh a new one (so the store's share for a
  // session stays within about twice its open blocks, and a restore reads little).
  bool nextFull(size_t openBlocks) const {
    return !m_wroteFull || m_changesSinceFull >= std::max<uint64_t>(openBlocks, 65536);
  }
  // The batch to acknowledge, when there is something new or the agent asked (it always gets
  // an answer, 0 while nothing is committed).
  std::optional<uint64_t> takeAck(bool asked) {
    if (m_committed <= m_acked && !asked) return std::nullopt;
    m_acked = m_committed;
    return m_committed;
  }
  const absl::Status& error() const { return m_error; }
  // The ticket of the rows last committed (0: none yet).
  uint64_t committedTicket() const { return m_committedTicket; }

 private:
  StoreWriter& m_writer;
  int64_t m_sessionId;
  uint64_t m_committed;
  uint64_t m_posted;
  uint64_t m_acked;
  std::future<absl::Status> m_inflight;
  uint64_t m_inflightSeq = 0;
  uint64_t m_inflightTicket = 0;
  uint64_t m_committedTicket = 0;
  bool m_wroteFull = false;
  uint64_t m_changesSinceFull = 0;
  absl::Status m_error;
  Clock::time_point m_last = Clock::now();
  Clock::duration m_interval = kMinCheckpointInterval;
};

// A resumed session's plans that its agent has not answered are sent again on the new stream,
// before Control can reach it (so in the order they were asked for): a plan written to a stream
// that broke right after never reached the agent, or its answer never reached the daemon. The
// agent takes a plan once and answers a repeat with its result again. What cannot be read is
// left to the user's `apply`, which says it had no answer.
void resendUnansweredPlans(const std::string& storePath, int64_t sessionId,
                           grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) {
  absl::StatusOr<std::vector<AppliedPlanRow>> plans = Store::appliedPlans(storePath, sessionId);
  if (!plans.ok()) {
    std::fprintf(stderr, "tidemarkd: session %lld resumed; its unanswered plans not read: %s\n",
                 static_cast<long long>(sessionId), std::string(plans.status().message()).c_str());
    return;
  }
  for (const AppliedPlanRow& plan : *plans) {
    if (plan.state == 0 && !stream->Write(applyPlanCommand(plan.id, plan.planJson))) return;
  }
}
}  // namespace

IngestService::IngestService(StoreWriter& writer, LiveAgents& agents, const Access& access,
                             std::function<void(int64_t)> onEnded, std::chrono::seconds resumeGrace,
                             size_t maxPendingRowBytes, double yieldFactor)
    : m_writer(writer),
      m_access(access),
      m_agents(agents),
      m_onEnded(std::move(onEnded)),
      m_sessions(resumeGrace),
      m_maxPendingRowBytes(maxPendingRowBytes),
      m_yieldFactor(yieldFactor),
      // Two sessions' shares of rows: the windows of several kept analyses at once.
      m_keptLive(2 * maxPendingRowBytes) {
  m_sweeper = std::thread([this] {
    pthread_setname_np(pthread_self(), "td-sweep");
    std::unique_lock<std::mutex> lock(m_sweepMutex);
    for (uint64_t round = 1; !m_stopping; ++round) {
      m_sweepWake.wait_for(lock, std::chrono::milliseconds(500));
      if (m_stopping) break;
      lock.unlock();
      closeExpiredSessions();
      if (round % 4 == 0) lookAtSpools();  // every 2 s
      lock.lock();
    }
  });
}

IngestService::~IngestService() { stop(); }

void IngestService::stop() {
  {
    std::lock_guard<std::mutex> lock(m_sweepMutex);
    m_stopping = true;
  }
  m_sweepWake.notify_all();
  if (m_sweeper.joinable()) m_sweeper.join();
}

absl::Status IngestService::detachLiveSessions() {
  auto live = Store::liveSessions(m_writer.path(), m_writer.daemonName());
  if (!live.ok()) return live.status();
  for (const SessionRecord& r : *live) {
    m_sessions.detachAtStart(r.id, r.header.pid, r.header.hostname);
  }
  return absl::OkStatus();
}

void IngestService::setHandoffTaker(HandoffTaker* taker) {
  if (taker != nullptr) {
    taker->setFileTaken([this](int64_t id) { m_sessions.markHandedOver(id); });
    taker->setFileDone([this](int64_t id) { m_sessions.fileDone(id); });
  }
  m_handoffs = taker;
}

bool IngestService::takeUpLeftBehind(int64_t id) {
  HandoffTaker* taker = m_handoffs.load();
  if (taker == nullptr) return false;
  // The number its first handshake drew made this session — on this daemon, or, a session found
  // live at its start, maybe on the daemon before it, which took that knowledge along (then the
  // handshake's process, pid, host and start, says it: leftBehind checks it).
  const std::optional<HandoffRow> row = taker->leftBehind(id, [&](uint64_t instance) {
    const int64_t made = m_instances.sessionOf(::geteuid(), instance);
    return made == id || (made == 0 && m_sessions.wasLiveAtStart(id));
  });
  if (!row) return false;
  std::fprintf(stderr,
               "tidemarkd: session %lld: its process has exited; taking up the rest of its run "
               "that its agent left in %s\n",
               static_cast<long long>(id), row->path.c_str());
  m_sessions.restTakenUp(id);
  taker->take(*row);
  return true;
}

void IngestService::lookAtSpools() {
  HandoffTaker* taker = m_handoffs.load();
  if (taker == nullptr) return;
  taker->lookAtSpools(
      [this](uint64_t instance) { return m_instances.sessionOf(::geteuid(), instance) != 0; });
}

void IngestService::closeExpiredSessions() {
  for (const ResumableSessions::Expired& expired : m_sessions.takeExpired()) {
    const int64_t id = expired.id;
    if (expired.processGone && takeUpLeftBehind(id)) continue;
    if (!expired.due) {
      m_sessions.keepWaiting(id);
      continue;
    }
    m_keptLive.drop(id);
    const absl::Status s = closeDetached(id);
    if (!s.ok()) {
      std::fprintf(stderr, "tidemarkd: cannot close session %lld: %s\n", static_cast<long long>(id),
                   std::string(s.message()).c_str());
      m_sessions.release(id, true, 0, "");  // tried again after another grace period
      continue;
    }
    m_sessions.release(id, false, 0, "");
    if (m_onEnded) m_onEnded(id);
  }
}

absl::Status IngestService::closeDetached(int64_t id) {
  SessionIngest ingest(id);
  if (auto s = restoreFromStore(m_writer.path(), id, &ingest, {}); !s.ok()) return s;
  SessionRows rows = ingest.finish();
  SessionEnd end;
  end.sessionId = id;
  end.state = v1::SESSION_STATE_ABORTED;
  end.endTsNs = ingest.lastTsNs();
  end.liveBlocksAtEnd = ingest.liveBlocksAtEnd();
  end.stats.push_back({"stream_lost", "data_loss", 1,
                       "the agent's stream broke and the agent did not resume it: what it "
                       "recorded after the last commit is missing"});
  if (ingest.agentCounters()) addAgentCounters(*ingest.agentCounters(), false, &end);
  for (StatRow& s : ingest.stats()) end.stats.push_back(std::move(s));
  return m_writer
      .submit([rows = std::move(rows), end](Store& s) -> absl::Status {
        if (auto st = s.writeRows(rows); !st.ok()) return st;
        return s.endSession(end);
      })
      .get();
}

grpc::Status IngestService::Handoff(grpc::ServerContext* context, const v1::HandoffRequest* request,
                                    v1::HandoffReply* reply) {
  const auto session = static_cast<int64_t>(request->session_id());
  const absl::StatusOr<Caller> caller = m_access.caller(*context, "Handoff", kIngest);
  if (!caller.ok()) return toGrpc(caller.status());
  if (grpc::Status denied = m_access.check(*context, session, "handing over a file", kIngest);
      !denied.ok()) {
    return denied;
  }
  absl::StatusOr<HandoffRow> taken =
      absl::UnavailableError("this tidemarkd takes no handed-over file");
  bool cannotOpen = false;
  HandoffTaker* const handoffs = m_handoffs.load();
  if (handoffs != nullptr && caller->tokenId) {
    taken = absl::PermissionDeniedError(
        "a file is taken only from a caller whose user the kernel vouches for, not on a token's "
        "word");
  } else if (handoffs != nullptr) {
    taken = handoffs->accept(session, caller->uid, request->path(), &cannotOpen);
  }
  if (taken.ok()) {
    // Sent from the file by a stream of the daemon's own, which resumes the session: the agent's
    // stream is ended (what it carried so far is committed), whatever it still had in flight.
    m_sessions.markHandedOver(session);
    handoffs->take(*taken);
  } else {
    std::fprintf(stderr, "tidemarkd: session %lld: a handed-over file was refused: %s\n",
                 static_cast<long long>(session), std::string(taken.status().message()).c_str());
  }
  reply->set_accepted(taken.ok());
  if (!taken.ok()) reply->set_reason(std::string(taken.status().message()));
  reply->set_cannot_open(cannotOpen);
  return grpc::Status::OK;
}

absl::Status IngestService::keepJobsOwnPlan(int64_t sessionId, const v1::PlanResult& result,
                                            JobsOwnPlans* sent) {
  const size_t size = result.plan_json().size();
  if (size == 0) return absl::InvalidArgumentError("a result of no plan");
  if (size > kMaxJobsOwnPlanBytes)
    return absl::InvalidArgumentError("its document is larger than " +
                                      std::to_string(kMaxJobsOwnPlanBytes) + " bytes");
  if (sent->results >= kMaxJobsOwnPlans)
    return absl::ResourceExhaustedError("more than " + std::to_string(kMaxJobsOwnPlans) +
                                        " results of the job's own plans");
  if (sent->bytes + size > kMaxJobsOwnPlanBytesPerStream)
    return absl::ResourceExhaustedError("more than " +
                                        std::to_string(kMaxJobsOwnPlanBytesPerStream) +
                                        " bytes of the job's own plans' documents");
  absl::StatusOr<AppliedPlanRow> row = planRow(sessionId, result.plan_json());
  if (!row.ok()) return row.status();
  if (result.step() < 0) return absl::InvalidArgumentError("a negative first step");
  ++sent->results;
  sent->bytes += size;
  row->state = result.applied() ? 1 : 2;
  row->message = bounded(result.message(), kMaxJobsOwnPlanBytes);
  row->fromStep = result.step();
  m_writer.post([r = *std::move(row)](Store& s) { return s.recordJobsOwnPlan(r); });
  return absl::OkStatus();
}

grpc::Status IngestService::mayResume(const v1::Handshake& hello, grpc::ServerContext& context,
                                      int64_t sessionId) const {
  auto known = Store::getSession(m_writer.path(), sessionId);
  if (!known.ok()) return toGrpc(known.status());
  // Another process's session of the same number (a daemon back on another store): not this
  // agent's to continue; it records the rest as a new session.
  if (absl::Status same = sameAgent(hello, known->header, sessionId); !same.ok()) {
    return toGrpc(same);
  }
  if (grpc::Status denied = m_access.check(context, sessionId, "resuming a session", kIngest);
      !denied.ok()) {
    return denied;
  }
  if (endedWhole(*known)) {
    // Its agent's goodbye came and every event it sent is stored: a spool or an exit that gave
    // up waiting for the answer only repeats what the session holds (ALREADY_EXISTS: nothing to
    // add, no new session to make of it).
    return toGrpc(absl::AlreadyExistsError("session " + std::to_string(sessionId) +
                                           " has ended whole: every event its agent sent is "
                                           "stored"));
  }
  if (known->state != v1::SESSION_STATE_LIVE) {
    return toGrpc(absl::FailedPreconditionError("session " + std::to_string(sessionId) +
                                                " has ended; it cannot be resumed"));
  }
  return grpc::Status::OK;
}

grpc::Status IngestService::Stream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) {
  struct Count {
    std::atomic<int>& n;
    ~Count() { --n; }
  } count{m_streams};
  if (++m_streams > kMaxIngestStreams) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "tidemarkd takes " + std::to_string(kMaxIngestStreams) +
                            " agent streams at once; retry later");
  }
  const absl::StatusOr<Caller> owner = m_access.caller(*context, "Ingest", kIngest);
  if (!owner.ok()) return toGrpc(owner.status());
  v1::AgentMessage first;
  if (!stream->Read(&first)) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "stream closed before handshake");
  }
  if (!first.has_handshake()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the first message of a stream must be a handshake");
  }
  const v1::Handshake hello = first.handshake();
  if (auto s = checkHandshake(hello); !s.ok()) return toGrpc(s);

  int64_t sessionId = 0;
  std::optional<SessionIngest> ingest;
  // A new session's handshake sent again (its answer came too late): the session the first one
  // made goes on, when it is still live and this agent's; else a new one is made, as always.
  int64_t resumeId = static_cast<int64_t>(hello.resume_session_id());
  bool claimedInstance = false;
  bool viaInstance = false;
  if (resumeId == 0 && hello.agent_instance() != 0) {
    const AgentInstances::Found found =
        m_instances.claim(owner->uid, hello.agent_instance(),
                          std::chrono::steady_clock::now() + std::chrono::seconds(30),
                          [context] { return !context->IsCancelled(); });
    claimedInstance = found.claimed;
    if (found.session > 0 && mayResume(hello, *context, found.session).ok()) {
      resumeId = found.session;
      viaInstance = true;
    }
    if (context->IsCancelled()) {
      if (claimedInstance) m_instances.made(owner->uid, hello.agent_instance(), 0);
      return grpc::Status::CANCELLED;
    }
  }
  if (resumeId != 0) {
    sessionId = resumeId;
    if (!viaInstance) {  // (checked already when found by its number)
      if (grpc::Status refused = mayResume(hello, *context, sessionId); !refused.ok()) {
        return refused;
      }
    }
    if (auto s = m_sessions.holdForResume(sessionId, context); !s.ok()) {
      // (The agent did not ask to resume: told to try again, not refused for good.)
      if (viaInstance) return toGrpc(absl::UnavailableError(std::string(s.message())));
      return toGrpc(s);
    }
    ingest.emplace(sessionId, windowEdges());
    // A share of rows again for the rebuild's sort; its log of what comes meanwhile spills.
    LiveRebuild::Options rebuild;
    rebuild.dbPath = m_writer.path();
    rebuild.sessionId = sessionId;
    rebuild.windowEdges = windowEdges();
    rebuild.tempDir = scratchDirFor(m_writer.path());
    rebuild.sortBytes = m_maxPendingRowBytes / 2;
    if (absl::Status restored = restoreFromStore(m_writer.path(), sessionId, &*ingest,
                                                 m_keptLive.take(sessionId), &rebuild);
        !restored.ok()) {
      m_sessions.release(sessionId, true, hello.pid(), hello.hostname());
      return toGrpc(absl::UnavailableError("cannot read the checkpoint of session " +
                                           std::to_string(sessionId) + ": " +
                                           std::string(restored.message())));
    }
    // Its first stream took nothing (the agent sends after the answer it never had): the
    // session starts where this handshake says, as a new one would.
    if (viaInstance) {
      if (hello.first_batch_seq() > ingest->nextBatchSeq())
        ingest->setFirstBatchSeq(hello.first_batch_seq());
      if (hello.first_event_seq() > ingest->nextEventSeq())
        ingest->setFirstEventSeq(hello.first_event_seq());
    }
  } else {
    SessionHeader header;
    header.name = bounded(hello.session_name(), kMaxNameBytes);
    header.pid = hello.pid();
    header.hostname = bounded(hello.hostname(), kMaxNameBytes);
    header.commandLine = bounded(hello.command_line(), kMaxCommandLineBytes);
    header.protocolVersion = hello.protocol_version();
    header.agentVersion = bounded(hello.agent_version(), kMaxNameBytes);
    header.startTsNs = hello.start_ts_ns();
    header.startWallNs = hello.start_wall_ns();
    header.ownerUid = owner->uid;
    std::optional<StatRow> jobRefused;
    if (hello.has_job() && !hello.job().key().empty()) {
      const v1::JobMember& job = hello.job();
      constexpr int32_t kMaxRanks = 1 << 24;
      // A place no launcher gives (a misconfigured job): the session is recorded all the same,
      // as one of its own, and says why it is in no job (the recording is never refused for it).
      if (job.key().size() > kMaxNameBytes || job.rank() < -1 || job.rank() >= kMaxRanks ||
          job.local_rank() < -1 || job.local_rank() >= kMaxRanks || job.world_size() < 0 ||
          job.world_size() > kMaxRanks ||
          (job.world_size() > 0 && job.rank() >= job.world_size())) {
        jobRefused = StatRow{"job_refused", "error", 1,
                             "the training job its agent named was not taken (a key over " +
                                 std::to_string(kMaxNameBytes) +
                                 " bytes, or a rank outside [-1, world size)): recorded as a "
                                 "session of its own"};
      } else {
        header.jobKey = job.key();
        header.rank = job.rank();
        header.localRank = job.local_rank();
        header.worldSize = job.world_size();
      }
    }
    auto created = std::make_shared<int64_t>(0);
    // Urgent: the agent waits for its handshake's answer.
    absl::Status s = m_writer
                         .submit(
                             [header, created, jobRefused](Store& store) -> absl::Status {
                               auto id = store.createSession(header);
                               if (!id.ok()) return id.status();
                               *created = *id;
                               if (jobRefused) return store.addStat(*id, *jobRefused);
                               return absl::OkStatus();
                             },
                             StoreWriter::Priority::kUrgent)
                         .get();
    if (!s.ok()) {
      if (claimedInstance) m_instances.made(owner->uid, hello.agent_instance(), 0);
      return toGrpc(storeUnavailable(s));
    }
    sessionId = *created;
    m_sessions.hold(sessionId, context);
    // Held first: a handshake sent again finds it held and waits for this stream to let go.
    if (hello.agent_instance() != 0)
      m_instances.made(owner->uid, hello.agent_instance(), sessionId);
    // The live analysis's window: half a session's row share again.
    ingest.emplace(sessionId, windowEdges());
    if (hello.first_batch_seq() != 0) ingest->setFirstBatchSeq(hello.first_batch_seq());
    if (hello.first_event_seq() != 0) ingest->setFirstEventSeq(hello.first_event_seq());
  }

  v1::ServerMessage reply;
  reply.mutable_handshake_reply()->set_session_id(static_cast<uint64_t>(sessionId));
  reply.mutable_handshake_reply()->set_server_protocol_version(kProtocolVersion);
  reply.mutable_handshake_reply()->set_next_batch_seq(ingest->nextBatchSeq());
  // A handed-off file is read by client::SpoolReader, which reads RawRecords.
  reply.mutable_handshake_reply()->set_takes_raw_records(true);
  stream->Write(reply);
  if (resumeId != 0) resendUnansweredPlans(m_writer.path(), sessionId, stream);
  // Its mutex is held while a batch goes through `ingest`, so that queries and the advisor can
  // read its open blocks and its live analysis.
  auto guard = std::make_shared<LiveAgents::IngestGuard>();
  guard->ingest = &*ingest;
  guard->postedBatch = ingest->nextBatchSeq() - 1;  // restored from the store, or none
  std::mutex& ingestMutex = guard->mutex;
  // From here on Control may write commands to this stream and queries read its ingest; the
  // guard unregisters it on every way out, before the stream's status goes back (and before the
  // ingest ends: a query that took the guard finds it detached).
  m_agents.add(sessionId, stream, guard);
  struct Unregister {
    LiveAgents& agents;
    int64_t id;
    LiveAgents::Stream* stream;
    LiveAgents::IngestGuard& guard;
    bool ending = false;
    ~Unregister() {
      agents.remove(id, stream);
      guard.closeWrites();  // a command being written ends first; none after
      guard.detach();
      if (ending) agents.endingDone(id);
    }
  } unregister{m_agents, sessionId, stream, *guard};

  Checkpointer checkpoints(m_writer, sessionId, ingest->nextBatchSeq() - 1);
  auto checkpointNow = [&] {
    const Clock::time_point t0 = Clock::now();
    std::unique_lock<std::mutex> lock(ingestMutex);
    SessionRows rows = ingest->takeRows();
    const uint64_t ticket = ingest->rowsTicket();
    SessionIngest::Checkpoint checkpoint =
        ingest->takeCheckpoint(checkpoints.nextFull(ingest->openBlockCount()));
    const uint64_t batch = ingest->nextBatchSeq() - 1;
    lock.unlock();
    checkpoints.post(std::move(rows), std::move(checkpoint), batch, ticket, Clock::now() - t0);
    guard->setPosted(batch);
  };
  // What the last commit carried is in the store: the live analysis lets go of its steps.
  uint64_t releasedTicket = 0;
  auto releaseStored = [&] {
    if (checkpoints.committedTicket() <= releasedTicket) return;
    releasedTicket = checkpoints.committedTicket();
    std::lock_guard<std::mutex> lock(ingestMutex);
    ingest->rowsStored(releasedTicket);
  };

  std::optional<v1::Goodbye> goodbye;
  absl::Status error;
  JobsOwnPlans jobsOwnPlans;  // results of plans the job applied itself, on this stream
  // Each message is parsed into an arena emptied before the next: a batch's thousands of events
  // and their payloads cost a few blocks instead of an allocation and a free each. Nothing read
  // from a message outlives it (the ingest copies what it keeps).
  google::protobuf::ArenaOptions arenaOptions;
  arenaOptions.start_block_size = 64 << 10;
  arenaOptions.max_block_size = 1 << 20;
  google::protobuf::Arena arena(arenaOptions);
  // Pauses for this stream's job only where it runs beside the daemon, on this host, as the
  // caller's own process; listed meanwhile as a job being recorded, for the analysis pass to
  // yield to.
  const pid_t localJob = hello.hostname() == base::hostName()
                             ? ownProcessHere(static_cast<pid_t>(hello.pid()), owner->uid)
                             : 0;
  CpuYield yield(m_yieldFactor, localJob);
  const RecordedJobs::Listing listed(m_recordedJobs, localJob);
  while (true) {
    arena.Reset();
    v1::AgentMessage& message = *google::protobuf::Arena::CreateMessage<v1::AgentMessage>(&arena);
    if (!stream->Read(&message)) break;
    // The rows held past the session's share: read no more until they are on their way.
    bool full = false;
    if (message.has_batch()) {
      if (goodbye) {
        error = absl::InvalidArgumentError("batch after goodbye");
        break;
      }
      std::lock_guard<std::mutex> lock(ingestMutex);
      error = ingest->addBatch(message.batch());
      if (!error.ok()) break;
      full = ingest->pendingRowBytes() >= m_maxPendingRowBytes;
    } else if (message.has_plan_result()) {
      const v1::PlanResult& r = message.plan_result();
      if (r.plan_id() != 0) {
        m_writer.post([sid = sessionId, r](Store& s) {
          return s.setPlanResult(sid, static_cast<int64_t>(r.plan_id()), r.applied() ? 1 : 2,
                                 r.message(), r.step());
        });
      } else if (absl::Status kept = keepJobsOwnPlan(sessionId, r, &jobsOwnPlans);
                 !kept.ok() && !jobsOwnPlans.refusalSaid) {
        // Not the job's to be stopped for: its recording goes on without that plan. Said once
        // a stream, whatever an agent sends.
        jobsOwnPlans.refusalSaid = true;
        std::fprintf(stderr,
                     "tidemarkd: session %lld: a plan the job applied is not kept: %s (further "
                     "ones of this stream not said)\n",
                     static_cast<long long>(sessionId), std::string(kept.message()).c_str());
      }
    } else if (message.has_goodbye()) {
      goodbye = message.goodbye();
    } else if (message.has_ack_request()) {
      // Nothing to do but the commit and acknowledgement below.
    } else if (message.has_handshake()) {
      error = absl::InvalidArgumentError("second handshake on one stream");
      break;
    } else if (message.has_raw_records()) {
      error = absl::InvalidArgumentError(
          "raw records are read from a handed-off file, never taken on a stream");
      break;
    } else {
      error = absl::InvalidArgumentError("empty agent message");
      break;
    }
    if (goodbye) continue;  // the end commits everything at once
    if (full) {
      checkpoints.collect(true);
      if (!checkpoints.error().ok()) break;
      releaseStored();
      checkpointNow();
    } else if (checkpoints.collect(false)) {
      if (!checkpoints.error().ok()) break;
      releaseStored();
      // Due, or a reader (the advisor on a live session) waits for the rows.
      if (checkpoints.due(ingest->nextBatchSeq() - 1, message.has_ack_request()) ||
          guard->commitWanted.load(std::memory_order_relaxed))
        checkpointNow();
    }
    if (const auto acked = checkpoints.takeAck(message.has_ack_request()); acked) {
      v1::ServerMessage ack;
      ack.mutable_ack()->set_batch_seq(*acked);
      LiveAgents::write(*guard, stream, ack);
    }
    // The job wanted the processors this stream's work took: it gets them back for a while
    // (CpuYield; the agent keeps what is not read yet). Not while the agent waits for an
    // acknowledgement (its exit) or a reader for the rows.
    if (!message.has_ack_request() && !guard->commitWanted.load(std::memory_order_relaxed))
      yield.afterWork();
  }

  // No command nor snapshot once the stream winds down; a query waits until what the ingest
  // holds is committed (when this handler returns).
  m_agents.removeEnding(sessionId, stream);
  unregister.ending = true;
  guard->detach();
  checkpoints.collect(true);
  if (!checkpoints.error().ok()) {
    // The store is at the last checkpoint that was committed; the agent resends the rest.
    m_sessions.release(sessionId, true, hello.pid(), hello.hostname());
    return toGrpc(storeUnavailable(checkpoints.error()));
  }
  if (error.ok() && !goodbye) {
    // The stream broke (or the daemon is stopping, or the agent handed the rest over in a file
    // and the HandoffTaker resumes the session): commit what came, wait for the agent.
    checkpointNow();
    checkpoints.collect(true);
    // Committed: the store stands where the live analysis does, which the stream that resumes
    // the session takes on (kept before the release, which lets that stream in).
    if (checkpoints.error().ok()) {
      releaseStored();
      std::unique_lock<std::mutex> lock(ingestMutex);
      SessionIngest::KeptLive kept = ingest->keepLive();
      lock.unlock();
      m_keptLive.keep(sessionId, std::move(kept));
    }
    m_sessions.release(sessionId, true, hello.pid(), hello.hostname());
    if (!checkpoints.error().ok()) return toGrpc(storeUnavailable(checkpoints.error()));
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    return grpc::Status::OK;
  }

  SessionRows rows = ingest->finish();
  // Analysed as it came: stored with its end, no pass to run (when exact; else the pass runs).
  std::optional<core::LiveAnalysis::Final> analysis = ingest->takeLiveFinal();
  if (analysis && !analysis->exact) {
    std::fprintf(stderr, "tidemarkd: session %lld: the analysis pass runs at its end (%s)\n",
                 static_cast<long long>(sessionId), analysis->why.c_str());
    analysis.reset();
  }
  const bool analysedLive = analysis.has_value();
  SessionEnd end;
  end.sessionId = sessionId;
  end.state = error.ok() ? v1::SESSION_STATE_ENDED : v1::SESSION_STATE_ABORTED;
  end.endTsNs = goodbye ? std::max(goodbye->end_ts_ns(), ingest->lastTsNs()) : ingest->lastTsNs();
  if (goodbye) {
    addAgentCounters(goodbye->counters(), true, &end);
  } else if (ingest->agentCounters()) {
    addAgentCounters(*ingest->agentCounters(), false, &end);
  }
  if (!error.ok()) {
    end.stats.push_back({"stream_error", "error", 1, std::string(error.message())});
  }
  end.liveBlocksAtEnd = ingest->liveBlocksAtEnd();
  for (StatRow& s : ingest->stats()) end.stats.push_back(std::move(s));
  absl::Status written =
      m_writer
          .submit([rows = std::move(rows), end,
                   analysis = std::move(analysis)](Store& s) -> absl::Status {
            if (auto st = s.writeRows(rows); !st.ok()) return st;
            if (auto st = s.endSession(end); !st.ok()) return st;
            if (!analysis) return absl::OkStatus();
            return s.finishAnalysis(end.sessionId, analysis->peaks, analysis->stats, {});
          })
          .get();
  if (!written.ok()) {
    // Not ended: the session stays at its last checkpoint, for the agent to resume.
    m_sessions.release(sessionId, true, hello.pid(), hello.hostname());
    return toGrpc(storeUnavailable(written));
  }
  m_sessions.release(sessionId, false, 0, "");
  if (analysedLive) {
    std::fprintf(stderr, "tidemarkd: session %lld analysed as its events came\n",
                 static_cast<long long>(sessionId));
  }
  if (m_onEnded) m_onEnded(sessionId);
  if (!error.ok()) return toGrpc(error);
  if (context->IsCancelled()) return grpc::Status::CANCELLED;
  return grpc::Status::OK;
}

}  // namespace tidemark::server
