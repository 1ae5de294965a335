#include "client/spool_upload.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::client {

SpoolUploadResult uploadSpool(const std::shared_ptr<grpc::Channel>& channel, SpoolReader& reader,
                              v1::AgentMessage first, const SpoolUpload& options) {
  SpoolUploadResult result;
  auto stub = v1::Ingest::NewStub(channel);
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream;
  v1::ServerMessage reply;
  // One deadline for the whole upload, however many attempts it takes.
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(std::max(0, options.deadlineS));
  for (;;) {
    ctx = std::make_unique<grpc::ClientContext>();
    for (const auto& [key, value] : options.metadata) ctx->AddMetadata(key, value);
    if (options.deadlineS > 0) ctx->set_deadline(deadline);
    stream = stub->Stream(ctx.get());
    if (stream->Write(first) && stream->Read(&reply) && reply.has_handshake_reply()) break;
    const grpc::Status refused = stream->Finish();
    const uint64_t resuming = first.handshake().resume_session_id();
    if (resuming != 0 && refused.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      // The session ended whole (its agent's goodbye came, every event stored): the spool only
      // repeats it. Nothing sent, no second session made of the same run.
      result.sessionId = resuming;
      result.alreadyWhole = true;
      return result;
    }
    if (!options.newSessionIfClosed || resuming == 0 ||
        (refused.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
         refused.error_code() != grpc::StatusCode::NOT_FOUND)) {
      result.status = refused;
      return result;
    }
    if (options.note) {
      options.note("session " + std::to_string(resuming) + " cannot be continued (" +
                   refused.error_message() + "); the spool becomes a new session");
    }
    first.mutable_handshake()->set_resume_session_id(0);
    first.mutable_handshake()->set_agent_instance(0);  // nor the session its agent first made
  }
  // A resumed session may hold the first batches already (the daemon committed them before the
  // agent gave up): they are not sent again.
  const uint64_t next = reply.handshake_reply().next_batch_seq();
  result.sessionId = reply.handshake_reply().session_id();
  // The daemon's acknowledgements are read as they come (a transport that holds a write until
  // its reader takes it would otherwise hold both ends).
  std::thread acks([&stream] {
    v1::ServerMessage ignored;
    while (stream->Read(&ignored)) {
    }
  });
  v1::AgentMessage message;
  bool stopped = false;
  while (reader.next(&message)) {
    if (options.stop != nullptr && options.stop->load(std::memory_order_relaxed)) {
      stopped = true;
      break;
    }
    if (message.has_batch()) {
      if (message.batch().batch_seq() < next) continue;
      result.events += static_cast<uint64_t>(message.batch().events_size());
    }
    if (!stream->Write(message)) break;
  }
  if (stopped) {
    ctx->TryCancel();
  } else {
    stream->WritesDone();
  }
  acks.join();
  result.status = stream->Finish();
  result.readError = reader.error();
  return result;
}

}  // namespace tidemark::client
