// The Ingest and Query services over a real gRPC server on loopback, with a real SQLite file:
// bad clients get a status, and the server keeps serving the others.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include <filesystem>
#include <functional>

#include "client/spool_upload.h"
#include "server/ingest/session_ingest.h"
#include "server/rpc/query_service.h"
#include "server/server.h"
#include "server/store/store.h"
#include "src/advisor/plan_json.h"
#include "src/advisor/planner.h"
#include "src/base/clock.h"
#include "src/base/host_name.h"
#include "src/base/private_dir.h"
#include "tests/support/exited_pid.h"
#include "tests/support/postgres_test_db.h"
#include "tidemark/v1/checkpoint.pb.h"
#include "tidemark/v1/control.grpc.pb.h"
#include "tidemark/v1/ingest.grpc.pb.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::server {
namespace {

// A plan for a chain of two blocks (what the daemon takes for Control.ApplyPlan).
std::string twoBlockPlan() {
  core::ChainProfile profile;
  profile.name = "two";
  profile.staticBytes = 100;
  profile.inputBytes = 10;
  for (const char* name : {"blocks.0", "blocks.1"}) {
    core::Stage st;
    st.name = name;
    st.forwardNs = 5;
    st.backwardNs = 10;
    st.savedBytes = 50;
    st.outputBytes = 20;
    profile.stages.push_back(st);
  }
  return core::planToJson(profile, core::makePlan(profile, 200, core::Strategy::kOptimal));
}

// Control.ApplyPlan of `plan` to `session`; the plan's id in *planId when it is taken.
grpc::Status applyPlan(v1::Control::Stub& control, uint64_t session, const std::string& plan,
                       uint64_t* planId) {
  v1::ApplyPlanRequest req;
  req.set_session_id(session);
  req.set_plan_json(plan);
  v1::ApplyPlanResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = control.ApplyPlan(&ctx, req, &resp);
  *planId = resp.plan_id();
  return st;
}

class IngestRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = std::filesystem::temp_directory_path() /
            ("tidemark-rpc-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(m_dir);
    startServer(std::chrono::seconds(600));
  }
  // A daemon on the test's store (the previous one stopped first, as SIGTERM does);
  // memoryBudget 0: the default.
  void startServer(std::chrono::seconds resumeGrace, int64_t memoryBudget = 0) {
    if (m_server) m_server->shutdown();
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.dbPath = (m_dir / "store.db").string();
    o.resumeGrace = resumeGrace;
    if (memoryBudget > 0) o.memoryBudgetBytes = memoryBudget;
    m_server = std::make_unique<Server>(o);
    ASSERT_TRUE(m_server->start().ok());
    m_channel = grpc::CreateChannel(m_server->address(), grpc::InsecureChannelCredentials());
    m_ingest = v1::Ingest::NewStub(m_channel);
    m_query = v1::Query::NewStub(m_channel);
  }
  void TearDown() override {
    m_server->shutdown();
    std::filesystem::remove_all(m_dir);
  }

  static v1::AgentMessage hello(uint32_t version = 1) {
    v1::AgentMessage m;
    auto* h = m.mutable_handshake();
    h->set_magic(kHandshakeMagic);
    h->set_protocol_version(version);
    h->set_pid(4242);
    h->set_command_line("test");
    return m;
  }

  static v1::AgentMessage event(uint64_t batchSeq, uint64_t seq, bool alloc, uint64_t address) {
    v1::AgentMessage m;
    auto* b = m.mutable_batch();
    b->set_batch_seq(batchSeq);
    auto* e = b->add_events();
    e->set_seq(seq);
    e->set_ts_ns(static_cast<int64_t>(seq) * 100);
    if (alloc) {
      e->mutable_alloc()->set_address(address);
      e->mutable_alloc()->set_size_bytes(4096);
    } else {
      e->mutable_free()->set_address(address);
    }
    return m;
  }

  // Writes messages, then asks for acknowledgements until batch `through` is acknowledged
  // (false after ten seconds without).
  static bool sendAndAwaitAck(grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>* s,
                              const std::vector<v1::AgentMessage>& messages, uint64_t through) {
    for (const auto& m : messages) {
      if (!s->Write(m)) return false;
    }
    v1::AgentMessage ask;
    ask.mutable_ack_request();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    v1::ServerMessage reply;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!s->Write(ask) || !s->Read(&reply)) return false;
      if (reply.has_ack() && reply.ack().batch_seq() >= through) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  using AgentStream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>;
  // Writes the handshake of process `pid` (resuming `resume` when not 0); returns the reply.
  static v1::HandshakeReply handshake(AgentStream* s, uint64_t resume = 0, int32_t pid = 4242) {
    v1::AgentMessage m = hello();
    m.mutable_handshake()->set_resume_session_id(resume);
    m.mutable_handshake()->set_pid(pid);
    v1::ServerMessage reply;
    EXPECT_TRUE(s->Write(m));
    EXPECT_TRUE(s->Read(&reply));
    return reply.handshake_reply();
  }
  // Ends an agent's stream from its side: no more writes, the server's messages drained.
  static grpc::Status closeStream(AgentStream* s) {
    s->WritesDone();
    v1::ServerMessage ignored;
    while (s->Read(&ignored)) {
    }
    return s->Finish();
  }
  static bool hasStat(const v1::SessionInfo& info, const std::string& name) {
    for (const auto& st : info.stats()) {
      if (st.name() == name) return true;
    }
    return false;
  }

  static v1::AgentMessage goodBatch(uint64_t batchSeq, uint64_t firstSeq) {
    v1::AgentMessage m;
    auto* b = m.mutable_batch();
    b->set_batch_seq(batchSeq);
    auto* a = b->add_events();
    a->set_seq(firstSeq);
    a->set_ts_ns(100);
    a->mutable_alloc()->set_address(0x1000);
    a->mutable_alloc()->set_size_bytes(64);
    auto* f = b->add_events();
    f->set_seq(firstSeq + 1);
    f->set_ts_ns(200);
    f->mutable_free()->set_address(0x1000);
    return m;
  }

  // Sends messages on one stream; returns the final status and the session id (0 if none).
  grpc::Status send(const std::vector<v1::AgentMessage>& messages, uint64_t* session = nullptr) {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    for (const auto& m : messages) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    v1::ServerMessage reply;
    while (stream->Read(&reply)) {
      if (reply.has_handshake_reply() && session) *session = reply.handshake_reply().session_id();
    }
    return stream->Finish();
  }

  grpc::Status wholePeak(uint64_t session, v1::Peak* out) {
    grpc::ClientContext c;
    v1::PeakRequest req;
    req.set_session_id(session);
    return m_query->GetPeak(&c, req, out);
  }
  grpc::Status stepsOf(uint64_t session, v1::Steps* out) {
    grpc::ClientContext c;
    v1::StepsRequest req;
    req.set_session_id(session);
    return m_query->GetSteps(&c, req, out);
  }
  grpc::Status sessionInfo(uint64_t session, v1::SessionInfo* info) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(session);
    return m_query->GetSession(&ctx, req, info);
  }
  // The session once it has ended (a handed-over file is stored after its stream), or as it is
  // after 20 s.
  v1::SessionInfo awaitEnded(uint64_t session) {
    v1::SessionInfo info;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && sessionInfo(session, &info).ok() &&
           info.state() != v1::SESSION_STATE_ENDED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return info;
  }
  // A session whose first batch is committed, left live by a daemon stopped under its stream
  // (SIGTERM); 0 if that went wrong. The daemon is not started again. pid: its process's.
  uint64_t sessionLeftLiveByAStoppedDaemon(int32_t pid = 4242) {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    const uint64_t session = handshake(stream.get(), 0, pid).session_id();
    const bool acked = sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1);
    m_server->shutdown();
    ctx.TryCancel();
    stream->Finish();
    return acked ? session : 0;
  }
  // The row a daemon keeps for a file it accepted (taken up at its next start), written into the
  // store while no daemon runs on it.
  void recordHandoff(uint64_t session, const std::filesystem::path& file) {
    struct stat st {};
    ASSERT_EQ(::stat(file.c_str(), &st), 0);
    auto store = Store::open((m_dir / "store.db").string(), 1 << 20);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)
                    ->addHandoff({static_cast<int64_t>(session), file.string(),
                                  static_cast<int64_t>(::geteuid()),
                                  static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino)})
                    .ok());
  }
  // Whether a file is gone within `tries` × 20 ms (the daemon removes a handed-over file once
  // stored).
  static bool awaitRemoved(const std::filesystem::path& file, int tries = 100) {
    for (int i = 0; i < tries && std::filesystem::exists(file); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return !std::filesystem::exists(file);
  }

  // How many sessions the daemon lists.
  int sessionCount() {
    v1::ListSessionsResponse list;
    grpc::ClientContext ctx;
    EXPECT_TRUE(m_query->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
    return list.sessions_size();
  }

  // A complete, well-behaved session still works: the server kept serving.
  void expectHealthy() {
    v1::AgentMessage bye;
    bye.mutable_goodbye()->mutable_counters()->set_events_sent(2);
    uint64_t session = 0;
    ASSERT_TRUE(send({hello(), goodBatch(1, 1), bye}, &session).ok());
    v1::SessionInfo info;
    ASSERT_TRUE(sessionInfo(session, &info).ok());
    EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
    EXPECT_EQ(info.events_stored(), 2u);
    EXPECT_EQ(info.blocks(), 1u);
  }

  std::filesystem::path m_dir;
  std::unique_ptr<Server> m_server;
  std::shared_ptr<grpc::Channel> m_channel;
  std::unique_ptr<v1::Ingest::Stub> m_ingest;
  std::unique_ptr<v1::Query::Stub> m_query;
};

TEST_F(IngestRpcTest, AWellBehavedSessionIsStored) { expectHealthy(); }

TEST_F(IngestRpcTest, WrongProtocolVersionIsRefused) {
  const grpc::Status s = send({hello(99)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("protocol version 99"), std::string::npos);
  expectHealthy();
}

TEST_F(IngestRpcTest, BatchBeforeHandshakeIsRefused) {
  EXPECT_EQ(send({goodBatch(1, 1)}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  expectHealthy();
}

TEST_F(IngestRpcTest, MalformedBatchEndsTheStreamAndKeepsWhatCameBefore) {
  v1::AgentMessage bad = goodBatch(2, 3);
  bad.mutable_batch()->add_events()->set_seq(9);  // no payload
  uint64_t session = 0;
  const grpc::Status s = send({hello(), goodBatch(1, 1), bad}, &session);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(info.blocks(), 1u);
  bool sawError = false;
  for (const auto& st : info.stats()) sawError |= st.name() == "stream_error";
  EXPECT_TRUE(sawError);
  expectHealthy();
}

// Raw records are a handed-off file's (read and encoded by client::SpoolReader), never a
// stream's: one that comes on a stream ends it, keeping what came before.
TEST_F(IngestRpcTest, RawRecordsOnAStreamAreRefused) {
  v1::AgentMessage raw;
  raw.mutable_raw_records()->set_first_batch_seq(2);
  raw.mutable_raw_records()->set_layout(1);
  raw.mutable_raw_records()->set_records(std::string(48, '\0'));
  uint64_t session = 0;
  const grpc::Status s = send({hello(), goodBatch(1, 1), raw}, &session);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("handed-off file"), std::string::npos) << s.error_message();
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.blocks(), 1u);
  expectHealthy();
}

TEST_F(IngestRpcTest, BytesThatAreNotAMessageGetAnErrorStatus) {
  grpc::GenericStub generic(m_channel);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, "/tidemark.v1.Ingest/Stream", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  const char junk[] = "\xff\xff\xff\xff\x0f garbage that is not protobuf";
  grpc::Slice slice(junk, sizeof junk);
  grpc::ByteBuffer buffer(&slice, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  while (cq.Next(&tag, &ok)) {
    if (tag == reinterpret_cast<void*>(4)) break;
  }
  EXPECT_FALSE(status.ok());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  expectHealthy();
}

TEST_F(IngestRpcTest, ResumeOfAnUnknownSessionIsNotFound) {
  v1::AgentMessage m = hello();
  m.mutable_handshake()->set_resume_session_id(777);
  EXPECT_EQ(send({m}).error_code(), grpc::StatusCode::NOT_FOUND);
  expectHealthy();
}

// A handshake whose answer reached the agent too late (a loaded daemon slow to make the session):
// the agent ends that stream and sends its handshake again, with the number it drew for the
// session (agent_instance). It continues the session the first one made — one session per job,
// not an empty aborted one beside it. Once that session has ended, the number makes a new one;
// another number is another session.
TEST_F(IngestRpcTest, AHandshakeSentAgainContinuesTheSessionItsFirstMade) {
  auto helloOf = [](uint64_t instance) {
    v1::AgentMessage m = hello();
    m.mutable_handshake()->set_agent_instance(instance);
    return m;
  };
  auto sessionCount = [&] {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse all;
    EXPECT_TRUE(m_query->ListSessions(&ctx, v1::ListSessionsRequest(), &all).ok());
    return all.sessions_size();
  };
  uint64_t first = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    v1::ServerMessage reply;
    ASSERT_TRUE(stream->Write(helloOf(0xC0FFEE)));
    ASSERT_TRUE(stream->Read(&reply));  // the answer the agent did not wait for
    first = reply.handshake_reply().session_id();
    ctx.TryCancel();
    stream->Finish();
  }
  ASSERT_NE(first, 0u);
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Write(helloOf(0xC0FFEE)));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.handshake_reply().session_id(), first);
  EXPECT_EQ(reply.handshake_reply().next_batch_seq(), 1u);
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(2);
  ASSERT_TRUE(stream->Write(goodBatch(1, 1)));
  ASSERT_TRUE(stream->Write(bye));
  ASSERT_TRUE(closeStream(stream.get()).ok());
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(first, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 2u);
  EXPECT_EQ(sessionCount(), 1);
  // Ended: the same number again makes a session of its own, and so does another number.
  uint64_t again = 0;
  uint64_t other = 0;
  ASSERT_TRUE(send({helloOf(0xC0FFEE), goodBatch(1, 1), bye}, &again).ok());
  ASSERT_TRUE(send({helloOf(0xBEEF), goodBatch(1, 1), bye}, &other).ok());
  EXPECT_NE(again, first);
  EXPECT_NE(other, first);
  EXPECT_NE(other, again);
  EXPECT_EQ(sessionCount(), 3);
  expectHealthy();
}

