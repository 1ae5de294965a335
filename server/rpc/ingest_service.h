#pragma once

#include <functional>

#include "server/rpc/live_agents.h"
#include "server/store/writer.h"
#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::server {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kHandshakeMagic = 0x54444D4B;  // "TDMK"

// Ingest: one bidirectional stream per agent. Handshake → session row; batches → SessionIngest
// → the single writer; end of stream → the rest, live blocks and the session's end, committed
// before the stream's status goes back (so a finished job's data is queryable at once).
class IngestService final : public v1::Ingest::Service {
 public:
  // onEnded(sessionId) is called once a session's end is committed.
  IngestService(StoreWriter& writer, LiveAgents& agents, std::function<void(int64_t)> onEnded)
      : m_writer(writer), m_agents(agents), m_onEnded(std::move(onEnded)) {}

  grpc::Status Stream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override;

 private:
  StoreWriter& m_writer;
  LiveAgents& m_agents;
  std::function<void(int64_t)> m_onEnded;
};

}  // namespace tidemark::server
