#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "server/rpc/live_agents.h"
#include "server/store/writer.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::server {

// The command that carries a plan to a job's agent (Control.ApplyPlan, PlanCourier).
v1::ServerMessage applyPlanCommand(int64_t planId, const std::string& planJson);

// The store's row of a plan for a session: its document, what it predicts, sent now. An error
// when planJson is not a plan.
absl::StatusOr<AppliedPlanRow> planRow(int64_t sessionId, const std::string& planJson);

// Delivers the plans that other daemons of a shared store recorded for the live sessions this
// daemon ingests (`tidemark apply` asked of any daemon reaches every rank of a job that spans
// nodes). Every 200 ms it reads the store's plan_outbox for its own sessions, sends each plan on
// its session's agent stream and removes the row. A plan whose session ended first, or whose
// agent stays away for a minute, is marked refused with the reason ("not delivered: ...") so that
// plan-check says so. On a store no other daemon writes to (SQLite) it has nothing to do and
// runs no thread.
class PlanCourier {
 public:
  static constexpr int kPollMs = 200;
  static constexpr int64_t kGiveUpAfterNs = 60'000'000'000;

  PlanCourier(StoreWriter& writer, LiveAgents& agents, bool shared);
  ~PlanCourier();
  PlanCourier(const PlanCourier&) = delete;
  PlanCourier& operator=(const PlanCourier&) = delete;

  // One round now, on the caller's thread (tests): the plans sent or given up.
  int deliverOnce();
  void stop();

 private:
  void run();
  StoreWriter& m_writer;
  LiveAgents& m_agents;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  bool m_stopping = false;
  // Sent, but their rows not yet removed (the store was out of reach): never sent twice.
  std::set<int64_t> m_sent;
  std::mutex m_roundMutex;
  std::thread m_thread;
};

}  // namespace tidemark::server
