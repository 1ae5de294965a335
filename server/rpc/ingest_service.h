#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "server/ingest/cpu_yield.h"
#include "server/rpc/access.h"
#include "server/rpc/agent_instances.h"
#include "server/rpc/handoff_taker.h"
#include "server/rpc/kept_live_analyses.h"
#include "server/rpc/live_agents.h"
#include "server/rpc/resumable_sessions.h"
#include "server/store/writer.h"
#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::server {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kHandshakeMagic = 0x54444D4B;  // "TDMK"
// Ingest streams open at once, at most; past it a stream is refused (RESOURCE_EXHAUSTED) and
// its agent retries later, keeping its events.
inline constexpr int kMaxIngestStreams = 256;

// Ingest: one bidirectional stream per agent. Handshake → session row (or a resumed session
// from its checkpoint); batches → SessionIngest; every few hundred milliseconds the rows
// completed so far and the ingest state are committed in one transaction (a checkpoint) and
// acknowledged to the agent, which forgets what was acknowledged and resends the rest after a
// reconnect. A goodbye ends the session: the rest, live blocks and its end, committed before the
// stream's status goes back (so a finished job's data is queryable at once). A stream that
// breaks without one leaves the session resumable (ResumableSessions).
class IngestService final : public v1::Ingest::Service {
 public:
  // onEnded(sessionId) is called once a session's end is committed.
  // A session belongs to the uid of the agent that opened it; only that uid (or one Access
  // lets see every session) may resume it.
  IngestService(StoreWriter& writer, LiveAgents& agents, const Access& access,
                std::function<void(int64_t)> onEnded, std::chrono::seconds resumeGrace,
                size_t maxPendingRowBytes = kDefaultMaxPendingRowBytes, double yieldFactor = 0);
  // The rows one session may hold before its stream waits for them to be committed (the
  // stream's flow control then holds the agent back, which keeps what it sent): memory bounded
  // whatever the rate. Without it the rows would pile up while the writer commits the last ones.
  static constexpr size_t kDefaultMaxPendingRowBytes = 64u << 20;
  ~IngestService() override;

  // At start: the sessions left live by the previous run wait for their agents.
  absl::Status detachLiveSessions();
  // Stops closing expired sessions (before the writer stops). Idempotent.
  void stop();
  // Where the files agents hand over at exit go (none: a Handoff is refused), and the rest of a
  // run an agent left in its spool when its process has gone (none: closed as aborted).
  void setHandoffTaker(HandoffTaker* taker);
  // Where the jobs whose streams are open on this host are listed (none: not listed).
  void setRecordedJobs(RecordedJobs* jobs) { m_recordedJobs = jobs; }

  grpc::Status Stream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override;
  grpc::Status Handoff(grpc::ServerContext* context, const v1::HandoffRequest* request,
                       v1::HandoffReply* reply) override;

  // A job's own plans (PlanResult with plan id 0), per stream: results past this many, or past
  // this many bytes of documents in all, are not kept, nor a document larger than
  // kMaxJobsOwnPlanBytes.
  static constexpr size_t kMaxJobsOwnPlans = 256;
  static constexpr size_t kMaxJobsOwnPlanBytes = 1u << 20;
  static constexpr size_t kMaxJobsOwnPlanBytesPerStream = 16u << 20;
  // What a stream sent of them so far.
  struct JobsOwnPlans {
    size_t results = 0;        // kept
    size_t bytes = 0;          // of the kept results' documents
    bool refusalSaid = false;  // the daemon's log names the first one not kept, once
  };

 private:
  void closeExpiredSessions();
  // The rest of the run of a detached session whose process has gone, left in a file of this
  // daemon's user (HandoffTaker::leftBehind): taken up as a handed-over file is. False: none.
  bool takeUpLeftBehind(int64_t id);
  // The spools of this user's jobs aimed at this daemon that exited before their first
  // handshake reached it (HandoffTaker::lookAtSpools); every 2 s.
  void lookAtSpools();
  // Whether the agent of `hello` may continue session `sessionId`: a live session of this store,
  // recorded from the same process (agent_identity.h), that the caller may write to; else the
  // status it is refused with.
  grpc::Status mayResume(const v1::Handshake& hello, grpc::ServerContext& context,
                         int64_t sessionId) const;
  // Keeps the result of a plan the job applied itself as a plan of the session (the writer
  // stores it); *sent: what this stream sent of them so far.
  absl::Status keepJobsOwnPlan(int64_t sessionId, const v1::PlanResult& result, JobsOwnPlans* sent);
  // Ends a detached session as aborted from its last checkpoint (open blocks as live).
  absl::Status closeDetached(int64_t id);

  // A live analysis's window: half a session's row share again.
  size_t windowEdges() const {
    return m_maxPendingRowBytes / 2 / core::LiveAnalysis::kBytesPerWindowEdge;
  }

  StoreWriter& m_writer;
  const Access& m_access;
  LiveAgents& m_agents;
  std::function<void(int64_t)> m_onEnded;
  ResumableSessions m_sessions;
  AgentInstances m_instances;  // new sessions by their agent's number (Handshake.agent_instance)
  size_t m_maxPendingRowBytes;
  // While every processor is taken, each stream pauses this many times its work's processor
  // time (CpuYield; 0: never).
  double m_yieldFactor;
  KeptLiveAnalyses m_keptLive;    // of detached sessions, for the streams that resume them
  std::atomic<int> m_streams{0};  // open Ingest streams (each holds one of gRPC's threads)
  std::mutex m_sweepMutex;
  std::condition_variable m_sweepWake;
  bool m_stopping = false;
  std::thread m_sweeper;
  std::atomic<HandoffTaker*> m_handoffs{nullptr};  // (read by the sweeper's thread too)
  RecordedJobs* m_recordedJobs = nullptr;
};

}  // namespace tidemark::server
