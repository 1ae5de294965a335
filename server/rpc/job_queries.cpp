// Query.ListJobs and Query.GetJob: a training job's ranks side by side (docs/jobs.md). The
// per-rank figures are the sessions' own answers (their peak as GetBreakdown gives it, their
// steps as GetSteps reads them), so a job's page never disagrees with its sessions'.
#include <algorithm>
#include <map>
#include <set>

#include "server/rpc/grpc_status.h"
#include "server/rpc/query_service.h"
#include "server/store/store.h"

namespace tidemark::server {

namespace {
// The median length of the steps that ended (0: none).
int64_t medianStepNs(const core::Recording& steps) {
  std::vector<int64_t> lengths;
  for (const core::StepInterval& s : steps.steps) {
    if (s.endSeq != core::kOpenSeq && s.endTsNs > s.beginTsNs) {
      lengths.push_back(s.endTsNs - s.beginTsNs);
    }
  }
  if (lengths.empty()) return 0;
  // The lower middle of an even count: a step's length as measured, never an average.
  const size_t middle = (lengths.size() - 1) / 2;
  std::nth_element(lengths.begin(), lengths.begin() + static_cast<ptrdiff_t>(middle),
                   lengths.end());
  return lengths[middle];
}

void fillSummary(const JobRecord& j, uid_t storeOwner, v1::JobSummary* out) {
  out->set_id(static_cast<uint64_t>(j.id));
  out->set_key(j.key);
  out->set_start_wall_ns(j.startWallNs);
  out->set_world_size(j.worldSize);
  out->set_owner_uid(static_cast<uint32_t>(j.ownerUid.value_or(storeOwner)));
  out->set_ranks_recorded(static_cast<uint32_t>(j.ranksRecorded));
  out->set_ranks_live(static_cast<uint32_t>(j.ranksLive));
}
}  // namespace

std::optional<int64_t> QueryService::visibleOwner(uid_t caller) const {
  if (m_access.seesAll(caller)) return std::nullopt;
  return static_cast<int64_t>(caller);
}

grpc::Status QueryService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest*,
                                    v1::ListJobsResponse* response) {
  auto caller = m_access.caller(*ctx, "ListJobs", kRead);
  if (!caller.ok()) return toGrpc(caller.status());
  auto jobs = Store::listJobs(m_dbPath, visibleOwner(caller->uid),
                              static_cast<int64_t>(m_access.storeOwner()));
  if (!jobs.ok()) return toGrpc(jobs.status());
  for (const JobRecord& j : *jobs) fillSummary(j, m_access.storeOwner(), response->add_jobs());
  return grpc::Status::OK;
}

grpc::Status QueryService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* request,
                                  v1::Job* response) {
  auto caller = m_access.caller(*ctx, "GetJob", kRead);
  if (!caller.ok()) return toGrpc(caller.status());
  // Only the caller's own jobs are found (every one for root and --allow-group): another user's
  // job is NOT_FOUND, as one that does not exist.
  auto jobs = Store::listJobs(m_dbPath, visibleOwner(caller->uid),
                              static_cast<int64_t>(m_access.storeOwner()));
  if (!jobs.ok()) return toGrpc(jobs.status());
  const JobRecord* job = nullptr;
  for (const JobRecord& j : *jobs) {
    if (request->job_id() != 0 ? j.id == static_cast<int64_t>(request->job_id())
                               : j.key == request->key()) {
      job = &j;  // by key: the newest (jobs come in id order)
    }
  }
  if (job == nullptr) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        request->job_id() != 0 ? "no job " + std::to_string(request->job_id())
                                               : "no job with the key '" + request->key() + "'");
  }
  auto sessions = Store::jobSessions(m_dbPath, job->id);
  if (!sessions.ok()) return toGrpc(sessions.status());
  std::sort(sessions->begin(), sessions->end(), [](const SessionRecord& a, const SessionRecord& b) {
    const bool ka = a.header.rank >= 0, kb = b.header.rank >= 0;
    if (ka != kb) return ka;
    return ka ? std::tie(a.header.rank, a.id) < std::tie(b.header.rank, b.id) : a.id < b.id;
  });
  fillSummary(*job, m_access.storeOwner(), response->mutable_job());

  int64_t mostSteps = 0;
  int64_t latestEnd = 0;
  for (const SessionRecord& s : *sessions) {
    mostSteps = std::max(mostSteps, s.steps);
    latestEnd = std::max(latestEnd, s.endWallNs.value_or(0));
  }
  int64_t highest = -1, lowest = -1, slowest = 0, fastest = 0;
  std::set<int32_t> present;
  for (const SessionRecord& s : *sessions) {
    v1::JobRank* rank = response->add_ranks();
    fillSessionInfo(s, rank->mutable_session());
    present.insert(s.header.rank);
    v1::BreakdownRequest peakAsked;
    peakAsked.set_session_id(static_cast<uint64_t>(s.id));
    peakAsked.set_peak(true);
    // A session with no memory recorded has no peak: the rank is listed without one.
    if (breakdown(&peakAsked, rank->mutable_peak()).ok()) {
      const int64_t bytes = rank->peak().tracked_bytes();
      if (bytes > highest) {
        highest = bytes;
        response->set_memory_rank(s.header.rank);
        response->set_memory_session_id(static_cast<uint64_t>(s.id));
      }
      if (bytes > 0 && (lowest < 0 || bytes < lowest)) lowest = bytes;
    } else {
      rank->clear_peak();
    }
    if (auto steps = Store::loadSteps(m_dbPath, s.id); steps.ok()) {
      const int64_t median = medianStepNs(*steps);
      rank->set_median_step_ns(median);
      if (median > 0) {
        slowest = std::max(slowest, median);
        fastest = fastest == 0 ? median : std::min(fastest, median);
      }
    }
    rank->set_steps(s.steps);
    rank->set_failed(s.state == v1::SESSION_STATE_ABORTED);
    // Ended with fewer steps than another rank made (a rank stopped early or crashed).
    rank->set_ended_early(s.state != v1::SESSION_STATE_LIVE && s.steps < mostSteps);
  }
  if (response->ranks_size() >= 2 && lowest > 0) {
    response->set_peak_imbalance(static_cast<double>(highest) / static_cast<double>(lowest));
  }
  if (response->ranks_size() >= 2 && fastest > 0) {
    response->set_step_time_imbalance(static_cast<double>(slowest) / static_cast<double>(fastest));
  }
  for (int32_t r = 0; r < job->worldSize; ++r) {
    if (present.count(r) == 0) response->add_missing_ranks(r);
  }
  return grpc::Status::OK;
}

}  // namespace tidemark::server