// Session numbers are a store's own: an agent back on a daemon of another store may name a live
// session there that another process records. It is not that agent's: NOT_FOUND (it records
// the rest as a new session), and the other process's stream and session go on untouched, while
// it streams and once its stream broke. The pid, the host and the start's clocks say whose.
TEST_F(IngestRpcTest, AResumeByAnotherProcessIsNotFoundAndTheSessionGoesOn) {
  auto strangerResumes = [&](uint64_t session, const std::function<void(v1::Handshake*)>& as) {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    v1::AgentMessage m = hello();
    m.mutable_handshake()->set_resume_session_id(session);
    as(m.mutable_handshake());
    EXPECT_TRUE(stream->Write(m));
    v1::ServerMessage reply;
    EXPECT_FALSE(stream->Read(&reply)) << m.DebugString();
    return stream->Finish().error_code();
  };
  const std::vector<std::function<void(v1::Handshake*)>> strangers = {
      [](v1::Handshake* h) { h->set_pid(4343); },
      [](v1::Handshake* h) { h->set_hostname("another-host"); },
      [](v1::Handshake* h) { h->set_start_ts_ns(99); },
      [](v1::Handshake* h) { h->set_start_wall_ns(99); }};
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const uint64_t session = handshake(stream.get()).session_id();
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
  for (const auto& stranger : strangers) {
    EXPECT_EQ(strangerResumes(session, stranger), grpc::StatusCode::NOT_FOUND);
  }
  // Its own stream was not ended for them.
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(2, 2, true, 0x2000)}, 2));
  ctx.TryCancel();
  stream->Finish();
  for (const auto& stranger : strangers) {
    EXPECT_EQ(strangerResumes(session, stranger), grpc::StatusCode::NOT_FOUND);
  }
  // Its own agent resumes it and ends it, every event its own.
  grpc::ClientContext again;
  auto resumed = m_ingest->Stream(&again);
  EXPECT_EQ(handshake(resumed.get(), session).session_id(), session);
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(3);
  ASSERT_TRUE(resumed->Write(event(3, 3, false, 0x1000)));
  ASSERT_TRUE(resumed->Write(bye));
  ASSERT_TRUE(closeStream(resumed.get()).ok());
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_EQ(info.live_blocks_at_end(), 1u);
  EXPECT_FALSE(hasStat(info, "seq_gap"));
  expectHealthy();
}

TEST_F(IngestRpcTest, QueriesOfAnUnknownSessionAreNotFound) {
  grpc::ClientContext ctx;
  v1::BreakdownRequest req;
  req.set_session_id(12345);
  v1::Breakdown b;
  EXPECT_EQ(m_query->GetBreakdown(&ctx, req, &b).error_code(), grpc::StatusCode::NOT_FOUND);
  expectHealthy();
}

TEST_F(IngestRpcTest, BreakdownOfAStepThatDoesNotExistIsOutOfRange) {
  expectHealthy();
  grpc::ClientContext ctx;
  v1::BreakdownRequest req;
  req.set_session_id(1);
  req.set_has_step(true);
  req.set_step(5);
  v1::Breakdown b;
  EXPECT_EQ(m_query->GetBreakdown(&ctx, req, &b).error_code(), grpc::StatusCode::OUT_OF_RANGE);
}

// What holds memory at a moment (the GUI's icicle and inspector): the live block as a tensor and
// under its module, when asked; a count past the limit is refused, the daemon serving on.
TEST_F(IngestRpcTest, AMomentListsItsModulesAndTensorsWhenAsked) {
  expectHealthy();  // session 1: a 64-byte block from ts 100 to 200
  auto at = [&](int items, v1::Breakdown* b) {
    grpc::ClientContext ctx;
    v1::BreakdownRequest req;
    req.set_session_id(1);
    req.set_ts_ns(150);
    req.set_items(items);
    return m_query->GetBreakdown(&ctx, req, b);
  };
  v1::Breakdown b;
  ASSERT_TRUE(at(5, &b).ok());
  EXPECT_EQ(b.tracked_bytes(), 64);
  ASSERT_EQ(b.tensors_size(), 1);
  EXPECT_EQ(b.tensors(0).bytes(), 64);
  EXPECT_EQ(b.tensors(0).address(), 0x1000u);
  ASSERT_EQ(b.modules_size(), 1);
  EXPECT_EQ(b.modules(0).bytes(), 64);
  v1::Breakdown plain;
  ASSERT_TRUE(at(0, &plain).ok());
  EXPECT_EQ(plain.tensors_size() + plain.modules_size(), 0);
  EXPECT_EQ(at(QueryService::kMaxMomentItems + 1, &b).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(at(-1, &b).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  expectHealthy();
}

// The peak's largest tensors: the 20 the analysis keeps, or as many as asked (found again at the
// peak's moment), largest first; a count past the limit is refused, the daemon serving on.
TEST_F(IngestRpcTest, ThePeakListsAsManyTensorsAsAsked) {
  // 30 blocks of sizes 4096 + 64·i live together, then freed: the peak holds all 30.
  v1::AgentMessage batch;
  batch.mutable_batch()->set_batch_seq(1);
  uint64_t seq = 0;
  for (bool alloc : {true, false}) {
    for (uint64_t i = 0; i < 30; ++i) {
      auto* e = batch.mutable_batch()->add_events();
      e->set_seq(++seq);
      e->set_ts_ns(static_cast<int64_t>(seq) * 100);
      if (alloc) {
        e->mutable_alloc()->set_address(0x10000 + i * 0x10000);
        e->mutable_alloc()->set_size_bytes(4096 + 64 * i);
      } else {
        e->mutable_free()->set_address(0x10000 + i * 0x10000);
      }
    }
  }
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(seq);
  uint64_t session = 0;
  ASSERT_TRUE(send({hello(), batch, bye}, &session).ok());
  ASSERT_EQ(awaitEnded(session).state(), v1::SESSION_STATE_ENDED);
  auto peakWith = [&](int items, v1::Peak* p) {
    grpc::ClientContext ctx;
    v1::PeakRequest req;
    req.set_session_id(session);
    req.set_items(items);
    return m_query->GetPeak(&ctx, req, p);
  };
  v1::Peak kept, ten, all;
  ASSERT_TRUE(peakWith(0, &kept).ok());
  EXPECT_EQ(kept.tensors_size(), 20);
  ASSERT_TRUE(peakWith(10, &ten).ok());
  EXPECT_EQ(ten.tensors_size(), 10);
  ASSERT_TRUE(peakWith(25, &all).ok());
  ASSERT_EQ(all.tensors_size(), 25);
  EXPECT_EQ(all.breakdown().tracked_bytes(), kept.breakdown().tracked_bytes());
  for (int i = 0; i < 25; ++i) {
    EXPECT_EQ(all.tensors(i).bytes(), 4096 + 64 * (29 - i)) << i;  // largest first
    if (i < 20) {
      EXPECT_EQ(all.tensors(i).address(), kept.tensors(i).address()) << i;
    }
  }
  // A live session: from its live analysis.
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    session = handshake(stream.get()).session_id();
    v1::AgentMessage allocs = batch;
    allocs.mutable_batch()->mutable_events()->DeleteSubrange(30, 30);  // never freed
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), {allocs}, 1));
    v1::SessionInfo info;
    ASSERT_TRUE(sessionInfo(session, &info).ok());
    ASSERT_EQ(info.state(), v1::SESSION_STATE_LIVE);  // answered by its live analysis
    v1::Peak live;
    ASSERT_TRUE(peakWith(25, &live).ok());
    ASSERT_EQ(live.tensors_size(), 25);
    EXPECT_EQ(live.tensors(0).bytes(), 4096 + 64 * 29);
    EXPECT_EQ(live.tensors(24).bytes(), 4096 + 64 * 5);
    EXPECT_TRUE(closeStream(stream.get()).ok());
  }
  v1::Peak refused;
  EXPECT_EQ(peakWith(QueryService::kMaxMomentItems + 1, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(peakWith(-1, &refused).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  expectHealthy();
}

TEST_F(IngestRpcTest, CountersAndSizesPastTheLimitsNeverBecomeNegativeFigures) {
  // A size of 2^64-1 ends the stream with INVALID_ARGUMENT; what came before is kept.
  v1::AgentMessage huge = goodBatch(2, 3);
  huge.mutable_batch()->mutable_events(0)->mutable_alloc()->set_size_bytes(~0ull);
  uint64_t session = 0;
  grpc::Status s = send({hello(), goodBatch(1, 1), huge}, &session);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("over the limit"), std::string::npos);
  // Counters of 2^64-1 saturate: no figure wraps below zero.
  v1::AgentMessage bye;
  auto* c = bye.mutable_goodbye()->mutable_counters();
  c->set_events_sent(~0ull);
  c->set_dropped_ring_full(~0ull);
  c->set_dropped_spool_full(~0ull);
  ASSERT_TRUE(send({hello(), goodBatch(1, 1), bye}, &session).ok());
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.events_sent(), static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(info.events_dropped(), static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  expectHealthy();
}

TEST_F(IngestRpcTest, ASessionResumesOnADaemonRestartedOnTheSameStore) {
  uint64_t session = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    const v1::HandshakeReply reply = handshake(stream.get());
    session = reply.session_id();
    EXPECT_EQ(reply.next_batch_seq(), 1u);
    // Two blocks allocated, acknowledged (committed), then one more batch that is not.
    ASSERT_TRUE(
        sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000), event(2, 2, true, 0x2000)}, 2));
    ASSERT_TRUE(stream->Write(event(3, 3, false, 0x1000)));
    // The daemon stops under the stream (SIGTERM) and starts again on the same store.
    startServer(std::chrono::seconds(600));
    ctx.TryCancel();
    stream->Finish();
  }
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_LIVE);  // waiting for its agent

  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const v1::HandshakeReply resumed = handshake(stream.get(), session);
  EXPECT_EQ(resumed.session_id(), session);
  // Batch 3 reached the first daemon before it stopped: it committed it, or asks for it again.
  const uint64_t next = resumed.next_batch_seq();
  ASSERT_TRUE(next == 3 || next == 4) << next;
  // The agent resends from where it was told, and one batch more that was stored (skipped).
  std::vector<v1::AgentMessage> rest;
  if (next == 3) rest.push_back(event(3, 3, false, 0x1000));
  rest.push_back(event(2, 2, true, 0x2000));
  rest.push_back(event(4, 4, true, 0x3000));
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(4);
  rest.push_back(bye);
  for (const auto& m : rest) ASSERT_TRUE(stream->Write(m));
  stream->WritesDone();
  v1::ServerMessage reply;
  while (stream->Read(&reply)) {
  }
  ASSERT_TRUE(stream->Finish().ok());

  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_received(), 4u);
  EXPECT_EQ(info.events_stored(), 4u);
  EXPECT_EQ(info.blocks(), 3u);
  EXPECT_EQ(info.live_blocks_at_end(), 2u);
  EXPECT_FALSE(hasStat(info, "seq_gap"));
  expectHealthy();
}

