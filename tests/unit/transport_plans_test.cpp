// The agent's transport takes each recompute plan once: delivery from the daemons is at least
// once (a daemon on a shared store that sent a plan and died before it recorded so sends it again
// after its restart; a resumed session's unanswered plans are sent again). A plan it answered is
// answered again when it comes again. A plan's result is kept until the daemon has certainly
// read it: written again on the stream after one that broke, and in the exit's spool when no
// daemon took it. The daemon here is a gRPC server on loopback written by the test, since the
// real one repeats a plan only when a stream breaks at one exact moment.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/recorder/recorder.h"
#include "agent/transport/interner.h"
#include "agent/transport/transport.h"
#include "client/spool_reader.h"
#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::agent {
namespace {

v1::ServerMessage planCommand(uint64_t id) {
  v1::ServerMessage m;
  m.mutable_command()->set_command_id(id);
  m.mutable_command()->mutable_apply_plan()->set_plan_id(id);
  m.mutable_command()->mutable_apply_plan()->set_plan_json("{\"plan\": " + std::to_string(id) +
                                                           "}");
  return m;
}

using DaemonStream = grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>;

// Reads the agent's handshake and answers it as session `session`; false if none came.
bool answerHandshake(DaemonStream* stream, uint64_t session) {
  v1::AgentMessage in;
  if (!stream->Read(&in) || !in.has_handshake()) return false;
  v1::ServerMessage reply;
  reply.mutable_handshake_reply()->set_session_id(session);
  reply.mutable_handshake_reply()->set_server_protocol_version(in.handshake().protocol_version());
  reply.mutable_handshake_reply()->set_next_batch_seq(1);
  return stream->Write(reply);
}

// Acknowledges a batch the agent sent (any other message: nothing).
void acknowledge(DaemonStream* stream, const v1::AgentMessage& in) {
  if (!in.has_batch()) return;
  v1::ServerMessage ack;
  ack.mutable_ack()->set_batch_seq(in.batch().batch_seq());
  stream->Write(ack);
}

// Answers the handshake, sends the plans in `sends` (repeats included), acknowledges every batch
// and ends the stream with OK when the agent closes it.
class RepeatingDaemon final : public v1::Ingest::Service {
 public:
  explicit RepeatingDaemon(std::vector<uint64_t> sends) : m_sends(std::move(sends)) {}
  grpc::Status Stream(grpc::ServerContext*, DaemonStream* stream) override {
    if (!answerHandshake(stream, 77))
      return {grpc::StatusCode::FAILED_PRECONDITION, "handshake first"};
    for (uint64_t id : m_sends) stream->Write(planCommand(id));
    v1::AgentMessage in;
    while (stream->Read(&in)) acknowledge(stream, in);
    return grpc::Status::OK;
  }

 private:
  std::vector<uint64_t> m_sends;
};

// The daemon on loopback and an agent's transport connected to it.
struct Loopback {
  explicit Loopback(v1::Ingest::Service* daemon) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(daemon);
    server = builder.BuildAndStart();
    TransportConfig config;
    config.server = "127.0.0.1:" + std::to_string(port);
    config.quiet = true;
    config.handoffMinEvents = 0;
    transport = std::make_unique<Transport>(Recorder::instance(), interner, config);
    if (server != nullptr) transport->start();
  }
  ~Loopback() {
    transport->shutdown(2000);
    if (server != nullptr) server->Shutdown();
  }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  Interner interner;
  std::unique_ptr<Transport> transport;
};

