// `tidemark jobs` and `tidemark job JOB`: training jobs, a rank per session (docs/jobs.md).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/job_commands.h"
#include "cli/render.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

namespace {

std::string jobSummaryJson(const v1::JobSummary& j) {
  return "{\"id\": " + std::to_string(j.id()) + ", \"key\": " + jsonString(j.key()) +
         ", \"start_wall_ns\": " + std::to_string(j.start_wall_ns()) +
         ", \"world_size\": " + std::to_string(j.world_size()) +
         ", \"ranks_recorded\": " + std::to_string(j.ranks_recorded()) +
         ", \"ranks_live\": " + std::to_string(j.ranks_live()) +
         ", \"owner_uid\": " + std::to_string(j.owner_uid()) + "}";
}

// "3" for a known rank, "?" otherwise.
std::string rankText(int32_t rank) { return rank >= 0 ? std::to_string(rank) : "?"; }

int64_t categoryBytes(const v1::Breakdown& b, v1::Category c) {
  for (const v1::CategoryBytes& cb : b.categories()) {
    if (cb.category() == c) return cb.bytes();
  }
  return 0;
}

bool wantsHelp(const std::vector<std::string>& args, const char* usage) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return true;
    }
  }
  return false;
}

constexpr const char* kJobsUsage =
    "usage: tidemark jobs [--server ADDR | --db FILE] [--json]\n\n"
    "Lists training jobs: the sessions of your ranks grouped by the job their agents found\n"
    "(tidemark run --job NAME, torchrun's run id, or MASTER_ADDR:MASTER_PORT; docs/jobs.md).\n";

constexpr const char* kJobUsage =
    "usage: tidemark job JOB [--server ADDR | --db FILE] [--json]\n\n"
    "A job's ranks side by side: each one's session, steps, median step time and peak by\n"
    "category; the rank that sets the job's memory need (the highest peak), the imbalance\n"
    "(highest / lowest peak, slowest / fastest median step), ranks that ended early or failed,\n"
    "and ranks of the world size never recorded. JOB: a job id (tidemark jobs), or a key (its\n"
    "newest job).\n";

}  // namespace

int fetchJob(const GlobalOptions& g, const char* what, const std::string& which, v1::Job* job) {
  v1::GetJobRequest req;
  char* end = nullptr;
  const unsigned long long id = std::strtoull(which.c_str(), &end, 10);
  if (!which.empty() && *end == '\0' && id > 0) {
    req.set_job_id(id);
  } else {
    req.set_key(which);
  }
  return callQuery(g, what, &v1::Query::Stub::GetJob, req, job, 60);
}

int jobsCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  if (wantsHelp(args, kJobsUsage)) return kExitOk;
  if (!args.empty()) {
    std::fprintf(stderr, "tidemark jobs: unexpected argument '%s'\n", args.front().c_str());
    return kExitUsage;
  }
  v1::ListJobsResponse resp;
  if (int code = callQuery(g, "jobs", &v1::Query::Stub::ListJobs, v1::ListJobsRequest(), &resp, 30);
      code != kExitOk) {
    return code;
  }
  if (g.json) {
    std::string out = "{\"jobs\": [";
    for (int i = 0; i < resp.jobs_size(); ++i) {
      if (i) out += ",\n  ";
      out += jobSummaryJson(resp.jobs(i));
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return kExitOk;
  }
  if (resp.jobs_size() == 0) {
    std::puts(
        "no jobs yet (a job's ranks are recorded with: tidemark run -- torchrun "
        "--nproc_per_node=N train.py)");
    return kExitOk;
  }
  std::printf("%5s  %-19s  %5s  %6s  %4s  %s\n", "JOB", "STARTED (UTC)", "WORLD", "RANKS", "LIVE",
              "KEY");
  for (const v1::JobSummary& j : resp.jobs()) {
    std::printf("%5llu  %-19s  %5s  %6u  %4u  %s\n", static_cast<unsigned long long>(j.id()),
                wallTime(j.start_wall_ns()).c_str(),
                j.world_size() > 0 ? std::to_string(j.world_size()).c_str() : "?",
                j.ranks_recorded(), j.ranks_live(), j.key().c_str());
  }
  return kExitOk;
}

int jobCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  if (wantsHelp(args, kJobUsage)) return kExitOk;
  if (args.size() != 1) {
    std::fputs(kJobUsage, stderr);
    return kExitUsage;
  }
  v1::Job job;
  if (int code = fetchJob(g, "job", args.front(), &job); code != kExitOk) return code;
  if (g.json) {
    std::string out = "{\"job\": " + jobSummaryJson(job.job()) +
                      ", \"memory_rank\": " + std::to_string(job.memory_rank()) +
                      ", \"memory_session_id\": " + std::to_string(job.memory_session_id()) +
                      ", \"peak_imbalance\": " + std::to_string(job.peak_imbalance()) +
                      ", \"step_time_imbalance\": " + std::to_string(job.step_time_imbalance()) +
                      ", \"missing_ranks\": [";
    for (int i = 0; i < job.missing_ranks_size(); ++i) {
      out += (i ? ", " : "") + std::to_string(job.missing_ranks(i));
    }
    out += "], \"ranks\": [";
    for (int i = 0; i < job.ranks_size(); ++i) {
      const v1::JobRank& r = job.ranks(i);
      if (i) out += ",\n  ";
      out += "{\"rank\": " + std::to_string(r.session().rank()) +
             ", \"local_rank\": " + std::to_string(r.session().local_rank()) +
             ", \"steps\": " + std::to_string(r.steps()) +
             ", \"median_step_ns\": " + std::to_string(r.median_step_ns()) +
             ", \"ended_early\": " + (r.ended_early() ? "true" : "false") +
             ", \"failed\": " + (r.failed() ? "true" : "false") +
             ", \"peak\": " + (r.has_peak() ? breakdownJson(r.peak()) : "null") + ", \"session\": ";
      printSessionJson(r.session(), out);
      out += "}";
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return kExitOk;
  }
  const v1::JobSummary& j = job.job();
  std::printf("job %llu (%s), started %s UTC: %u rank%s recorded",
              static_cast<unsigned long long>(j.id()), j.key().c_str(),
              wallTime(j.start_wall_ns()).c_str(), j.ranks_recorded(),
              j.ranks_recorded() == 1 ? "" : "s");
  if (j.world_size() > 0) std::printf(" of %d", j.world_size());
  if (j.ranks_live() > 0) std::printf(", %u live", j.ranks_live());
  std::puts("");
  std::printf("%4s  %7s  %-16s  %-7s  %5s  %9s  %10s  %10s  %10s  %10s  %10s\n", "RANK", "SESSION",
              "HOST", "STATE", "STEPS", "STEP (ms)", "PEAK", "WEIGHT", "GRADIENT", "OPTIMIZER",
              "ACTIVATION");
  for (const v1::JobRank& r : job.ranks()) {
    const v1::SessionInfo& s = r.session();
    std::string host = s.hostname();
    if (host.size() > 16) host = host.substr(0, 13) + "...";
    const char* state = r.failed() ? "failed" : r.ended_early() ? "early" : stateName(s.state());
    const auto bytes = [&](v1::Category c) {
      return r.has_peak() ? humanBytes(categoryBytes(r.peak(), c)) : std::string("-");
    };
    std::printf("%4s  %7llu  %-16s  %-7s  %5lld  %9.1f  %10s  %10s  %10s  %10s  %10s%s\n",
                rankText(s.rank()).c_str(), static_cast<unsigned long long>(s.id()), host.c_str(),
                state, static_cast<long long>(r.steps()),
                static_cast<double>(r.median_step_ns()) / 1e6,
                r.has_peak() ? humanBytes(r.peak().tracked_bytes()).c_str() : "-",
                bytes(v1::CATEGORY_WEIGHT).c_str(), bytes(v1::CATEGORY_GRADIENT).c_str(),
                bytes(v1::CATEGORY_OPTIMIZER_STATE).c_str(), bytes(v1::CATEGORY_ACTIVATION).c_str(),
                s.id() == job.memory_session_id() ? "  <- memory need" : "");
  }
  if (job.memory_session_id() != 0) {
    std::printf("\nthe job's memory need is set by rank %s (session %llu)\n",
                rankText(job.memory_rank()).c_str(),
                static_cast<unsigned long long>(job.memory_session_id()));
  }
  if (job.peak_imbalance() > 0) {
    std::printf("imbalance: peak %.3fx (highest / lowest)", job.peak_imbalance());
    if (job.step_time_imbalance() > 0) {
      std::printf(", step time %.3fx (slowest / fastest median)", job.step_time_imbalance());
    }
    std::puts("");
  }
  if (job.missing_ranks_size() > 0) {
    std::string missing;
    for (int r : job.missing_ranks()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    std::printf("ranks never recorded: %s\n", missing.c_str());
  }
  return kExitOk;
}

}  // namespace tidemark::cli