// A stream that breaks while its daemon runs on (the network, an agent's acknowledgement
// timeout, a file handed over at exit) leaves the session's live analysis kept for the stream
// that resumes it: the session goes on answering as it grows and is stored analysed with its
// end. Its recording (200,001 blocks) is past what the smallest budget lets a query load whole
// (167,772 blocks), so without the live analysis every query of the resumed session is refused.
TEST_F(IngestRpcTest, ASessionResumedOnTheSameDaemonKeepsItsLiveAnalysis) {
  startServer(std::chrono::seconds(600), kMinMemoryBudgetBytes);
  uint64_t seq = 0;
  uint64_t batchSeq = 0;
  std::vector<v1::AgentMessage> batches;
  auto add = [&]() {
    if (batches.empty() || batches.back().batch().events_size() >= 10000) {
      batches.emplace_back().mutable_batch()->set_batch_seq(++batchSeq);
    }
    v1::Event* e = batches.back().mutable_batch()->add_events();
    e->set_seq(++seq);
    e->set_ts_ns(static_cast<int64_t>(seq) * 1000);
    return e;
  };
  auto alloc = [&](uint64_t address, uint64_t size) {
    v1::Event* e = add();
    e->mutable_alloc()->set_address(address);
    e->mutable_alloc()->set_size_bytes(size);
  };
  auto step = [&](int64_t n, int churn, uint64_t bigSize) {
    add()->mutable_step_begin()->set_step(n);
    if (bigSize > 0) alloc(0x20000000, bigSize);
    for (int i = 0; i < churn; ++i) {
      alloc(0x1000, 64);
      add()->mutable_free()->set_address(0x1000);
    }
    if (bigSize > 0) add()->mutable_free()->set_address(0x20000000);
    add()->mutable_step_end()->set_step(n);
  };
  constexpr uint64_t kWeights = 1 << 20;
  uint64_t session = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    session = handshake(stream.get()).session_id();
    alloc(0x10000000, kWeights);  // held to the end
    step(1, 100000, 0);
    step(2, 100000, 0);
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), batches, batchSeq));
    v1::Peak peak;
    const grpc::Status st = wholePeak(session, &peak);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(peak.breakdown().tracked_bytes(), static_cast<int64_t>(kWeights + 64));
    // The stream breaks; the daemon runs on.
    ctx.TryCancel();
    stream->Finish();
  }
  batches.clear();
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  ASSERT_EQ(handshake(stream.get(), session).next_batch_seq(), batchSeq + 1);
  step(3, 10, 2 * kWeights);
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), batches, batchSeq));
  v1::Peak peak;
  grpc::Status st = wholePeak(session, &peak);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(peak.breakdown().tracked_bytes(), static_cast<int64_t>(3 * kWeights + 64));
  EXPECT_EQ(peak.breakdown().step(), 3);
  {
    v1::Steps steps;
    st = stepsOf(session, &steps);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(steps.steps_size(), 3);
    EXPECT_EQ(steps.steps(0).peak().tracked_bytes(), static_cast<int64_t>(kWeights + 64));
    EXPECT_EQ(steps.steps(2).peak().tracked_bytes(), static_cast<int64_t>(3 * kWeights + 64));
  }
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(seq);
  ASSERT_TRUE(stream->Write(bye));
  ASSERT_TRUE(closeStream(stream.get()).ok());
  // Analysed as it came, on both streams: stored analysed with its end, no pass to wait for.
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_TRUE(info.analyzed());
  EXPECT_EQ(info.blocks(), 200012u);
  st = wholePeak(session, &peak);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(peak.breakdown().tracked_bytes(), static_cast<int64_t>(3 * kWeights + 64));
}

// After a restart of the daemon the live analysis is gone with the old process: the daemon
// builds it again from the store (every event before the checkpoint the session resumed from, in
// sequence order, on a thread of its own) while the agent goes on sending, then takes it on. The
// session (180,015 blocks, past what the smallest budget loads whole for a query) answers its
// peak and steps again, each step as the stored analysis has it once the session has ended; a
// step, a forward phase, a module scope and a block were open at the restart.
TEST_F(IngestRpcTest, ASessionResumedAfterARestartHasItsLiveAnalysisBuiltAgain) {
  startServer(std::chrono::seconds(600), kMinMemoryBudgetBytes);
  uint64_t seq = 0;
  uint64_t batchSeq = 0;
  std::vector<v1::AgentMessage> batches;
  auto newBatch = [&] { batches.emplace_back().mutable_batch()->set_batch_seq(++batchSeq); };
  auto add = [&]() {
    if (batches.empty() || batches.back().batch().events_size() >= 10000) newBatch();
    v1::Event* e = batches.back().mutable_batch()->add_events();
    e->set_seq(++seq);
    e->set_ts_ns(static_cast<int64_t>(seq) * 1000);
    e->set_thread_id(7);
    return e;
  };
  auto alloc = [&](uint64_t address, uint64_t size) {
    v1::Event* e = add();
    e->mutable_alloc()->set_address(address);
    e->mutable_alloc()->set_size_bytes(size);
  };
  auto freeOf = [&](uint64_t address) { add()->mutable_free()->set_address(address); };
  constexpr uint64_t kWeights = 1 << 20, kActivation = 1 << 19, kLater = 2 << 20;
  constexpr uint64_t kActivationAt = 0x30000000, kLaterAt = 0x40000000;
  // The step's first part: a forward inside Net.block, churn, then an activation kept.
  auto forward = [&](int64_t n, int churn) {
    add()->mutable_step_begin()->set_step(n);
    add()->mutable_phase_begin()->set_phase(v1::PHASE_FORWARD);
    v1::Event* scope = add();
    scope->mutable_scope_begin()->set_name_iid(1);
    for (int i = 0; i < churn; ++i) {
      alloc(0x1000, 64);
      freeOf(0x1000);
    }
    alloc(kActivationAt, kActivation);
  };
  auto rest = [&](int64_t n, uint64_t later) {
    add()->mutable_scope_end()->set_name_iid(1);
    add()->mutable_phase_end()->set_phase(v1::PHASE_FORWARD);
    freeOf(kActivationAt);
    if (later > 0) {
      alloc(kLaterAt, later);
      freeOf(kLaterAt);
    }
    add()->mutable_step_end()->set_step(n);
  };
  auto describe = [](const v1::Steps& steps) {
    std::string out;
    for (const v1::StepSummary& s : steps.steps()) {
      out += std::to_string(s.step()) + ": " + std::to_string(s.peak().tracked_bytes()) + " " +
             s.peak().phase() + " " + s.peak().scope();
      for (const v1::CategoryBytes& c : s.peak().categories())
        if (c.bytes() != 0) out += " " + c.name() + "=" + std::to_string(c.bytes());
      out += "\n";
    }
    return out;
  };

  uint64_t session = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    session = handshake(stream.get()).session_id();
    newBatch();
    auto* name = batches.back().mutable_batch()->add_strings();
    name->set_iid(1);
    name->set_value("Net.block");
    name = batches.back().mutable_batch()->add_strings();
    name->set_iid(2);
    name->set_value("Net.weight");
    alloc(0x10000000, kWeights);
    v1::Event* tag = add();
    tag->mutable_tag()->set_address(0x10000000);
    tag->mutable_tag()->set_size_bytes(kWeights);
    tag->mutable_tag()->set_category(v1::CATEGORY_WEIGHT);
    tag->mutable_tag()->set_name_iid(2);
    forward(1, 60000);
    rest(1, 0);
    forward(2, 60000);
    rest(2, 0);
    forward(3, 60000);  // step 3's forward is running at the restart
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), batches, batchSeq));
    // The daemon stops under the stream (SIGTERM) and starts again on the same store.
    startServer(std::chrono::seconds(600), kMinMemoryBudgetBytes);
    ctx.TryCancel();
    stream->Finish();
  }
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  ASSERT_EQ(handshake(stream.get(), session).next_batch_seq(), batchSeq + 1);
  batches.clear();
  for (int i = 0; i < 10; ++i) {
    alloc(0x1000, 64);
    freeOf(0x1000);
  }
  rest(3, kLater);
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), batches, batchSeq));
  // Answered once the rebuild has caught up (refused until then: past the budget).
  v1::Peak peak;
  grpc::Status st;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(st = wholePeak(session, &peak)).ok() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(peak.breakdown().tracked_bytes(), static_cast<int64_t>(kWeights + kLater));
  EXPECT_EQ(peak.breakdown().step(), 3);
  v1::Steps live;
  st = stepsOf(session, &live);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(live.steps_size(), 3);
  EXPECT_EQ(live.steps(0).peak().tracked_bytes(), static_cast<int64_t>(kWeights + kActivation));
  EXPECT_EQ(live.steps(0).peak().phase(), "forward");
  EXPECT_EQ(live.steps(0).peak().scope(), "Net.block");

  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(seq);
  ASSERT_TRUE(stream->Write(bye));
  ASSERT_TRUE(closeStream(stream.get()).ok());
  // The pass analyses it at its end (what a rebuilt analysis would hand the store, the old one
  // handed over before the restart); its stored steps are those the rebuilt one answered.
  v1::SessionInfo info;
  const auto analysed = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (sessionInfo(session, &info).ok() && !info.analyzed() &&
         std::chrono::steady_clock::now() < analysed)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(info.analyzed());
  EXPECT_EQ(info.blocks(), 180015u);
  v1::Steps stored;
  st = stepsOf(session, &stored);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(describe(live), describe(stored));
  ASSERT_TRUE(wholePeak(session, &peak).ok());
  EXPECT_EQ(peak.breakdown().tracked_bytes(), static_cast<int64_t>(kWeights + kLater));
}

// A job killed before its goodbye: the counts its agent reported with its batches (the latest
// that came, through the checkpoint the closing reads) are the aborted session's, said as early;
// the events it sent are no total to check against. While it ran, GetSession said the committed
// ones.
TEST_F(IngestRpcTest, AKilledJobsSessionKeepsTheCountsItsAgentLastReported) {
  startServer(std::chrono::seconds(0));
  uint64_t session = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    session = handshake(stream.get()).session_id();
    v1::AgentMessage first = event(1, 1, true, 0x1000);
    first.mutable_batch()->mutable_counters()->set_events_sent(1);
    first.mutable_batch()->mutable_counters()->set_adapter_failures(2);
    first.mutable_batch()->mutable_counters()->set_dropped_ring_full(5);
    // A field this build does not know, 64 KiB of it: not kept with the session.
    first.mutable_batch()
        ->mutable_counters()
        ->GetReflection()
        ->MutableUnknownFields(first.mutable_batch()->mutable_counters())
        ->AddLengthDelimited(1000, std::string(65536, 'x'));
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), {first}, 1));
    auto states = Store::loadCheckpointStates((m_dir / "store.db").string(),
                                              {static_cast<int64_t>(session), 999999});
    ASSERT_TRUE(states.ok()) << states.status();
    ASSERT_EQ(states->size(), 1u);  // the unknown session has none
    v1::IngestCheckpoint checkpoint;
    ASSERT_TRUE(checkpoint.ParseFromString(states->at(static_cast<int64_t>(session))));
    EXPECT_EQ(checkpoint.agent_counters().adapter_failures(), 2u);
    EXPECT_LT(states->at(static_cast<int64_t>(session)).size(), 4096u);
    // While it runs, the committed counts are said already.
    v1::SessionInfo live;
    ASSERT_TRUE(sessionInfo(session, &live).ok());
    EXPECT_EQ(live.state(), v1::SESSION_STATE_LIVE);
    EXPECT_EQ(live.events_dropped(), 5u);
    std::map<std::string, int64_t> liveStats;
    for (const v1::Stat& st : live.stats()) liveStats[st.name()] = st.value();
    EXPECT_EQ(liveStats["adapter_failures"], 2);
    EXPECT_EQ(liveStats["agent_dropped_ring_full"], 5);
    EXPECT_EQ(liveStats.count("agent_counters_early"), 1u);
    v1::AgentMessage second = event(2, 2, true, 0x2000);
    second.mutable_batch()->mutable_counters()->set_events_sent(2);
    second.mutable_batch()->mutable_counters()->set_adapter_failures(4);
    second.mutable_batch()->mutable_counters()->set_dropped_ring_full(7);
    second.mutable_batch()->mutable_counters()->set_ring_waits(3);
    ASSERT_TRUE(stream->Write(second));
    ASSERT_TRUE(stream->Write(event(3, 3, false, 0x1000)));  // no counters: the latest stay
    EXPECT_TRUE(closeStream(stream.get()).ok());             // no goodbye: the process died
  }
  v1::SessionInfo info;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(sessionInfo(session, &info).ok());
    if (info.state() != v1::SESSION_STATE_LIVE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_TRUE(hasStat(info, "stream_lost"));
  std::map<std::string, v1::Stat> stats;
  for (const v1::Stat& st : info.stats()) stats[st.name()] = st;
  ASSERT_EQ(stats.count("adapter_failures"), 1u);
  EXPECT_EQ(stats["adapter_failures"].value(), 4);
  EXPECT_EQ(stats["adapter_failures"].severity(), "error");
  ASSERT_EQ(stats.count("agent_dropped_ring_full"), 1u);
  EXPECT_EQ(stats["agent_dropped_ring_full"].value(), 7);
  EXPECT_EQ(stats["agent_dropped_ring_full"].severity(), "data_loss");
  EXPECT_EQ(stats["agent_ring_waits"].value(), 3);
  ASSERT_EQ(stats.count("agent_counters_early"), 1u);
  EXPECT_EQ(stats["agent_counters_early"].severity(), "info");
  EXPECT_EQ(info.events_dropped(), 7u);
  EXPECT_EQ(info.events_sent(), 0u);  // unknown: the goodbye never came
  EXPECT_EQ(info.events_stored(), 3u);
  expectHealthy();
}