TEST(TransportPlansTest, APlanSentAgainIsTakenOnce) {
  // Plan 7 three times, 8 between them, 9 last: once 9 is taken, every send before it was read.
  RepeatingDaemon daemon({7, 7, 8, 7, 9});
  Loopback loop(&daemon);
  ASSERT_NE(loop.server, nullptr);
  ASSERT_GT(loop.port, 0);
  Transport& transport = *loop.transport;

  std::vector<uint64_t> taken;
  std::vector<std::string> texts;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((taken.empty() || taken.back() != 9) && std::chrono::steady_clock::now() < deadline) {
    uint64_t id = 0;
    std::string json;
    if (transport.takePlan(&id, &json)) {
      taken.push_back(id);
      texts.push_back(json);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Nothing more comes after the sentinel either.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  uint64_t id = 0;
  std::string json;
  EXPECT_FALSE(transport.takePlan(&id, &json)) << "plan " << id << " taken again";
  EXPECT_EQ(taken, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_EQ(texts, (std::vector<std::string>{"{\"plan\": 7}", "{\"plan\": 8}", "{\"plan\": 9}"}));

  // A plan put back because the caller's buffer was too small is still taken (once).
  transport.returnPlan(8, "{\"plan\": 8}");
  ASSERT_TRUE(transport.takePlan(&id, &json));
  EXPECT_EQ(id, 8u);
  EXPECT_FALSE(transport.takePlan(&id, &json));
}

// Sends plan 5, reads the agent's answer to it, sends plan 5 again (as a daemon does when the
// stream its answer came on broke) and hands over the answers it read.
class AskingTwiceDaemon final : public v1::Ingest::Service {
 public:
  std::future<std::vector<v1::PlanResult>> answers() { return m_answers.get_future(); }
  grpc::Status Stream(grpc::ServerContext*, DaemonStream* stream) override {
    if (!answerHandshake(stream, 78))
      return {grpc::StatusCode::FAILED_PRECONDITION, "handshake first"};
    stream->Write(planCommand(5));
    std::vector<v1::PlanResult> got;
    v1::AgentMessage in;
    while (stream->Read(&in)) {
      acknowledge(stream, in);
      if (!in.has_plan_result()) continue;
      got.push_back(in.plan_result());
      if (got.size() == 1) stream->Write(planCommand(5));
      if (got.size() == 2) break;
    }
    m_answers.set_value(got);
    while (stream->Read(&in)) {
    }
    return grpc::Status::OK;
  }

 private:
  std::promise<std::vector<v1::PlanResult>> m_answers;
};

TEST(TransportPlansTest, APlanSentAgainAfterItsAnswerIsAnsweredAgainNotTaken) {
  AskingTwiceDaemon daemon;
  auto answers = daemon.answers();
  Loopback loop(&daemon);
  ASSERT_NE(loop.server, nullptr);
  Transport& transport = *loop.transport;

  uint64_t id = 0;
  std::string json;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!transport.takePlan(&id, &json) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(id, 5u);
  transport.reportPlanResult(5, false, "refused: no such module", 3);

  ASSERT_EQ(answers.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const std::vector<v1::PlanResult> got = answers.get();
  ASSERT_EQ(got.size(), 2u);
  for (const v1::PlanResult& r : got) {
    EXPECT_EQ(r.plan_id(), 5u);
    EXPECT_FALSE(r.applied());
    EXPECT_EQ(r.message(), "refused: no such module");
    EXPECT_EQ(r.step(), 3);
  }
  EXPECT_FALSE(transport.takePlan(&id, &json)) << "plan " << id << " taken again";
}

// Ends the first stream as soon as it has read a plan's result (a daemon that dies before it
// stores it); on the streams after, hands over the results it reads.
class BreakingDaemon final : public v1::Ingest::Service {
 public:
  std::future<v1::PlanResult> againOnANewStream() { return m_again.get_future(); }
  grpc::Status Stream(grpc::ServerContext*, DaemonStream* stream) override {
    if (!answerHandshake(stream, 79))
      return {grpc::StatusCode::FAILED_PRECONDITION, "handshake first"};
    const bool first = m_streams++ == 0;
    v1::AgentMessage in;
    while (stream->Read(&in)) {
      acknowledge(stream, in);
      if (!in.has_plan_result()) continue;
      if (first) return {grpc::StatusCode::UNAVAILABLE, "the daemon went away"};
      std::call_once(m_once, [&] { m_again.set_value(in.plan_result()); });
    }
    return grpc::Status::OK;
  }

 private:
  std::atomic<int> m_streams{0};
  std::once_flag m_once;
  std::promise<v1::PlanResult> m_again;
};

TEST(TransportPlansTest, AResultOnAStreamThatBrokeGoesAgainOnTheNext) {
  // Written on a stream that then broke, with no acknowledgement of anything after it: the
  // daemon may never have stored it.
  BreakingDaemon daemon;
  auto again = daemon.againOnANewStream();
  Loopback loop(&daemon);
  ASSERT_NE(loop.server, nullptr);
  loop.transport->reportPlanResult(0, true, "applied", 4, "{\"segments\": []}");
  ASSERT_EQ(again.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const v1::PlanResult r = again.get();
  EXPECT_EQ(r.plan_id(), 0u);
  EXPECT_TRUE(r.applied());
  EXPECT_EQ(r.step(), 4);
  EXPECT_EQ(r.plan_json(), "{\"segments\": []}");
}

TEST(TransportPlansTest, ResultsNoDaemonReadAreInTheExitsSpool) {
  // Nobody listens: the exit spools the run, and the plans' results with it, right after the
  // handshake (`tidemark upload` gives them to the daemon with the recording).
  char dir[] = "/tmp/tidemark-plans-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  Interner interner;
  TransportConfig config;
  config.server = "unix:" + std::string(dir) + "/nobody.sock";
  config.quiet = true;
  config.spoolPath = std::string(dir) + "/spool";
  Transport transport(Recorder::instance(), interner, config);
  transport.reportPlanResult(0, true, "applied", 2, "{\"a\": 1}");
  transport.reportPlanResult(12, false, "refused: no module x", 3);
  transport.shutdown(2000);

  client::SpoolReader reader(config.spoolPath);
  ASSERT_TRUE(reader.ok()) << reader.error();
  std::vector<std::string> kinds;
  std::vector<v1::PlanResult> results;
  v1::AgentMessage m;
  while (reader.next(&m)) {
    kinds.push_back(m.has_handshake()     ? "handshake"
                    : m.has_plan_result() ? "result"
                    : m.has_goodbye()     ? "goodbye"
                                          : "other");
    if (m.has_plan_result()) results.push_back(m.plan_result());
  }
  EXPECT_EQ(reader.error(), "");
  ASSERT_GE(kinds.size(), 4u);
  EXPECT_EQ(kinds[0], "handshake");
  EXPECT_EQ(kinds[1], "result");
  EXPECT_EQ(kinds[2], "result");
  EXPECT_EQ(kinds.back(), "goodbye");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].plan_id(), 0u);
  EXPECT_EQ(results[0].plan_json(), "{\"a\": 1}");
  EXPECT_EQ(results[0].step(), 2);
  EXPECT_EQ(results[1].plan_id(), 12u);
  EXPECT_FALSE(results[1].applied());
  EXPECT_EQ(results[1].message(), "refused: no module x");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark::agent
