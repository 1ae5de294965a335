#pragma once

#include "server/rpc/access.h"
#include "server/rpc/live_agents.h"
#include "server/store/writer.h"
#include "tidemark/v1/control.grpc.pb.h"

namespace tidemark::server {

// Control: actions on live jobs and on the store. ApplyPlan records the plan (with its prediction)
// and sends it on the session's agent stream; DeleteSession removes an ended session.
class ControlService final : public v1::Control::Service {
 public:
  ControlService(StoreWriter& writer, LiveAgents& agents, const Access& access)
      : m_writer(writer), m_agents(agents), m_access(access) {}

  grpc::Status ApplyPlan(grpc::ServerContext*, const v1::ApplyPlanRequest* request,
                         v1::ApplyPlanResponse* response) override;
  grpc::Status DeleteSession(grpc::ServerContext*, const v1::DeleteSessionRequest* request,
                             v1::DeleteSessionResponse* response) override;

 private:
  StoreWriter& m_writer;
  LiveAgents& m_agents;
  const Access& m_access;
};

}  // namespace tidemark::server