TEST_F(IngestRpcTest, ASessionWhoseAgentNeverComesBackEndsAbortedWithItsLiveBlocks) {
  startServer(std::chrono::seconds(0));  // no grace: closed at the next sweep
  uint64_t session = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    session = handshake(stream.get()).session_id();
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
    ASSERT_TRUE(stream->Write(event(2, 2, true, 0x2000)));
    stream->WritesDone();  // no goodbye: the process died
    v1::ServerMessage reply;
    while (stream->Read(&reply)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
  }
  v1::SessionInfo info;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(sessionInfo(session, &info).ok());
    if (info.state() != v1::SESSION_STATE_LIVE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ABORTED);
  // Both blocks, also the one after the last acknowledgement (the stream's end committed it).
  EXPECT_EQ(info.blocks(), 2u);
  EXPECT_EQ(info.live_blocks_at_end(), 2u);
  EXPECT_TRUE(hasStat(info, "stream_lost"));
  // Too late to resume it now.
  v1::AgentMessage resume = hello();
  resume.mutable_handshake()->set_resume_session_id(session);
  EXPECT_EQ(send({resume}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  expectHealthy();
}

// A plan written to a stream that broke before the agent answered it (the plan, or its answer,
// went with the stream) is sent again on the resumed stream, before anything else; one answered
// is not.
TEST_F(IngestRpcTest, AResumedSessionGetsItsUnansweredPlanAgain) {
  auto control = v1::Control::NewStub(m_channel);
  const std::string plan = twoBlockPlan();
  uint64_t session = 0;
  uint64_t planId = 0;
  {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    session = handshake(stream.get()).session_id();
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
    grpc::Status st = applyPlan(*control, session, plan, &planId);
    ASSERT_TRUE(st.ok()) << st.error_message();
    v1::ServerMessage reply;
    do {
      ASSERT_TRUE(stream->Read(&reply));
    } while (!reply.has_command());
    EXPECT_EQ(reply.command().apply_plan().plan_id(), planId);
    // The stream breaks before the agent's answer.
    ctx.TryCancel();
    stream->Finish();
  }
  auto stateOfPlan = [&]() -> int {
    auto plans = Store::appliedPlans((m_dir / "store.db").string(), static_cast<int64_t>(session));
    EXPECT_TRUE(plans.ok());
    return plans.ok() && plans->size() == 1 ? plans->front().state : -1;
  };
  EXPECT_EQ(stateOfPlan(), 0);
  {
    grpc::ClientContext ctx;
    // A daemon that does not send the plan again fails here, not hangs.
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = m_ingest->Stream(&ctx);
    ASSERT_EQ(handshake(stream.get(), session).session_id(), session);
    v1::ServerMessage again;
    ASSERT_TRUE(stream->Read(&again));
    ASSERT_TRUE(again.has_command() && again.command().has_apply_plan());
    EXPECT_EQ(again.command().apply_plan().plan_id(), planId);
    EXPECT_EQ(again.command().apply_plan().plan_json(), plan);
    v1::AgentMessage answer;
    answer.mutable_plan_result()->set_plan_id(planId);
    answer.mutable_plan_result()->set_applied(true);
    answer.mutable_plan_result()->set_step(4);
    ASSERT_TRUE(stream->Write(answer));
    // The answer is committed before the next batch's acknowledgement (one writer, in order).
    ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(2, 2, true, 0x2000)}, 2));
    EXPECT_EQ(stateOfPlan(), 1);
    ctx.TryCancel();
    stream->Finish();
  }
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  ASSERT_EQ(handshake(stream.get(), session).session_id(), session);
  v1::AgentMessage ask;
  ask.mutable_ack_request();
  ASSERT_TRUE(stream->Write(ask));
  v1::ServerMessage first;
  ASSERT_TRUE(stream->Read(&first));
  EXPECT_TRUE(first.has_ack()) << "an answered plan was sent again";
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(2);
  ASSERT_TRUE(stream->Write(bye));
  EXPECT_TRUE(closeStream(stream.get()).ok());
  expectHealthy();
}

// A plan the job applied itself (tidemark.apply_plan in the script) is told of with plan id 0 and
// its document: the session gets it as a plan (plan-check measures it), its later results update
// that plan (the same document and first step), and what is not a plan, too large or past the
// stream's count is not kept, the stream and the daemon going on.
TEST_F(IngestRpcTest, AJobsOwnPlansAreKeptWithinTheirLimits) {
  const std::string plan = twoBlockPlan();
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const uint64_t session = handshake(stream.get()).session_id();
  auto result = [](const std::string& json, bool applied, const std::string& message,
                   int64_t step) {
    v1::AgentMessage m;
    m.mutable_plan_result()->set_applied(applied);
    m.mutable_plan_result()->set_message(message);
    m.mutable_plan_result()->set_step(step);
    m.mutable_plan_result()->set_plan_json(json);
    return m;
  };
  ASSERT_TRUE(stream->Write(result(plan, true, "applied", 2)));
  ASSERT_TRUE(stream->Write(result(plan, true, "applied; but in step 2 a note", 2)));
  ASSERT_TRUE(stream->Write(result(plan, false, "turned off", 7)));  // another first step
  ASSERT_TRUE(stream->Write(result("{\"segments\": []}", true, "applied", 1)));  // not a plan
  std::string huge = plan;
  huge.insert(huge.size() - 1,
              ", \"pad\": \"" + std::string(IngestService::kMaxJobsOwnPlanBytes, 'x') + "\"");
  ASSERT_TRUE(stream->Write(result(huge, true, "applied", 3)));
  // Past the count (three kept so far, a refused document does not count): not kept.
  for (size_t i = 3; i < IngestService::kMaxJobsOwnPlans + 5; ++i)
    ASSERT_TRUE(stream->Write(result(plan, true, "applied", 100 + static_cast<int64_t>(i))));
  // Committed before the next batch's acknowledgement (one writer, in order).
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
  auto plans = Store::appliedPlans((m_dir / "store.db").string(), static_cast<int64_t>(session));
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), IngestService::kMaxJobsOwnPlans - 1);
  const AppliedPlanRow& first = (*plans)[0];
  EXPECT_EQ(first.state, 1);
  EXPECT_EQ(first.fromStep, 2);
  EXPECT_EQ(first.message, "applied; but in step 2 a note");
  EXPECT_EQ(first.planJson, plan);
  EXPECT_GT(first.predictedPeakBytes, 0);
  EXPECT_EQ((*plans)[1].state, 2);
  EXPECT_EQ((*plans)[1].fromStep, 7);
  EXPECT_EQ((*plans)[1].message, "turned off");
  EXPECT_EQ(plans->back().fromStep,
            100 + static_cast<int64_t>(IngestService::kMaxJobsOwnPlans) - 1);
  {
    // Documents of a million bytes each (a long chain name): the stream's 16 MiB hold 16.
    grpc::ClientContext other;
    auto big = m_ingest->Stream(&other);
    const uint64_t bigSession = handshake(big.get()).session_id();
    std::string doc = plan;
    const size_t at = doc.find("\"two\"");
    ASSERT_NE(at, std::string::npos);
    doc.insert(at + 4, std::string(1'000'000 - doc.size(), 'x'));
    ASSERT_EQ(doc.size(), 1'000'000u);
    for (int64_t i = 1; i <= 17; ++i) ASSERT_TRUE(big->Write(result(doc, true, "applied", i)));
    ASSERT_TRUE(sendAndAwaitAck(big.get(), {event(1, 1, true, 0x1000)}, 1));
    auto kept =
        Store::appliedPlans((m_dir / "store.db").string(), static_cast<int64_t>(bigSession));
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(kept->size(), IngestService::kMaxJobsOwnPlanBytesPerStream / 1'000'000);
    v1::AgentMessage done;
    done.mutable_goodbye()->mutable_counters()->set_events_sent(1);
    ASSERT_TRUE(big->Write(done));
    EXPECT_TRUE(closeStream(big.get()).ok());
  }
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(1);
  ASSERT_TRUE(stream->Write(bye));
  EXPECT_TRUE(closeStream(stream.get()).ok());
  expectHealthy();
}

// A live session's recording (what the advisor and the queries by device read) holds the rows
// the daemon took since its last checkpoint: a reader asks the stream's handler to hand them over
// (at the agent's next message) instead of reading a store up to 200 ms behind.
TEST_F(IngestRpcTest, ALiveSessionsRecordingHoldsItsLatestRows) {
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const v1::HandshakeReply reply = handshake(stream.get());
  const uint64_t session = reply.session_id();
  ASSERT_NE(session, 0u);
  uint64_t seq = 0;
  auto add = [&](v1::EventBatch* b) {
    v1::Event* e = b->add_events();
    e->set_seq(++seq);
    e->set_ts_ns(static_cast<int64_t>(seq) * 1000);
    return e;
  };
  // Batch 1 is checkpointed at once (the first); batch 2, right after it, is not yet.
  v1::AgentMessage first;
  first.mutable_batch()->set_batch_seq(1);
  add(first.mutable_batch())->mutable_alloc()->set_address(0xA000);
  first.mutable_batch()->mutable_events(0)->mutable_alloc()->set_size_bytes(4096);
  ASSERT_TRUE(stream->Write(first));
  v1::AgentMessage second;
  v1::EventBatch* b = second.mutable_batch();
  b->set_batch_seq(2);
  for (int64_t step = 1; step <= 2; ++step) {
    add(b)->mutable_step_begin()->set_step(step);
    v1::Event* a = add(b);
    a->mutable_alloc()->set_address(0xB000);
    a->mutable_alloc()->set_size_bytes(static_cast<uint64_t>(1000 * step));
    add(b)->mutable_free()->set_address(0xB000);
    add(b)->mutable_step_end()->set_step(step);
  }
  ASSERT_TRUE(stream->Write(second));
  // The agent goes on writing (a small batch every 30 ms), as a running job's does.
  std::atomic<bool> stop{false};
  std::thread agent([&] {
    for (uint64_t batch = 3; !stop; ++batch) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      v1::AgentMessage m;
      m.mutable_batch()->set_batch_seq(batch);
      v1::Event* a = add(m.mutable_batch());
      a->mutable_alloc()->set_address(0xC000);
      a->mutable_alloc()->set_size_bytes(16);
      add(m.mutable_batch())->mutable_free()->set_address(0xC000);
      if (!stream->Write(m)) break;
    }
  });
  auto peak = [&](const std::string& device, v1::Peak* out) {
    grpc::ClientContext c;
    v1::PeakRequest req;
    req.set_session_id(session);
    req.set_has_step(true);
    req.set_step(2);
    req.set_device(device);
    return m_query->GetPeak(&c, req, out);
  };
  // Once the live analysis has step 2, the recording read by device has it too.
  v1::Peak live;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!peak("all", &live).ok() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  v1::Peak read;
  const grpc::Status st = peak("cuda", &read);
  stop = true;
  agent.join();
  closeStream(stream.get());
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(live.breakdown().tracked_bytes(), 4096 + 2000);
  EXPECT_EQ(read.breakdown().tracked_bytes(), 4096 + 2000);
}

