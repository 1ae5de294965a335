#include "server/rpc/control_service.h"

#include <memory>

#include "server/rpc/grpc_status.h"
#include "server/rpc/plan_courier.h"
#include "server/store/retention.h"

namespace tidemark::server {

grpc::Status ControlService::ApplyPlan(grpc::ServerContext* ctx,
                                       const v1::ApplyPlanRequest* request,
                                       v1::ApplyPlanResponse* response) {
  if (grpc::Status denied =
          m_access.check(*ctx, static_cast<int64_t>(request->session_id()), "ApplyPlan", kControl);
      !denied.ok())
    return denied;
  const auto session = static_cast<int64_t>(request->session_id());
  absl::StatusOr<AppliedPlanRow> planned = planRow(session, request->plan_json());
  if (!planned.ok()) return toGrpc(planned.status());
  // A session another daemon of a shared store ingests: its agent is connected there, so the
  // plan is left in the store for that daemon to send (PlanCourier).
  auto record = Store::getSession(m_writer.path(), session);
  if (!record.ok()) return toGrpc(record.status());
  const bool elsewhere = !Store::isOwnSession(m_writer.path(), *record, m_writer.daemonName());
  if (elsewhere && record->state != 1)
    return toGrpc(absl::FailedPreconditionError("session " + std::to_string(session) +
                                                " is not running (it has ended)"));
  const AppliedPlanRow row = *std::move(planned);
  auto id = std::make_shared<int64_t>(0);
  absl::Status created =
      m_writer
          .submit([row, id, elsewhere](Store& store) -> absl::Status {
            auto r = store.createAppliedPlan(row);
            if (!r.ok()) return r.status();
            *id = *r;
            if (!elsewhere) return absl::OkStatus();
            absl::Status queued = store.queuePlanDelivery(*r, row.sessionId);
            if (!queued.ok())
              store
                  .setPlanResult(row.sessionId, *r, 2,
                                 "not delivered: " + std::string(queued.message()), 0)
                  .IgnoreError();
            return queued;
          })
          .get();
  if (!created.ok()) return toGrpc(created);
  if (elsewhere) {
    response->set_plan_id(static_cast<uint64_t>(*id));
    return grpc::Status::OK;
  }
  if (absl::Status sent = m_agents.send(session, applyPlanCommand(*id, request->plan_json()));
      !sent.ok()) {
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
