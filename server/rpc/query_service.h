#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "server/rpc/access.h"
#include "server/rpc/recording_loader.h"
#include "server/store/store.h"
#include "src/core/device_filter.h"
#include "src/core/peak.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::server {

// Query: read-only answers computed from the store (each call opens its own read connection,
// so queries run beside the writer under WAL).
class QueryService final : public v1::Query::Service {
 public:
  // The most modules and tensors GetBreakdown lists at a moment (BreakdownRequest.items).
  static constexpr int kMaxMomentItems = 1000;
  // The most steps one GetSteps answer holds (StepsRequest): ~250 bytes each, well under gRPC's
  // 4 MiB message limit also with a capture schedule's figures.
  static constexpr int64_t kStepsPerPage = 4096;
  QueryService(std::string dbPath, StoreWriter* writer, LiveAgents& agents, const Access& access,
               int64_t maxLoadedBlocks = RecordingLoader::kDefaultMaxBlocks)
      : m_dbPath(dbPath),
        m_loader(std::move(dbPath), writer, agents, maxLoadedBlocks),
        m_agents(agents),
        m_access(access) {}

  grpc::Status ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse* response) override;
  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest* request,
                          v1::SessionInfo* response) override;
  grpc::Status GetBreakdown(grpc::ServerContext*, const v1::BreakdownRequest* request,
                            v1::Breakdown* response) override;
  grpc::Status GetTimeline(grpc::ServerContext*, const v1::TimelineRequest* request,
                           v1::Timeline* response) override;
  grpc::Status GetPeak(grpc::ServerContext*, const v1::PeakRequest* request,
                       v1::Peak* response) override;
  grpc::Status GetSteps(grpc::ServerContext*, const v1::StepsRequest* request,
                        v1::Steps* response) override;
  grpc::Status Export(grpc::ServerContext*, const v1::ExportRequest* request,
                      grpc::ServerWriter<v1::ExportChunk>* writer) override;
  grpc::Status GetOps(grpc::ServerContext*, const v1::OpsRequest* request,
                      v1::Ops* response) override;
  grpc::Status GetDiff(grpc::ServerContext*, const v1::DiffRequest* request,
                       v1::Diff* response) override;
  grpc::Status GetScopes(grpc::ServerContext*, const v1::ScopesRequest* request,
                         v1::Scopes* response) override;
  grpc::Status GetBlock(grpc::ServerContext*, const v1::BlockRequest* request,
                        v1::BlockHistory* response) override;
  // job_queries.cpp
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override;

 private:
  grpc::Status breakdown(const v1::BreakdownRequest* request, v1::Breakdown* response);
  // The peak of the session (step -1) or of one step: stored, or computed now (a session not
  // analyzed yet, or memory of one device only).
  absl::StatusOr<core::PeakReport> peakReport(int64_t id, int64_t step,
                                              const core::DeviceFilter& device);
  // All peaks (the whole session's first, then each step's), stored or computed now; with steps,
  // at least those steps' (a stored session's: only those).
  absl::StatusOr<std::vector<core::PeakReport>> peakReports(
      int64_t id, const core::DeviceFilter& device,
      std::optional<StepNumbers> steps = std::nullopt);
  // Runs fn on the live analysis of a session whose agent streams to this daemon now (src/core/
  // live_analysis.h: answers at a cost independent of the session's length). False when there is
  // none: no agent connected, or the ingest continued from a checkpoint after a restart.
  // The owner whose sessions and jobs a caller sees (nullopt: every one).
  std::optional<int64_t> visibleOwner(uid_t caller) const;
  void fillSessionInfo(const SessionRecord& r, v1::SessionInfo* out) const;
  bool withLive(int64_t id, const std::function<void(const core::LiveAnalysis&)>& fn);
  // The recording, with the blocks of the device asked for only.
  absl::StatusOr<core::Recording> load(int64_t id, const core::DeviceFilter& device);

  std::string m_dbPath;
  RecordingLoader m_loader;  // live sessions include their blocks not freed yet
  LiveAgents& m_agents;
  const Access& m_access;
};

}  // namespace tidemark::server