// A live session read while its agent streams fast (what the advisor does on a running job): the
// recording is one cut of the stream, so a block freed just after the cut is still there. Each
// batch is a step k that allocates a 1000-byte block kept into the next step, a 500-byte
// transient, then frees step k-1's block: every step from 2 on peaks at exactly 2500 bytes. A
// recording that took the open blocks after later batches than the rows it read lost the blocks
// those batches freed (a step's peak of 1500: seen as plans made from wrong steps on 4-rank jobs).
TEST_F(IngestRpcTest, ALiveSessionIsReadAtOneCutOfItsStream) {
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const uint64_t session = handshake(stream.get()).session_id();
  ASSERT_NE(session, 0u);
  std::atomic<int64_t> written{0};
  std::atomic<bool> stop{false};
  std::thread agent([&] {
    uint64_t seq = 0;
    for (int64_t step = 1; !stop && step < 3000; ++step) {
      v1::AgentMessage m;
      v1::EventBatch* b = m.mutable_batch();
      b->set_batch_seq(static_cast<uint64_t>(step));
      auto add = [&] {
        v1::Event* e = b->add_events();
        e->set_seq(++seq);
        e->set_ts_ns(static_cast<int64_t>(seq) * 1000);
        return e;
      };
      add()->mutable_step_begin()->set_step(step);
      v1::Event* kept = add();
      kept->mutable_alloc()->set_address(0x100000 + 0x1000 * static_cast<uint64_t>(step));
      kept->mutable_alloc()->set_size_bytes(1000);
      v1::Event* t = add();
      t->mutable_alloc()->set_address(0x10);
      t->mutable_alloc()->set_size_bytes(500);
      add()->mutable_free()->set_address(0x10);
      if (step > 1)
        add()->mutable_free()->set_address(0x100000 + 0x1000 * static_cast<uint64_t>(step - 1));
      add()->mutable_step_end()->set_step(step);
      if (!stream->Write(m)) break;
      written = step;
      if (step % 16 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  int answered = 0;
  std::vector<std::string> wrong;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    grpc::ClientContext c;
    v1::StepsRequest req;
    req.set_session_id(session);
    req.set_device("cuda");  // from the recording (the live analysis has no devices)
    v1::Steps steps;
    if (!m_query->GetSteps(&c, req, &steps).ok()) continue;
    ++answered;
    for (const v1::StepSummary& st : steps.steps()) {
      if (st.step() >= 2 && st.end_ts_ns() != 0 && st.peak().tracked_bytes() != 2500)
        wrong.push_back("step " + std::to_string(st.step()) + " of " +
                        std::to_string(steps.steps_size()) + ": " +
                        std::to_string(st.peak().tracked_bytes()));
    }
  }
  stop = true;
  agent.join();
  closeStream(stream.get());
  EXPECT_GE(answered, 10);
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " of " << answered << " answers wrong, first "
                             << wrong.front();
}

TEST_F(IngestRpcTest, StringsPastTheirLimitsAreRefused) {
  v1::AgentMessage big = goodBatch(1, 1);
  auto* str = big.mutable_batch()->add_strings();
  str->set_iid(1);
  str->set_value(std::string(SessionIngest::kMaxStringBytes + 1, 'x'));
  const grpc::Status s = send({hello(), big});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("over the limit"), std::string::npos);
  expectHealthy();
}

TEST_F(IngestRpcTest, SessionsArePagedAndTheirNamesBounded) {
  // A handshake with a 1.3 MB name and command line: stored cut to their bounds.
  v1::AgentMessage huge = hello();
  huge.mutable_handshake()->set_session_name(std::string(1300000, 'n'));
  huge.mutable_handshake()->set_command_line(std::string(1300000, 'c'));
  v1::AgentMessage bye;
  bye.mutable_goodbye();
  uint64_t first = 0;
  ASSERT_TRUE(send({huge, goodBatch(1, 1), bye}, &first).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(send({hello(), goodBatch(1, 1), bye}).ok());
  std::vector<uint64_t> ids;
  v1::ListSessionsRequest req;
  req.set_page_size(3);
  int pages = 0;
  do {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse page;
    ASSERT_TRUE(m_query->ListSessions(&ctx, req, &page).ok());
    ASSERT_LE(page.sessions_size(), 3);
    for (const auto& si : page.sessions()) {
      ids.push_back(si.id());
      EXPECT_LE(si.name().size(), 256u);
      EXPECT_LE(si.command_line().size(), 4096u);
    }
    req.set_page_token(page.next_page_token());
    ++pages;
  } while (req.page_token() != 0 && pages < 10);
  ASSERT_EQ(ids.size(), 7u);
  EXPECT_EQ(pages, 3);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], first + i);
  expectHealthy();
}

TEST_F(IngestRpcTest, RanksOfAJobAreGroupedAndBadJobMembersRecordedAlone) {
  v1::AgentMessage bye;
  bye.mutable_goodbye();
  // Two ranks of one job over the real Ingest API: one job, listed with both.
  std::vector<uint64_t> ranks;
  for (int r : {1, 0}) {
    v1::AgentMessage h = hello();
    v1::JobMember* job = h.mutable_handshake()->mutable_job();
    job->set_key("10.0.0.1:29500");
    job->set_rank(r);
    job->set_local_rank(r);
    job->set_world_size(2);
    uint64_t id = 0;
    ASSERT_TRUE(send({h, goodBatch(1, 1), bye}, &id).ok());
    ranks.push_back(id);
  }
  {
    grpc::ClientContext ctx;
    v1::ListJobsResponse jobs;
    ASSERT_TRUE(m_query->ListJobs(&ctx, v1::ListJobsRequest(), &jobs).ok());
    ASSERT_EQ(jobs.jobs_size(), 1);
    EXPECT_EQ(jobs.jobs(0).key(), "10.0.0.1:29500");
    EXPECT_EQ(jobs.jobs(0).ranks_recorded(), 2u);
    grpc::ClientContext ctx2;
    v1::GetJobRequest req;
    req.set_key("10.0.0.1:29500");
    v1::Job job;
    ASSERT_TRUE(m_query->GetJob(&ctx2, req, &job).ok());
    ASSERT_EQ(job.ranks_size(), 2);
    EXPECT_EQ(job.ranks(0).session().rank(), 0);  // by rank
    EXPECT_EQ(job.ranks(0).session().id(), ranks[1]);
    EXPECT_EQ(job.ranks(1).session().world_size(), 2);
    EXPECT_EQ(job.missing_ranks_size(), 0);
  }
  // What no launcher sets: recorded all the same, as sessions of their own that say why they
  // are in no job (a recording is never refused for it), the daemon serving on.
  const auto member = [](const std::string& key, int rank, int world) {
    v1::AgentMessage h = hello();
    v1::JobMember* job = h.mutable_handshake()->mutable_job();
    job->set_key(key);
    job->set_rank(rank);
    job->set_world_size(world);
    return h;
  };
  for (const v1::AgentMessage& bad :
       {member("k", 2, 2), member("k", -2, 0), member("k", 0, -1), member("k", 0, 1 << 25),
        member(std::string(257, 'k'), 0, 1)}) {
    uint64_t id = 0;
    const grpc::Status s = send({bad, goodBatch(1, 1), bye}, &id);
    ASSERT_TRUE(s.ok()) << s.error_message();
    v1::SessionInfo info;
    ASSERT_TRUE(sessionInfo(id, &info).ok());
    EXPECT_EQ(info.job_id(), 0u);
    EXPECT_GT(info.events_stored(), 0u);
    bool said = false;
    for (const v1::Stat& st : info.stats()) said = said || st.name() == "job_refused";
    EXPECT_TRUE(said) << id;
  }
  grpc::ClientContext ctx;
  v1::ListSessionsResponse all;
  ASSERT_TRUE(m_query->ListSessions(&ctx, v1::ListSessionsRequest(), &all).ok());
  EXPECT_EQ(all.sessions_size(), 7);
  // An unknown job: NOT_FOUND, by id and by key.
  grpc::ClientContext ctx3;
  v1::GetJobRequest none;
  none.set_job_id(99);
  v1::Job job;
  EXPECT_EQ(m_query->GetJob(&ctx3, none, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  expectHealthy();
}

TEST_F(IngestRpcTest, StreamsPastTheCapAreRefusedAndTheRestServed) {
  // Agents that connect and stay: up to the cap each gets its session, the next one is told to
  // retry later.
  struct Open {
    grpc::ClientContext ctx;
    std::unique_ptr<AgentStream> stream;
  };
  std::vector<std::unique_ptr<Open>> open;
  for (int i = 0; i < kMaxIngestStreams; ++i) {
    auto o = std::make_unique<Open>();
    o->stream = m_ingest->Stream(&o->ctx);
    ASSERT_NE(handshake(o->stream.get()).session_id(), 0u) << i;
    open.push_back(std::move(o));
  }
  const grpc::Status refused = send({hello()});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  for (auto& o : open) {
    o->stream->WritesDone();
    v1::ServerMessage reply;
    while (o->stream->Read(&reply)) {
    }
    o->stream->Finish();
  }
  open.clear();
  expectHealthy();
}

// A spool file as the agent writes one (each message a little-endian u32 length, then it), mode
// 0600: the rest of a session handed over at exit.
void writeSpool(const std::filesystem::path& path, const std::vector<v1::AgentMessage>& messages,
                mode_t mode = 0600) {
  std::string bytes;
  for (const auto& m : messages) {
    const std::string one = m.SerializeAsString();
    const auto n = static_cast<uint32_t>(one.size());
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    bytes += one;
  }
  std::filesystem::remove(path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::fchmod(fd, mode);
  ::close(fd);
}

// The rest of session `session` after batch 1: batches 2 and 3 (a block and its free), a goodbye
// (written by process `pid`: the session's own is 4242).
std::vector<v1::AgentMessage> restOf(uint64_t session, uint64_t otherSession = 0,
                                     int32_t pid = 4242) {
  v1::AgentMessage h;
  auto* hs = h.mutable_handshake();
  hs->set_magic(kHandshakeMagic);
  hs->set_protocol_version(1);
  hs->set_pid(pid);
  hs->set_resume_session_id(otherSession != 0 ? otherSession : session);
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(3);
  bye.mutable_goodbye()->mutable_counters()->set_events_handed_off(2);
  v1::AgentMessage b2, b3;
  {
    auto* b = b2.mutable_batch();
    b->set_batch_seq(2);
    auto* e = b->add_events();
    e->set_seq(2);
    e->set_ts_ns(200);
    e->mutable_alloc()->set_address(0x2000);
    e->mutable_alloc()->set_size_bytes(4096);
  }
  {
    auto* b = b3.mutable_batch();
    b->set_batch_seq(3);
    auto* e = b->add_events();
    e->set_seq(3);
    e->set_ts_ns(300);
    e->mutable_free()->set_address(0x2000);
  }
  return {h, b2, b3, bye};
}

// A spool of a session that ended whole (its agent's goodbye came, every event stored; the exit
// gave up waiting for the answer and spooled the rest all the same): its upload adds nothing and
// makes no second session of the same run; resuming it says ALREADY_EXISTS. A session that ended
// otherwise is still refused as before.
TEST_F(IngestRpcTest, TheUploadOfASpoolOfASessionThatEndedWholeAddsNothing) {
  uint64_t session = 0;
  std::vector<v1::AgentMessage> whole = restOf(0);
  whole[0] = hello();
  whole.insert(whole.begin() + 1, event(1, 1, true, 0x1000));
  ASSERT_TRUE(send(whole, &session).ok());
  ASSERT_NE(session, 0u);
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  ASSERT_EQ(info.events_stored(), 3u);

  v1::AgentMessage resume = hello();
  resume.mutable_handshake()->set_resume_session_id(session);
  EXPECT_EQ(send({resume}).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  const std::filesystem::path file = m_dir / "spool.bin";
  writeSpool(file, restOf(session));
  client::SpoolReader reader(file.string());
  v1::AgentMessage first;
  ASSERT_TRUE(reader.next(&first));
  const client::SpoolUploadResult sent =
      client::uploadSpool(m_channel, reader, first, client::SpoolUpload());
  ASSERT_TRUE(sent.status.ok()) << sent.status.error_message();
  EXPECT_TRUE(sent.alreadyWhole);
  EXPECT_EQ(sent.sessionId, session);
  EXPECT_EQ(sent.events, 0u);
  EXPECT_EQ(sessionCount(), 1) << "a second session of the same run";
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.events_stored(), 3u);
}

TEST_F(IngestRpcTest, AFileHandedOverCompletesTheSessionAndGoes) {
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const uint64_t session = handshake(stream.get()).session_id();
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
  const std::filesystem::path file = m_dir / "handoff.bin";
  writeSpool(file, restOf(session));
  v1::HandoffRequest request;
  request.set_session_id(session);
  request.set_path(file.string());
  v1::HandoffReply reply;
  grpc::ClientContext call;
  ASSERT_TRUE(m_ingest->Handoff(&call, request, &reply).ok());
  ASSERT_TRUE(reply.accepted()) << reply.reason();
  // The daemon ends the agent's stream (it resumes the session from the file).
  v1::ServerMessage ignored;
  while (stream->Read(&ignored)) {
  }
  stream->Finish();
  const v1::SessionInfo info = awaitEnded(session);
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_EQ(info.events_sent(), 3u);
  EXPECT_EQ(info.blocks(), 2u);
  EXPECT_EQ(info.live_blocks_at_end(), 1u);
  EXPECT_TRUE(hasStat(info, "agent_handed_off"));
  EXPECT_FALSE(hasStat(info, "seq_gap"));
  // Stored, so removed (the daemon runs as the file's owner), and nothing left to take up.
  EXPECT_TRUE(awaitRemoved(file));
  auto pending = Store::pendingHandoffs((m_dir / "store.db").string(), "");
  ASSERT_TRUE(pending.ok());
  EXPECT_TRUE(pending->empty());
  expectHealthy();
}

TEST_F(IngestRpcTest, AStepsAnswerIsAPageWhateverTheNumberOfSteps) {
  // 10,000 steps: one answer with all of them is ~2.5 MB here and passes gRPC's 4 MiB at ~17,000
  // (`tidemark steps` failed on any longer training). Pages of at most 4,096, live and stored.
  constexpr int64_t kSteps = 10000;
  uint64_t seq = 0, batchSeq = 0;
  std::vector<v1::AgentMessage> batches;
  auto add = [&]() {
    if (batches.empty() || batches.back().batch().events_size() >= 4000)
      batches.emplace_back().mutable_batch()->set_batch_seq(++batchSeq);
    v1::Event* e = batches.back().mutable_batch()->add_events();
    e->set_seq(++seq);
    e->set_ts_ns(static_cast<int64_t>(seq) * 1000);
    return e;
  };
  for (int64_t n = 0; n < kSteps; ++n) {
    add()->mutable_step_begin()->set_step(n);
    v1::Event* a = add();
    a->mutable_alloc()->set_address(0x1000);
    a->mutable_alloc()->set_size_bytes(64 + n);
    add()->mutable_free()->set_address(0x1000);
    add()->mutable_step_end()->set_step(n);
  }
  auto page = [&](uint64_t session, int64_t from, uint32_t max, bool last, v1::Steps* out) {
    grpc::ClientContext c;
    v1::StepsRequest req;
    req.set_session_id(session);
    req.set_from_step(from);
    req.set_max_steps(max);
    req.set_last(last);
    return m_query->GetSteps(&c, req, out);
  };
  // Every page in turn: each within the limit, the steps 0 .. kSteps - 1 once, in order, each
  // with its own peak.
  auto expectPaged = [&](uint64_t session) {
    int64_t from = 0, expected = 0;
    int pages = 0;
    for (;;) {
      v1::Steps steps;
      const grpc::Status st = page(session, from, 0, false, &steps);
      ASSERT_TRUE(st.ok()) << st.error_message();
      EXPECT_EQ(steps.total_steps(), kSteps);
      EXPECT_LE(steps.steps_size(), QueryService::kStepsPerPage);
      EXPECT_LT(steps.ByteSizeLong(), size_t{4} << 20);
      for (const v1::StepSummary& s : steps.steps()) {
        EXPECT_EQ(s.step(), expected);
        EXPECT_EQ(s.peak().tracked_bytes(), 64 + expected);
        ++expected;
      }
      ++pages;
      if (steps.next_step() < 0) break;
      EXPECT_EQ(steps.next_step(), expected);
      from = steps.next_step();
    }
    EXPECT_EQ(expected, kSteps);
    EXPECT_EQ(pages, 3);
    // The tail, and a page asked larger than the daemon's is cut to it.
    v1::Steps tail;
    ASSERT_TRUE(page(session, 0, 3, true, &tail).ok());
    ASSERT_EQ(tail.steps_size(), 3);
    EXPECT_EQ(tail.steps(0).step(), kSteps - 3);
    EXPECT_EQ(tail.steps(2).step(), kSteps - 1);
    EXPECT_EQ(tail.next_step(), -1);
    v1::Steps big;
    ASSERT_TRUE(page(session, 100, 1 << 30, false, &big).ok());
    EXPECT_EQ(big.steps_size(), QueryService::kStepsPerPage);
    EXPECT_EQ(big.steps(0).step(), 100);
    EXPECT_EQ(big.next_step(), 100 + QueryService::kStepsPerPage);
    v1::Steps beyond;
    ASSERT_TRUE(page(session, kSteps + 5, 0, false, &beyond).ok());
    EXPECT_EQ(beyond.steps_size(), 0);
    EXPECT_EQ(beyond.next_step(), -1);
    // The session's peak (the last step's block, the largest) names its step.
    v1::Peak peak;
    ASSERT_TRUE(wholePeak(session, &peak).ok());
    EXPECT_EQ(peak.breakdown().tracked_bytes(), 64 + kSteps - 1);
    EXPECT_EQ(peak.breakdown().step(), kSteps - 1);
    // One early step's peak, and the last one's.
    for (int64_t n : {int64_t{7}, kSteps - 1}) {
      grpc::ClientContext c;
      v1::PeakRequest req;
      req.set_session_id(session);
      req.set_has_step(true);
      req.set_step(n);
      v1::Peak one;
      ASSERT_TRUE(m_query->GetPeak(&c, req, &one).ok()) << n;
      EXPECT_EQ(one.breakdown().tracked_bytes(), 64 + n);
    }
  };
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const uint64_t session = handshake(stream.get()).session_id();
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), batches, batchSeq));
  // The live analysis handed its ended steps' peaks to the store with the rows (and holds only
  // the last ones): live pages take the steps before those from there.
  auto stored = Store::readPeaks((m_dir / "store.db").string(), static_cast<int64_t>(session),
                                 StepNumbers{0, kSteps - 1});
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_GT(stored->size(), size_t{kSteps / 2});
  size_t held = 0;
  ASSERT_TRUE(
      m_server->liveAgents().visit(static_cast<int64_t>(session), [&](const SessionIngest& ingest) {
        ASSERT_NE(ingest.live(), nullptr);
        held = ingest.live()->heldSteps();
      }));
  EXPECT_LT(held, size_t{kSteps / 2}) << "the steps in the store are let go of";
  {
    SCOPED_TRACE("live");
    expectPaged(session);
  }
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(seq);
  ASSERT_TRUE(stream->Write(bye));
  ASSERT_TRUE(closeStream(stream.get()).ok());
  ASSERT_EQ(awaitEnded(session).state(), v1::SESSION_STATE_ENDED);
  // Its analysis stored: the pages come from the store's rows.
  v1::SessionInfo info;
  for (int i = 0; i < 200 && sessionInfo(session, &info).ok() && !info.analyzed(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(info.analyzed());
  {
    SCOPED_TRACE("stored");
    expectPaged(session);
  }
}

TEST_F(IngestRpcTest, OnlyTheCallersOwnPrivateFileOfThatSessionIsTaken) {
  grpc::ClientContext ctx;
  auto stream = m_ingest->Stream(&ctx);
  const uint64_t session = handshake(stream.get()).session_id();
  ASSERT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
  auto offer = [&](const std::string& path) {
    v1::HandoffRequest request;
    request.set_session_id(session);
    request.set_path(path);
    v1::HandoffReply reply;
    grpc::ClientContext call;
    EXPECT_TRUE(m_ingest->Handoff(&call, request, &reply).ok());
    return reply;
  };
  const std::filesystem::path good = m_dir / "good.bin";
  writeSpool(good, restOf(session));
  // Writable by others: anyone could have put anything in it.
  const std::filesystem::path open = m_dir / "open.bin";
  writeSpool(open, restOf(session), 0666);
  EXPECT_FALSE(offer(open.string()).accepted());
  EXPECT_NE(offer(open.string()).reason().find("writable by others"), std::string::npos);
  // A link to the caller's own good file: not followed.
  const std::filesystem::path link = m_dir / "link.bin";
  std::filesystem::create_symlink(good, link);
  EXPECT_FALSE(offer(link.string()).accepted());
  // Another user's file (the test runs as root when it can chown; else it is skipped there).
  const std::filesystem::path theirs = m_dir / "theirs.bin";
  writeSpool(theirs, restOf(session));
  if (::geteuid() == 0 && ::chown(theirs.c_str(), 65534, 65534) == 0) {
    const v1::HandoffReply r = offer(theirs.string());
    EXPECT_FALSE(r.accepted());
    EXPECT_NE(r.reason().find("belongs to uid 65534"), std::string::npos) << r.reason();
  }
  // Another session's rest, a relative path, a FIFO (never waited on), no file, not a spool.
  const std::filesystem::path other = m_dir / "other.bin";
  writeSpool(other, restOf(session, session + 1));
  EXPECT_NE(offer(other.string()).reason().find("not session"), std::string::npos);
  EXPECT_FALSE(offer("good.bin").accepted());
  const std::filesystem::path fifo = m_dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(offer(fifo.string()).reason().find("not a regular file"), std::string::npos);
  EXPECT_FALSE(offer((m_dir / "missing.bin").string()).accepted());
  // Only a file it cannot open where it lies may be offered from elsewhere.
  EXPECT_TRUE(offer((m_dir / "missing.bin").string()).cannot_open());
  EXPECT_FALSE(offer(open.string()).cannot_open());
  const std::filesystem::path junk = m_dir / "junk.bin";
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    std::fputs("not a spool at all", f);
    std::fclose(f);
  }
  EXPECT_FALSE(offer(junk.string()).accepted());
  // Nothing was taken: the session goes on on its stream and ends whole.
  auto pending = Store::pendingHandoffs((m_dir / "store.db").string(), "");
  ASSERT_TRUE(pending.ok());
  EXPECT_TRUE(pending->empty());
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(2);
  ASSERT_TRUE(stream->Write(event(2, 2, false, 0x1000)));
  ASSERT_TRUE(stream->Write(bye));
  stream->WritesDone();
  v1::ServerMessage ignored;
  while (stream->Read(&ignored)) {
  }
  ASSERT_TRUE(stream->Finish().ok());
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 2u);
  EXPECT_TRUE(std::filesystem::exists(good));  // never the daemon's
  // Its session has ended: nothing is left to take.
  EXPECT_NE(offer(good.string()).reason().find("has ended"), std::string::npos);
  EXPECT_FALSE(offer(good.string()).cannot_open());
  expectHealthy();
}

TEST_F(IngestRpcTest, AFileHandedOverIsTakenUpByTheNextDaemon) {
  const std::filesystem::path file = m_dir / "handoff.bin";
  // The daemon stops before it took the file up: only its row is in the store.
  const uint64_t session = sessionLeftLiveByAStoppedDaemon();
  ASSERT_NE(session, 0u);
  writeSpool(file, restOf(session));
  recordHandoff(session, file);
  startServer(std::chrono::seconds(600));
  const v1::SessionInfo info = awaitEnded(session);
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_EQ(info.live_blocks_at_end(), 1u);
  EXPECT_FALSE(hasStat(info, "stream_lost"));
  expectHealthy();
}

TEST_F(IngestRpcTest, AFileHandedOverOfASessionItsStreamCompletedIsRemovedAsAddingNothing) {
  // The agent's goodbye was on its stream when it decided to hand off (its exit's second ran out
  // just then): the stream ended the session whole, and the file holds nothing more. The daemon
  // that takes it up removes it, saying so (it was left "for tidemark upload", in memory).
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(3);
  uint64_t session = 0;
  ASSERT_TRUE(send({hello(), event(1, 1, true, 0x1000), event(2, 2, true, 0x2000),
                    event(3, 3, false, 0x2000), bye},
                   &session)
                  .ok());
  ASSERT_EQ(awaitEnded(session).events_stored(), 3u);
  const std::filesystem::path file = m_dir / "handoff.bin";
  writeSpool(file, restOf(session));
  m_server->shutdown();
  recordHandoff(session, file);
  startServer(std::chrono::seconds(600));
  EXPECT_TRUE(awaitRemoved(file));
  v1::SessionInfo info;
  ASSERT_TRUE(sessionInfo(session, &info).ok());
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  auto pending = Store::pendingHandoffs((m_dir / "store.db").string(), "");
  ASSERT_TRUE(pending.ok());
  for (int i = 0; i < 100 && !pending->empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pending = Store::pendingHandoffs((m_dir / "store.db").string(), "");
    ASSERT_TRUE(pending.ok());
  }
  EXPECT_TRUE(pending->empty());
  expectHealthy();
}

TEST_F(IngestRpcTest, AFileAcceptedButNotRecordedIsFoundInTheUsersSpoolDirectory) {
  // The daemon said yes and stopped before the row was committed: the file sits in this user's
  // spool directory (XDG_STATE_HOME/tidemark/spool, 0700), its session live in the store.
  const std::filesystem::path state = m_dir / "state";
  const std::filesystem::path spool = state / "tidemark" / "spool";
  std::filesystem::create_directories(spool);
  std::filesystem::permissions(spool, std::filesystem::perms::owner_all);
  const char* oldState = std::getenv("XDG_STATE_HOME");
  const std::string saved = oldState != nullptr ? oldState : "";
  ::setenv("XDG_STATE_HOME", state.c_str(), 1);
  const uint64_t session = sessionLeftLiveByAStoppedDaemon();
  ASSERT_NE(session, 0u);
  const std::filesystem::path file = spool / "tidemark-handoff-4242-1.bin";
  writeSpool(file, restOf(session));
  // Files that are not to be taken: another name, and one of a session that is not live.
  writeSpool(spool / "tidemark-spool-4242-1.bin", restOf(session));
  writeSpool(spool / "tidemark-handoff-4242-2.bin", restOf(session + 7));
  // And one of the same session number written by another process (a session of another store,
  // or of another daemon of this user): never this session's rest.
  writeSpool(spool / "tidemark-handoff-4343-1.bin", restOf(session, 0, 4343));
  startServer(std::chrono::seconds(600));
  const v1::SessionInfo info = awaitEnded(session);
  if (saved.empty()) {
    ::unsetenv("XDG_STATE_HOME");
  } else {
    ::setenv("XDG_STATE_HOME", saved.c_str(), 1);
  }
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_FALSE(hasStat(info, "stream_lost"));
  EXPECT_TRUE(awaitRemoved(file));
  EXPECT_TRUE(std::filesystem::exists(spool / "tidemark-spool-4242-1.bin"));
  EXPECT_TRUE(std::filesystem::exists(spool / "tidemark-handoff-4242-2.bin"));
  EXPECT_TRUE(std::filesystem::exists(spool / "tidemark-handoff-4343-1.bin"));
  expectHealthy();
}

TEST_F(IngestRpcTest, AFileAcceptedButNotRecordedIsFoundInTheUsersHandoffDirectory) {
  // The same with the file where agents hand off first: the memory file system's directory.
  const std::string dir = base::defaultHandoffDirectory();
  if (dir.empty()) GTEST_SKIP() << "/dev/shm is not a memory file system here";
  ASSERT_EQ(base::makePrivateDirectory(dir), "");
  // The directory is this user's, shared with the daemons of the tests running beside this one
  // (ctest -j): the session's process is one no other test's session has (no pid is this high),
  // so that none of them takes this file for the rest of its own session 1 of process 4242 (the
  // spool directory's test once did, and left its own file behind).
  const int32_t pid = 1000000000 + static_cast<int32_t>(::getpid());
  const uint64_t session = sessionLeftLiveByAStoppedDaemon(pid);
  ASSERT_NE(session, 0u);
  // A name no agent of this machine uses (its pid part is not a pid).
  const std::filesystem::path file =
      std::filesystem::path(dir) / ("tidemark-handoff-test" + std::to_string(::getpid()) + "-" +
                                    std::to_string(session) + ".bin");
  writeSpool(file, restOf(session, 0, pid));
  startServer(std::chrono::seconds(600));
  const v1::SessionInfo info = awaitEnded(session);
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_FALSE(hasStat(info, "stream_lost"));
  EXPECT_TRUE(awaitRemoved(file));
  std::filesystem::remove(file);
  expectHealthy();
}

// A job whose process has exited, with the rest of its run in its spool (its exit's handoff
// answered too late, or never offered): the daemon, about to close its session as aborted, finds
// the spool in this user's spool directory and completes the session from it — as `tidemark
// upload` would, without one. A spool with the same name of another process is left alone.
class LeftBehindTest : public IngestRpcTest {
 protected:
  void SetUp() override {
    IngestRpcTest::SetUp();
    m_state = m_dir / "state";
    m_spool = m_state / "tidemark" / "spool";
    std::filesystem::create_directories(m_spool);
    std::filesystem::permissions(m_spool, std::filesystem::perms::owner_all);
    const char* old = std::getenv("XDG_STATE_HOME");
    m_saved = old != nullptr ? old : "";
    ::setenv("XDG_STATE_HOME", m_state.c_str(), 1);
    m_pid = test_support::exitedPid();
  }
  void TearDown() override {
    if (m_saved.empty()) {
      ::unsetenv("XDG_STATE_HOME");
    } else {
      ::setenv("XDG_STATE_HOME", m_saved.c_str(), 1);
    }
    IngestRpcTest::TearDown();
  }
  // The handshake of the exited process (its pid, this host, its start).
  v1::AgentMessage exitedHello(uint64_t resume, uint64_t instance, int64_t startWall = 77) const {
    v1::AgentMessage m = hello();
    m.mutable_handshake()->set_pid(m_pid);
    m.mutable_handshake()->set_hostname(base::hostName());
    m.mutable_handshake()->set_start_wall_ns(startWall);
    m.mutable_handshake()->set_resume_session_id(resume);
    m.mutable_handshake()->set_agent_instance(instance);
    return m;
  }
  // Its spool: `hello`, then batches from `firstBatch` to 3 (an allocation of 0x1000 in batch 1,
  // one of 0x2000 in 2 and its free in 3) and the goodbye (3 events sent).
  void writeItsSpool(const std::string& name, const v1::AgentMessage& hello, uint64_t firstBatch) {
    std::vector<v1::AgentMessage> messages = restOf(1);
    messages[0] = hello;
    if (firstBatch == 1) messages.insert(messages.begin() + 1, event(1, 1, true, 0x1000));
    writeSpool(m_spool / name, messages);
  }
  // Its stream broke after the handshake (and batch 1 when `firstBatch`): the session waits.
  uint64_t brokenStream(uint64_t instance, bool firstBatch) {
    grpc::ClientContext ctx;
    auto stream = m_ingest->Stream(&ctx);
    v1::ServerMessage reply;
    EXPECT_TRUE(stream->Write(exitedHello(0, instance)));
    EXPECT_TRUE(stream->Read(&reply));
    const uint64_t session = reply.handshake_reply().session_id();
    if (firstBatch) {
      EXPECT_TRUE(sendAndAwaitAck(stream.get(), {event(1, 1, true, 0x1000)}, 1));
    }
    ctx.TryCancel();
    stream->Finish();
    return session;
  }
  // The session once it is no longer live, or as it is after 20 s.
  v1::SessionInfo awaitClosed(uint64_t session) {
    v1::SessionInfo info;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && sessionInfo(session, &info).ok() &&
           info.state() == v1::SESSION_STATE_LIVE) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return info;
  }
  std::string spoolName(const std::string& kind, int n) const {
    return "tidemark-" + kind + "-" + std::to_string(m_pid) + "-" + std::to_string(n) + ".bin";
  }

  std::filesystem::path m_state, m_spool;
  std::string m_saved;
  int32_t m_pid = 0;
};

