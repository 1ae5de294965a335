#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gui/model/lanes.h"
#include "gui/model/stacked_timeline.h"

namespace grpc {
class Channel;
}

namespace tidemark::gui {

// Plain answers of tidemarkd for the GUI (no Qt, no protobuf in its interface). Every call blocks
// on the network: the GUI makes them off the UI thread.
struct SessionRow {
  uint64_t id = 0;
  std::string name;
  std::string command;
  bool live = false;
  int64_t steps = 0;
  int64_t startNs = 0;
  int64_t endNs = 0;   // 0 while live
  uint64_t jobId = 0;  // the training job it is a rank of (0: none)
  int32_t rank = -1;   // its rank there (-1: not known)
};

// A training job's ranks side by side (Query.GetJob; docs/jobs.md).
struct JobRank {
  uint64_t session = 0;
  int32_t rank = -1;  // -1: not known
  std::string host;
  std::string state;  // live, ended, failed (its stream broke), early (fewer steps than others)
  int64_t steps = 0;
  int64_t medianStepNs = 0;
  int64_t peakBytes = -1;   // -1: no memory recorded
  int64_t startNs = 0;      // the session's own clock (its timeline's)
  int64_t endNs = 0;        // 0 while live
  int64_t startWallNs = 0;  // its start on the realtime clock: the ranks' common axis
};
struct JobData {
  uint64_t id = 0;
  std::string key;
  int32_t worldSize = 0;
  int32_t memoryRank = -1;
  uint64_t memorySession = 0;  // the rank with the highest peak: the job's memory need
  double peakImbalance = 0;    // highest / lowest peak (0: fewer than two ranks)
  double stepImbalance = 0;    // slowest / fastest median step
  std::vector<JobRank> ranks;
  std::vector<int32_t> missingRanks;
};

struct Item {
  std::string name;
  std::string category;
  int64_t bytes = 0;
  uint64_t address = 0;  // a tensor's block (0: not known)
};

struct Moment {
  int64_t tsNs = 0;
  int64_t step = -1;
  std::string phase, scope;
  int64_t trackedBytes = 0;
  int64_t reservedBytes = -1;
  std::array<int64_t, kCategories> bytes{};
  // Largest first: the peak's (as stored) and a moment's (up to DaemonClient::kMomentItems).
  std::vector<Item> modules, tensors;
};

struct StepRow {
  int64_t step = 0;
  int64_t beginNs = 0, endNs = 0;  // endNs 0 while open
  Moment peak;
  // A capture schedule recorded it as a summary: peak is the agent's measure, by tag only, and
  // no events of it were stored (no timeline, no items).
  bool summarized = false;
  // Found by the memory's repetition (the recording has no step marks), not marked.
  bool inferred = false;
};

struct TimelineData {
  int64_t fromNs = 0, toNs = 0;
  std::vector<TimelineBucket> buckets;
};

// The plan space the advisor searches (as `tidemark plan --nested --offload SPEED`).
struct PlanOptions {
  bool nested = false;  // recomputed segments may checkpoint parts of their re-run again
  std::string offload;  // a link's speed ("12GB/s") for offloading stages to host; "": none
};

struct PlanSummary {
  bool feasible = false;
  std::string json;  // the plan document
  int64_t budgetBytes = 0;
  int64_t predictedPeakBytes = 0;
  int64_t predictedExtraNs = 0;
  int64_t baseStepNs = 0;
  int64_t storeAllPeakBytes = 0;
  int64_t minFeasibleBudgetBytes = 0;
  std::vector<std::pair<std::string, std::string>> segments;  // (mode, modules)
  std::vector<std::pair<int64_t, int64_t>> predicted;  // (ts, live bytes) over the recorded step
};

// A plan sent to a session and what the steps under it measured (Advisor.PlanCheck).
struct PlanOutcome {
  uint64_t planId = 0;
  std::string state;  // "sent", "applied", "refused"
  std::string message;
  int64_t fromStep = 0, stepsMeasured = 0;
  int64_t budgetBytes = 0, predictedPeakBytes = 0, measuredPeakBytes = 0;
};

struct ParetoData {
  std::vector<std::pair<int64_t, int64_t>> points;  // (budget bytes, extra ns)
  int64_t storeAllPeakBytes = 0;
  int64_t baseStepNs = 0;
};

class DaemonClient {
 public:
  explicit DaemonClient(std::string address);
  // Over a channel already made: a store file's (tidemark-gui --db FILE), named `label`.
  DaemonClient(std::string label, std::shared_ptr<grpc::Channel> channel);
  ~DaemonClient();
  const std::string& address() const { return m_address; }

  absl::StatusOr<std::vector<SessionRow>> sessions();
  absl::StatusOr<SessionRow> session(uint64_t id);
  absl::StatusOr<JobData> job(uint64_t jobId);
  // device: whose memory ("" all, "cpu", "cuda", "cuda:N"; the Query requests' device).
  absl::StatusOr<TimelineData> timeline(uint64_t session, int64_t fromNs, int64_t toNs, int buckets,
                                        const std::string& device = {});
  absl::StatusOr<Moment> peak(uint64_t session, const std::string& device = {});
  // The moment's modules and tensors too (the largest kMomentItems of each).
  static constexpr int kMomentItems = 200;
  absl::StatusOr<Moment> at(uint64_t session, int64_t tsNs, const std::string& device = {});
  absl::StatusOr<std::vector<StepRow>> steps(uint64_t session, const std::string& device = {});
  // Scopes lasting at least minNs in the range (both 0: the whole session), longest first.
  absl::StatusOr<std::vector<LaneSpan>> scopes(uint64_t session, int64_t fromNs, int64_t toNs,
                                               int64_t minNs);
  absl::StatusOr<PlanSummary> plan(uint64_t session, const std::string& budget,
                                   const PlanOptions& options = {});
  absl::StatusOr<ParetoData> pareto(uint64_t session, const PlanOptions& options = {});
  absl::StatusOr<uint64_t> apply(uint64_t session, const std::string& planJson);
  absl::StatusOr<std::vector<PlanOutcome>> planCheck(uint64_t session);
  // The allocation stack of the block at `address` live at tsNs (innermost frame first; empty
  // when the recording has none for it).
  absl::StatusOr<std::vector<std::string>> blockStack(uint64_t session, uint64_t address,
                                                      int64_t tsNs);

 private:
  // PERMISSION_DENIED when the daemon at the address is not run by this user or root.
  absl::Status trusted() const;
  struct Stubs;
  std::string m_address;
  std::string m_channelError;  // why no channel could be made ("": it was)
  bool m_inProcess = false;    // a store file read in this process: no daemon to vet
  std::unique_ptr<Stubs> m_stubs;
};

}  // namespace tidemark::gui
