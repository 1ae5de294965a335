// The advisor on a training job (docs/jobs.md): a plan made from one rank (the one that sets the
// job's memory need, or --rank), applied on every running rank from the same step on, and each
// rank's plans checked.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/job_commands.h"
#include "cli/plan_outcomes.h"
#include "src/advisor/plan_json.h"
#include "tidemark/v1/control.grpc.pb.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

namespace {

std::string rankName(int32_t rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : std::string("rank ?");
}

// A running rank's last step and recent step time (core::jobApplyStep).
int rankProgress(const GlobalOptions& g, uint64_t session, core::RankProgress* out) {
  v1::StepsRequest req;
  req.set_session_id(session);
  // The last step and the last few closed ones are all it reads.
  req.set_last(true);
  req.set_max_steps(16);
  v1::Steps steps;
  if (int code = callQuery(g, "apply", &v1::Query::Stub::GetSteps, req, &steps, 30);
      code != kExitOk) {
    return code;
  }
  std::vector<core::StepSpan> spans;
  for (const v1::StepSummary& s : steps.steps())
    spans.push_back({s.step(), s.begin_ts_ns(), s.end_ts_ns()});
  *out = core::rankProgress(spans);
  return kExitOk;
}

}  // namespace

bool takeJobOption(const GlobalOptions& g, const char* command, std::vector<std::string>* args,
                   int* code) {
  std::string job, rank;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if ((a == "--job" || a == "--rank") && i + 1 < args->size()) {
      (a == "--job" ? job : rank) = (*args)[++i];
    } else if (a == "--job" || a == "--rank") {
      std::fprintf(stderr, "tidemark %s: %s needs a value\n", command, a.c_str());
      *code = kExitUsage;
      return false;
    } else {
      rest.push_back(a);
    }
  }
  if (job.empty()) {
    if (!rank.empty()) {
      std::fprintf(stderr, "tidemark %s: --rank goes with --job\n", command);
      *code = kExitUsage;
      return false;
    }
    return true;
  }
  v1::Job j;
  if (int c = fetchJob(g, command, job, &j); c != kExitOk) {
    *code = c;
    return false;
  }
  uint64_t session = j.memory_session_id();
  int32_t chosen = j.memory_rank();
  if (!rank.empty()) {
    char* end = nullptr;
    const long r = std::strtol(rank.c_str(), &end, 10);
    session = 0;
    for (const v1::JobRank& jr : j.ranks()) {
      if (*end == '\0' && jr.session().rank() == r) session = jr.session().id();
    }
    chosen = static_cast<int32_t>(r);
    if (session == 0) {
      std::fprintf(stderr, "tidemark %s: job %llu has no rank '%s'\n", command,
                   static_cast<unsigned long long>(j.job().id()), rank.c_str());
      *code = kExitError;
      return false;
    }
  } else if (session == 0) {
    std::fprintf(stderr, "tidemark %s: job %llu has no rank with memory recorded yet\n", command,
                 static_cast<unsigned long long>(j.job().id()));
    *code = kExitError;
    return false;
  }
  std::fprintf(stderr, "tidemark %s: job %llu, %s (session %llu)%s\n", command,
               static_cast<unsigned long long>(j.job().id()), rankName(chosen).c_str(),
               static_cast<unsigned long long>(session),
               rank.empty() ? ": the rank that sets the job's memory need" : "");
  rest.push_back(std::to_string(session));
  *args = std::move(rest);
  return true;
}

