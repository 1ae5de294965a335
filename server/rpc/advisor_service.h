#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/rpc/access.h"
#include "server/rpc/live_agents.h"
#include "server/rpc/recording_loader.h"
#include "server/store/writer.h"
#include "src/advisor/chain_from_recording.h"
#include "tidemark/v1/advisor.grpc.pb.h"

namespace tidemark::server {

// Advisor: chain profiles measured on recorded steps, plans for a budget, Pareto curves, plans
// checked against the steps that ran under them. Each call reads the session from the store (a
// fresh read connection); for a live session it adds the blocks not freed yet, which the store
// only gets when they are freed or the session ends.
class AdvisorService final : public v1::Advisor::Service {
 public:
  AdvisorService(std::string dbPath, StoreWriter* writer, LiveAgents& agents, const Access& access,
                 int64_t maxLoadedBlocks = RecordingLoader::kDefaultMaxBlocks)
      : m_dbPath(std::move(dbPath)),
        m_writer(writer),
        m_agents(agents),
        m_access(access),
        m_maxLoadedBlocks(maxLoadedBlocks) {}

  grpc::Status GetChainProfile(grpc::ServerContext*, const v1::ChainProfileRequest* request,
                               v1::ChainProfileResponse* response) override;
  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override;
  grpc::Status Pareto(grpc::ServerContext*, const v1::ParetoRequest* request,
                      v1::ParetoResponse* response) override;
  grpc::Status PlanCheck(grpc::ServerContext*, const v1::PlanCheckRequest* request,
                         v1::PlanCheckResponse* response) override;

 private:
  absl::StatusOr<core::RecordedChain> chainFor(const v1::ChainSelector& selector);
  // Read access to the chain's session and to the one its re-run times come from.
  grpc::Status checkChainAccess(const grpc::ServerContext& ctx, const v1::ChainSelector& selector,
                                const char* method);
  absl::StatusOr<core::Recording> loadRecording(int64_t session);

  std::string m_dbPath;
  StoreWriter* m_writer;  // nullptr: a store file read without a daemon
  LiveAgents& m_agents;
  const Access& m_access;
  int64_t m_maxLoadedBlocks;
};

}  // namespace tidemark::server
