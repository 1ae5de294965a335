#include "server/rpc/control_service.h"

#include <chrono>
#include <memory>

#include "server/rpc/grpc_status.h"
#include "server/store/retention.h"
#include "src/advisor/plan_json.h"

namespace tidemark::server {

grpc::Status ControlService::ApplyPlan(grpc::ServerContext* ctx,
                                       const v1::ApplyPlanRequest* request,
                                       v1::ApplyPlanResponse* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "ApplyPlan", kControl);
      !denied.ok())
    return denied;
  absl::StatusOr<core::PlanDocument> doc = core::parsePlanDocument(request->plan_json());
  if (!doc.ok())
    return toGrpc(absl::InvalidArgumentError("not a plan: " + std::string(doc.status().message())));
  const auto session = static_cast<int64_t>(request->session_id());
  AppliedPlanRow row;
  row.sessionId = session;
  row.planJson = request->plan_json();
  row.strategy = doc->strategy;
  row.budgetBytes = doc->budgetBytes;
  row.predictedPeakBytes = doc->predictedPeakBytes;
  row.predictedExtraNs = doc->predictedExtraNs;
  row.predictedStepNs = doc->predictedStepNs;
  row.sentWallNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  auto id = std::make_shared<int64_t>(0);
  absl::Status created = m_writer
                             .submit([row, id](Store& store) -> absl::Status {
                               auto r = store.createAppliedPlan(row);
                               if (!r.ok()) return r.status();
                               *id = *r;
                               return absl::OkStatus();
                             })
                             .get();
  if (!created.ok()) return toGrpc(created);
  v1::ServerMessage message;
  v1::Command* cmd = message.mutable_command();
  cmd->set_command_id(static_cast<uint64_t>(*id));
  cmd->mutable_apply_plan()->set_plan_id(static_cast<uint64_t>(*id));
  cmd->mutable_apply_plan()->set_plan_json(request->plan_json());
  if (absl::Status sent = m_agents.send(session, message); !sent.ok()) {
    m_writer.post([session, planId = *id, why = std::string(sent.message())](Store& s) {
      return s.setPlanResult(session, planId, 2, "not delivered: " + why, 0);
    });
    return toGrpc(sent);
  }
  response->set_plan_id(static_cast<uint64_t>(*id));
  return grpc::Status::OK;
}

grpc::Status ControlService::DeleteSession(grpc::ServerContext* ctx,
                                           const v1::DeleteSessionRequest* request,
                                           v1::DeleteSessionResponse*) {
  const auto session = static_cast<int64_t>(request->session_id());
  if (grpc::Status denied = m_access.check(*ctx, session, "DeleteSession", kControl); !denied.ok())
    return denied;
  auto record = Store::getSession(m_writer.path(), session);
  if (!record.ok()) return toGrpc(record.status());
  if (record->state == 1)
    return toGrpc(absl::FailedPreconditionError(
        "session " + std::to_string(session) +
        " is live (its job still records): delete it once it has ended"));
  if (absl::Status s = deleteSession(m_writer, session); !s.ok()) return toGrpc(s);
  return grpc::Status::OK;
}

}  // namespace tidemark::server