int applyToJob(const GlobalOptions& g, const std::vector<std::string>& args) {
  static const char* kUsage =
      "usage: tidemark apply --job JOB PLAN [--at-step N] [--no-wait | --wait SECONDS] [--json]\n\n"
      "Sends the plan document PLAN to every running rank of JOB (a job id, or a key): each\n"
      "rank's adapter applies it at the boundary before step N, so that all ranks switch at the\n"
      "same step; by default N is far enough after the furthest rank's step for the plan to reach\n"
      "every rank first: 3 steps, or 5 seconds at the fastest rank's pace when that is more.\n"
      "Waits (default 120 s) until every rank says it applied or refused the plan. Exit code 1\n"
      "when a rank refused it, did not answer in time, or applied it from another step.\n"
      "`tidemark plan --job JOB` makes a plan from the rank that sets the job's memory need;\n"
      "`tidemark plan-check --job JOB` compares.\n";
  std::string job, planFile;
  int64_t atStep = 0;
  int waitS = 120;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool hasValue = i + 1 < args.size();
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (a == "--job" && hasValue) {
      job = args[++i];
    } else if (a == "--at-step" && hasValue) {
      char* end = nullptr;
      atStep = std::strtoll(args[++i].c_str(), &end, 10);
      if (*end != '\0' || atStep < 1) {
        std::fprintf(stderr, "tidemark apply: --at-step needs a step number (1 or more)\n");
        return kExitUsage;
      }
    } else if (a == "--no-wait") {
      waitS = 0;
    } else if (a == "--wait" && hasValue) {
      const std::string& v = args[++i];
      if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
        std::fprintf(stderr, "tidemark apply: --wait needs a number of seconds\n");
        return kExitUsage;
      }
      waitS = std::atoi(v.c_str());
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "tidemark apply: unknown option or missing value '%s'\n%s", a.c_str(),
                   kUsage);
      return kExitUsage;
    } else if (planFile.empty()) {
      planFile = a;
    } else {
      std::fprintf(stderr, "tidemark apply: unexpected argument '%s'\n", a.c_str());
      return kExitUsage;
    }
  }
  if (job.empty() || planFile.empty()) {
    std::fprintf(stderr, "tidemark apply: needs --job JOB and PLAN\n%s", kUsage);
    return kExitUsage;
  }
  std::string text;
  if (!readPlanFile("apply", planFile, &text)) return kExitUsage;
  v1::Job j;
  if (int code = fetchJob(g, "apply", job, &j); code != kExitOk) return code;
  std::vector<const v1::JobRank*> running;
  for (const v1::JobRank& r : j.ranks())
    if (r.session().state() == v1::SESSION_STATE_LIVE) running.push_back(&r);
  if (running.empty()) {
    std::fprintf(stderr, "tidemark apply: job %llu has no running rank\n",
                 static_cast<unsigned long long>(j.job().id()));
    return kExitError;
  }
  if (atStep == 0) {
    const auto reading = std::chrono::steady_clock::now();
    std::vector<core::RankProgress> progress;
    for (const v1::JobRank* r : running) {
      core::RankProgress p;
      if (int code = rankProgress(g, r->session().id(), &p); code != kExitOk) return code;
      progress.push_back(p);
    }
    atStep = core::jobApplyStep(progress, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - reading)
                                              .count());
  }
  auto stampedPlan = core::withApplyAtStep(text, atStep);
  if (!stampedPlan.ok()) {
    std::fprintf(stderr, "tidemark apply: %s\n",
                 std::string(stampedPlan.status().message()).c_str());
    return kExitUsage;
  }
  const std::string& stamped = *stampedPlan;

  struct Sent {
    const v1::JobRank* rank;
    uint64_t planId = 0;
    v1::PlanOutcome outcome;
    std::string error;  // the daemon did not take it
  };
  std::vector<Sent> sent;
  for (const v1::JobRank* r : running) {
    Sent s{r, 0, {}, {}};
    v1::ApplyPlanRequest req;
    req.set_session_id(r->session().id());
    req.set_plan_json(stamped);
    v1::ApplyPlanResponse resp;
    GlobalOptions quiet = g;
    if (int code =
            callRpc<v1::Control>(quiet, "apply", &v1::Control::Stub::ApplyPlan, req, &resp, 30);
        code != kExitOk) {
      s.error = "not sent (the daemon refused it: see above)";
    } else {
      s.planId = resp.plan_id();
      s.outcome.set_plan_id(resp.plan_id());
      s.outcome.set_state(v1::PLAN_STATE_SENT);
    }
    sent.push_back(std::move(s));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(waitS);
  while (waitS > 0) {
    bool waiting = false;
    for (Sent& s : sent) {
      if (s.planId == 0 || s.outcome.state() != v1::PLAN_STATE_SENT) continue;
      v1::PlanCheckResponse check;
      if (int c = callPlanCheck(g, "apply", s.rank->session().id(), &check); c != kExitOk) return c;
      for (const v1::PlanOutcome& o : check.plans())
        if (o.plan_id() == s.planId) s.outcome = o;
      waiting = waiting || s.outcome.state() == v1::PLAN_STATE_SENT;
    }
    if (!waiting || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  bool allAtStep = true;
  std::string json = "{\"job\": " + std::to_string(j.job().id()) +
                     ", \"at_step\": " + std::to_string(atStep) + ", \"ranks\": [";
  if (!g.json) {
    std::printf("plan sent to %zu running rank%s of job %llu, to apply from step %lld\n",
                sent.size(), sent.size() == 1 ? "" : "s",
                static_cast<unsigned long long>(j.job().id()), static_cast<long long>(atStep));
  }
  for (size_t i = 0; i < sent.size(); ++i) {
    const Sent& s = sent[i];
    const v1::PlanOutcome& o = s.outcome;
    const bool ok = s.planId != 0 && o.state() == v1::PLAN_STATE_APPLIED && o.from_step() == atStep;
    allAtStep = allAtStep && ok;
    std::string what = !s.error.empty() ? s.error
                       : o.state() == v1::PLAN_STATE_APPLIED
                           ? "applied from step " + std::to_string(o.from_step())
                       : o.state() == v1::PLAN_STATE_REFUSED ? "refused: " + o.message()
                       : waitS > 0 ? "no answer within " + std::to_string(waitS) + " s"
                                   : "sent";
    json += std::string(i ? ", " : "") + "{\"rank\": " + std::to_string(s.rank->session().rank()) +
            ", \"session\": " + std::to_string(s.rank->session().id()) +
            ", \"plan_id\": " + std::to_string(s.planId) + ", \"state\": \"" +
            (s.planId == 0 ? "not sent" : planStateName(o.state())) +
            "\", \"from_step\": " + std::to_string(o.from_step()) +
            ", \"message\": " + jsonString(s.error.empty() ? o.message() : s.error) + "}";
    if (!g.json) {
      std::printf("  %s (session %llu): plan %llu %s\n", rankName(s.rank->session().rank()).c_str(),
                  static_cast<unsigned long long>(s.rank->session().id()),
                  static_cast<unsigned long long>(s.planId), what.c_str());
    }
  }
  for (const v1::JobRank& r : j.ranks()) {
    if (r.session().state() == v1::SESSION_STATE_LIVE || g.json) continue;
    std::printf("  %s (session %llu): not running, not sent\n",
                rankName(r.session().rank()).c_str(),
                static_cast<unsigned long long>(r.session().id()));
  }
  if (g.json) std::printf("%s]}\n", json.c_str());
  if (waitS == 0) return kExitOk;
  if (!allAtStep) {
    std::fprintf(stderr,
                 "tidemark apply: not every running rank applied the plan from step %lld; see "
                 "tidemark plan-check --job %s\n",
                 static_cast<long long>(atStep), job.c_str());
    return kExitError;
  }
  return kExitOk;
}

int planCheckOfJob(const GlobalOptions& g, const std::vector<std::string>& args) {
  static const char* kUsage =
      "usage: tidemark plan-check --job JOB [--json]\n\n"
      "Each rank's plans (tidemark apply --job): predicted against measured, rank by rank.\n";
  std::string job;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-h" || args[i] == "--help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (args[i] == "--job" && i + 1 < args.size()) {
      job = args[++i];
    } else {
      std::fprintf(stderr, "tidemark plan-check: unexpected argument '%s'\n%s", args[i].c_str(),
                   kUsage);
      return kExitUsage;
    }
  }
  if (job.empty()) {
    std::fprintf(stderr, "tidemark plan-check: --job needs a job\n");
    return kExitUsage;
  }
  v1::Job j;
  if (int code = fetchJob(g, "plan-check", job, &j); code != kExitOk) return code;
  std::string json = "{\"job\": " + std::to_string(j.job().id()) + ", \"ranks\": [";
  for (int i = 0; i < j.ranks_size(); ++i) {
    const v1::SessionInfo& s = j.ranks(i).session();
    v1::PlanCheckResponse resp;
    if (int c = callPlanCheck(g, "plan-check", s.id(), &resp); c != kExitOk) return c;
    if (g.json) {
      json += std::string(i ? ",\n  " : "\n  ") + "{\"rank\": " + std::to_string(s.rank()) +
              ", \"session\": " + std::to_string(s.id()) +
              ", \"plans\": " + planOutcomesJson(resp) + "}";
      continue;
    }
    std::printf("%s (session %llu):\n", rankName(s.rank()).c_str(),
                static_cast<unsigned long long>(s.id()));
    printPlanOutcomes(s.id(), resp);
  }
  if (g.json) std::printf("%s]}\n", json.c_str());
  return kExitOk;
}

}  // namespace tidemark::cli
