#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "src/advisor/chain_from_recording.h"
#include "tidemark/v1/advisor.grpc.pb.h"

namespace tidemark::server {

// Advisor: chain profiles measured on recorded steps, plans for a budget, Pareto curves. Each call
// reads the session from the store (a fresh read connection) and builds its chain model.
class AdvisorService final : public v1::Advisor::Service {
 public:
  explicit AdvisorService(std::string dbPath) : m_dbPath(std::move(dbPath)) {}

  grpc::Status GetChainProfile(grpc::ServerContext*, const v1::ChainProfileRequest* request,
                               v1::ChainProfileResponse* response) override;
  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override;
  grpc::Status Pareto(grpc::ServerContext*, const v1::ParetoRequest* request,
                      v1::ParetoResponse* response) override;

 private:
  absl::StatusOr<core::RecordedChain> chainFor(const v1::ChainSelector& selector);

  std::string m_dbPath;
};

}  // namespace tidemark::server
