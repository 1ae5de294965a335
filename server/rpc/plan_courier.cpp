#include "server/rpc/plan_courier.h"

#include <pthread.h>

#include <chrono>

#include "src/advisor/plan_json.h"

namespace tidemark::server {

absl::StatusOr<AppliedPlanRow> planRow(int64_t sessionId, const std::string& planJson) {
  absl::StatusOr<core::PlanDocument> doc = core::parsePlanDocument(planJson);
  if (!doc.ok())
    return absl::InvalidArgumentError("not a plan: " + std::string(doc.status().message()));
  AppliedPlanRow row;
  row.sessionId = sessionId;
  row.planJson = planJson;
  row.strategy = doc->strategy;
  row.budgetBytes = doc->budgetBytes;
  row.predictedPeakBytes = doc->predictedPeakBytes;
  row.predictedExtraNs = doc->predictedExtraNs;
  row.predictedStepNs = doc->predictedStepNs;
  row.sentWallNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return row;
}

v1::ServerMessage applyPlanCommand(int64_t planId, const std::string& planJson) {
  v1::ServerMessage message;
  v1::Command* cmd = message.mutable_command();
  cmd->set_command_id(static_cast<uint64_t>(planId));
  cmd->mutable_apply_plan()->set_plan_id(static_cast<uint64_t>(planId));
  cmd->mutable_apply_plan()->set_plan_json(planJson);
  return message;
}

PlanCourier::PlanCourier(StoreWriter& writer, LiveAgents& agents, bool shared)
    : m_writer(writer), m_agents(agents) {
  if (shared)
    m_thread = std::thread([this] {
      pthread_setname_np(pthread_self(), "td-plans");
      run();
    });
}

PlanCourier::~PlanCourier() { stop(); }

void PlanCourier::stop() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stopping = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void PlanCourier::run() {
  std::unique_lock<std::mutex> lock(m_mutex);
  while (!m_stopping) {
    lock.unlock();
    deliverOnce();
    lock.lock();
    m_cv.wait_for(lock, std::chrono::milliseconds(kPollMs), [this] { return m_stopping; });
  }
}

int PlanCourier::deliverOnce() {
  std::lock_guard<std::mutex> round(m_roundMutex);
  auto plans = Store::plansToDeliver(m_writer.path(), m_writer.daemonName());
  if (!plans.ok()) return 0;  // the store out of reach: the next round
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  int done = 0;
  for (const PlanDelivery& d : *plans) {
    std::string refusal;
    if (!m_sent.contains(d.planId)) {
      absl::Status sent = m_agents.send(d.sessionId, applyPlanCommand(d.planId, d.planJson));
      if (sent.ok()) {
        m_sent.insert(d.planId);
      } else if (!d.sessionLive) {
        refusal = "not delivered: the session ended before its daemon could send the plan";
      } else if (now - d.sentWallNs > kGiveUpAfterNs) {
        refusal = "not delivered: " + std::string(sent.message());
      } else {
        continue;  // its agent may be resuming its stream: the next round
      }
    }
    absl::Status removed =
        m_writer
            .submit([d, refusal](Store& store) -> absl::Status {
              if (!refusal.empty()) {
                if (auto s = store.setPlanResult(d.sessionId, d.planId, 2, refusal, 0); !s.ok())
                  return s;
              }
              return store.removePlanDelivery(d.planId);
            })
            .get();
    if (!removed.ok()) continue;
    m_sent.erase(d.planId);
    ++done;
  }
  return done;
}

}  // namespace tidemark::server