TEST_F(LeftBehindTest, TheSpoolOfAnExitedJobCompletesItsSession) {
  const uint64_t session = brokenStream(0, true);
  ASSERT_NE(session, 0u);
  // Another process of the same pid (started at another moment): not this session's rest.
  writeItsSpool(spoolName("spool", 1), exitedHello(session, 0, 78), 2);
  writeItsSpool(spoolName("spool", 2), exitedHello(session, 0), 2);
  const v1::SessionInfo info = awaitClosed(session);
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED) << "closed as aborted instead";
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_EQ(info.events_sent(), 3u);
  EXPECT_FALSE(hasStat(info, "stream_lost"));
  EXPECT_TRUE(awaitRemoved(m_spool / spoolName("spool", 2)));
  EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", 1)));
  expectHealthy();
}

// Its exit came before its first handshake was answered: the spool begins with that handshake
// (no session to resume), its number the one the daemon made the session for.
TEST_F(LeftBehindTest, TheSpoolOfAJobNeverAnsweredCompletesTheSessionMadeForIt) {
  const uint64_t instance = 0x5eed5eed5eedull;
  const uint64_t session = brokenStream(instance, false);
  ASSERT_NE(session, 0u);
  // Another number (a session the daemon never made): not this session's rest.
  writeItsSpool(spoolName("spool", 1), exitedHello(0, instance + 1), 1);
  writeItsSpool(spoolName("handoff", 2), exitedHello(0, instance), 1);
  const v1::SessionInfo info = awaitClosed(session);
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED) << "closed as aborted instead";
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_EQ(info.blocks(), 2u);
  EXPECT_TRUE(awaitRemoved(m_spool / spoolName("handoff", 2)));
  EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", 1)));
  EXPECT_EQ(sessionCount(), 1) << "a session made from the file";
  expectHealthy();
}

// The same after a restart of the daemon (killed while it took up such a spool, or before the
// job's exit): the daemon that made the session for the number is gone; the session, found live
// at the start, is completed from the spool of its own process all the same.
TEST_F(LeftBehindTest, TheSpoolOfAJobNeverAnsweredCompletesItsSessionAfterARestart) {
  const uint64_t instance = 0x5eed5eed5eedull;
  const uint64_t session = brokenStream(instance, false);
  ASSERT_NE(session, 0u);
  writeItsSpool(spoolName("spool", 1), exitedHello(0, instance, 78), 1);  // another process
  writeItsSpool(spoolName("spool", 2), exitedHello(0, instance), 1);
  startServer(std::chrono::seconds(600));
  const v1::SessionInfo info = awaitClosed(session);
  ASSERT_EQ(info.state(), v1::SESSION_STATE_ENDED) << "closed as aborted instead";
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_TRUE(awaitRemoved(m_spool / spoolName("spool", 2)));
  EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", 1)));
  EXPECT_EQ(sessionCount(), 1) << "a session made from the file";
}

// Its exit came before its first handshake reached the daemon at all (a daemon loaded by many
// jobs): no session was made. The daemon finds its spool — aimed at this daemon, from a process
// that started after it and has exited — and makes the session from it; spools that are not
// such a run are left for `tidemark upload`.
TEST_F(LeftBehindTest, TheSpoolOfAJobThatNeverReachedTheDaemonBecomesItsSession) {
  const int64_t now = base::wallNs();
  auto unanswered = [&](uint64_t instance, const std::string& address, int64_t startWall) {
    v1::AgentMessage m = exitedHello(0, instance, startWall);
    m.mutable_handshake()->set_server_address(address);
    return m;
  };
  // Aimed at another daemon; made before this daemon started (its line said `tidemark upload`);
  // the rest of a session (resumes one); a process that still runs (this one).
  writeItsSpool(spoolName("spool", 1), unanswered(11, "127.0.0.1:1", now), 1);
  writeItsSpool(spoolName("spool", 2), unanswered(12, m_server->address(), 77), 1);
  writeItsSpool(spoolName("spool", 3), exitedHello(99, 0, now), 2);
  v1::AgentMessage running = unanswered(14, m_server->address(), now);
  running.mutable_handshake()->set_pid(::getpid());
  const std::string runningName = "tidemark-spool-" + std::to_string(::getpid()) + "-4.bin";
  writeItsSpool(runningName, running, 1);
  // The job's.
  writeItsSpool(spoolName("spool", 5), unanswered(15, m_server->address(), now), 1);

  v1::ListSessionsResponse list;
  for (int i = 0; i < 200 && list.sessions_size() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ClientContext ctx;
    ASSERT_TRUE(m_query->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  }
  ASSERT_EQ(list.sessions_size(), 1) << "no session made from the job's spool in 10 s";
  const v1::SessionInfo info = awaitClosed(list.sessions(0).id());
  EXPECT_EQ(info.pid(), m_pid);
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ENDED);
  EXPECT_EQ(info.events_stored(), 3u);
  EXPECT_EQ(info.events_sent(), 3u);
  EXPECT_EQ(info.blocks(), 2u);
  EXPECT_TRUE(awaitRemoved(m_spool / spoolName("spool", 5)));
  // Two more rounds of the daemon's look: the others stay, no other session.
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  for (int n : {1, 2, 3})
    EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", n))) << n;
  EXPECT_TRUE(std::filesystem::exists(m_spool / runningName));
  EXPECT_EQ(sessionCount(), 1);
  expectHealthy();
}

// A spool directory holding many spools that are not this daemon's to deal with (of jobs aimed
// at another daemon: left for `tidemark upload`): each is read once; while the directory does
// not change, a look costs a stat of it, not a read (nor a stat) of each file. A spool that
// appears later is still found.
TEST_F(LeftBehindTest, ManySpoolsNotItsOwnAreReadOnce) {
  const int64_t now = base::wallNs();
  auto aimedAt = [&](const std::string& address, uint64_t instance) {
    v1::AgentMessage m = exitedHello(0, instance, now);
    m.mutable_handshake()->set_server_address(address);
    return m;
  };
  constexpr int kForeign = 5000;  // more than the 4,096 a look once remembered
  for (int n = 1; n <= kForeign; ++n) {
    writeItsSpool(spoolName("spool", n), aimedAt("127.0.0.1:1", static_cast<uint64_t>(n)), 1);
  }
  const HandoffTaker& taker = *m_server->handoffs();
  auto awaitLooks = [&](uint64_t looks) {
    const uint64_t until = taker.spoolLooks() + looks;
    for (int i = 0; i < 400 && taker.spoolLooks() < until; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_GE(taker.spoolLooks(), until);
  };
  for (int i = 0; i < 400 && taker.spoolsRead() < kForeign; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(taker.spoolsRead(), static_cast<uint64_t>(kForeign));
  awaitLooks(1);  // the directory's last change is now over a second old
  const uint64_t read = taker.spoolsRead(), lookedAt = taker.spoolsLookedAt();
  awaitLooks(2);
  EXPECT_EQ(taker.spoolsRead(), read) << "spools read again";
  EXPECT_EQ(taker.spoolsLookedAt(), lookedAt) << "an unchanged directory listed again";
  // The job's: its session is made from it.
  writeItsSpool(spoolName("spool", kForeign + 1), aimedAt(m_server->address(), 1), 1);
  EXPECT_TRUE(awaitRemoved(m_spool / spoolName("spool", kForeign + 1), 300));
  EXPECT_EQ(sessionCount(), 1);
  EXPECT_EQ(taker.spoolsRead(), read + 1);
  EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", kForeign)));
  expectHealthy();
}

// The exit gave up waiting for the daemon's answer after the daemon had the whole run (by the
// stream, or a handed-over file it had opened): the session ended whole and the spool written
// meanwhile only repeats it. The daemon removes it (an upload would make a second session of the
// same run); a spool of another process, or of a session that did not end whole, stays.
TEST_F(LeftBehindTest, TheSpoolOfASessionThatEndedWholeIsRemoved) {
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(2);
  uint64_t whole = 0;
  ASSERT_TRUE(send({exitedHello(0, 0), goodBatch(1, 1), bye}, &whole).ok());
  ASSERT_NE(whole, 0u);
  const uint64_t aborted = brokenStream(0, true);
  ASSERT_EQ(awaitClosed(aborted).state(), v1::SESSION_STATE_ABORTED);
  writeItsSpool(spoolName("spool", 1), exitedHello(whole, 0), 1);      // repeats it
  writeItsSpool(spoolName("spool", 2), exitedHello(whole, 0, 78), 1);  // another process's
  writeItsSpool(spoolName("spool", 3), exitedHello(aborted, 0), 2);    // not whole
  EXPECT_TRUE(awaitRemoved(m_spool / spoolName("spool", 1), 200)) << "not removed in 4 s";
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // another look
  EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", 2)));
  EXPECT_TRUE(std::filesystem::exists(m_spool / spoolName("spool", 3)));
  EXPECT_EQ(sessionCount(), 2) << "no session made from a spool";
}

// Without a file its session is closed once its process is gone, as before.
TEST_F(LeftBehindTest, WithoutASpoolTheSessionOfAnExitedJobIsClosed) {
  const uint64_t session = brokenStream(0, true);
  const v1::SessionInfo info = awaitClosed(session);
  EXPECT_EQ(info.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_TRUE(hasStat(info, "stream_lost"));
  EXPECT_EQ(info.blocks(), 1u);
}

// A store shared by two daemons (PostgreSQL): `tidemark apply` asked of one daemon reaches a job
// whose agent streams to the other (a job across nodes), through the store (PlanCourier); the
// agent's answer, stored by its own daemon, is what the first daemon reads back.
TEST(SharedStoreRpcTest, APlanAskedOfOneDaemonReachesTheAgentOfAnother) {
  auto uri = test_support::freshPostgresDatabase();
  ASSERT_TRUE(uri.ok()) << uri.status();
  auto daemon = [&](const char* name) {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.dbPath = *uri;
    o.daemonName = name;
    auto server = std::make_unique<Server>(o);
    EXPECT_TRUE(server->start().ok());
    return server;
  };
  auto a = daemon("node-a");
  auto b = daemon("node-b");
  auto channelA = grpc::CreateChannel(a->address(), grpc::InsecureChannelCredentials());
  auto channelB = grpc::CreateChannel(b->address(), grpc::InsecureChannelCredentials());
  auto control = v1::Control::NewStub(channelA);
  auto ingest = v1::Ingest::NewStub(channelB);

  const std::string plan = twoBlockPlan();
  ASSERT_TRUE(core::parsePlanDocument(plan).ok());

  grpc::ClientContext streamCtx;
  streamCtx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = ingest->Stream(&streamCtx);
  v1::AgentMessage hi;
  hi.mutable_handshake()->set_magic(kHandshakeMagic);
  hi.mutable_handshake()->set_protocol_version(1);
  hi.mutable_handshake()->set_pid(4242);
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Write(hi));
  ASSERT_TRUE(stream->Read(&reply));
  const uint64_t session = reply.handshake_reply().session_id();
  ASSERT_NE(session, 0u);

  uint64_t planId = 0;
  {
    grpc::Status st = applyPlan(*control, session, plan, &planId);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  ASSERT_NE(planId, 0u);
  // The agent of node-b's stream gets the plan node-a recorded, whole.
  do {
    ASSERT_TRUE(stream->Read(&reply));
  } while (!reply.has_command());
  ASSERT_TRUE(reply.has_command() && reply.command().has_apply_plan());
  EXPECT_EQ(reply.command().apply_plan().plan_id(), planId);
  EXPECT_EQ(reply.command().apply_plan().plan_json(), plan);
  auto waiting = Store::plansToDeliver(*uri, "node-b");
  ASSERT_TRUE(waiting.ok());
  for (int i = 0; i < 100 && !waiting->empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    waiting = Store::plansToDeliver(*uri, "node-b");
    ASSERT_TRUE(waiting.ok());
  }
  EXPECT_TRUE(waiting->empty()) << "a delivered plan stays in the outbox";

  // The agent applies it; node-a reads the outcome node-b stored.
  v1::AgentMessage result;
  result.mutable_plan_result()->set_plan_id(planId);
  result.mutable_plan_result()->set_applied(true);
  result.mutable_plan_result()->set_step(3);
  ASSERT_TRUE(stream->Write(result));
  std::optional<AppliedPlanRow> seen;
  for (int i = 0; i < 250 && !(seen && seen->state == 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto plans = Store::appliedPlans(*uri, static_cast<int64_t>(session));
    ASSERT_TRUE(plans.ok());
    if (plans->size() == 1) seen = plans->front();
  }
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, 1);
  EXPECT_EQ(seen->fromStep, 3);

  v1::AgentMessage bye;
  bye.mutable_goodbye();
  ASSERT_TRUE(stream->Write(bye));
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  ASSERT_TRUE(stream->Finish().ok());
  // A session that has ended: refused by the daemon asked, nothing left in the store for the
  // other to send.
  {
    uint64_t refused = 0;
    grpc::Status st = applyPlan(*control, session, plan, &refused);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  }
  auto left = Store::plansToDeliver(*uri, "node-b");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
  a->shutdown();
  b->shutdown();
}

// Plans left for a daemon whose agent is not connected: one waits (the agent may be resuming its
// stream) until a minute has passed since it was asked, then is refused with the reason; one whose
// session ends first is refused as such. Either leaves the outbox.
TEST(SharedStoreRpcTest, APlanThatCannotBeDeliveredIsRefusedWithTheReason) {
  auto uri = test_support::freshPostgresDatabase();
  ASSERT_TRUE(uri.ok()) << uri.status();
  auto store = Store::open(*uri, int64_t{8} << 20, "node-b");
  ASSERT_TRUE(store.ok()) << store.status();
  StoreWriter writer(std::move(*store));
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  auto sid = std::make_shared<int64_t>(0);
  auto plans = std::make_shared<std::vector<int64_t>>();
  ASSERT_TRUE(writer
                  .submit([sid, plans, now](Store& s) -> absl::Status {
                    auto id = s.createSession(SessionHeader{});
                    if (!id.ok()) return id.status();
                    *sid = *id;
                    // Asked a minute and a second ago, and now.
                    for (int64_t sent : {now - PlanCourier::kGiveUpAfterNs - 1'000'000'000, now}) {
                      AppliedPlanRow row;
                      row.sessionId = *id;
                      row.planJson = "{}";
                      row.strategy = "optimal";
                      row.sentWallNs = sent;
                      auto p = s.createAppliedPlan(row);
                      if (!p.ok()) return p.status();
                      plans->push_back(*p);
                      if (auto q = s.queuePlanDelivery(*p, *id); !q.ok()) return q;
                    }
                    return absl::OkStatus();
                  })
                  .get()
                  .ok());
  LiveAgents agents;  // its agent is not connected
  PlanCourier courier(writer, agents, /*shared=*/false);
  EXPECT_EQ(courier.deliverOnce(), 1);  // the old one only
  auto waiting = Store::plansToDeliver(*uri, "node-b");
  ASSERT_TRUE(waiting.ok());
  ASSERT_EQ(waiting->size(), 1u);
  EXPECT_EQ(waiting->front().planId, (*plans)[1]);
  EXPECT_TRUE(Store::plansToDeliver(*uri, "node-a")->empty());  // not another daemon's
  ASSERT_TRUE(writer
                  .submit([sid](Store& s) {
                    SessionEnd end;
                    end.sessionId = *sid;
                    end.endTsNs = 1;
                    return s.endSession(end);
                  })
                  .get()
                  .ok());
  EXPECT_EQ(courier.deliverOnce(), 1);
  auto rows = Store::appliedPlans(*uri, *sid);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  for (const AppliedPlanRow& r : *rows) EXPECT_EQ(r.state, 2);
  EXPECT_NE((*rows)[0].message.find("not delivered: session"), std::string::npos)
      << (*rows)[0].message;
  EXPECT_NE((*rows)[1].message.find("not delivered: the session ended"), std::string::npos)
      << (*rows)[1].message;
  EXPECT_TRUE(Store::plansToDeliver(*uri, "node-b")->empty());
  writer.stop();
}

}  // namespace
}  // namespace tidemark::server
