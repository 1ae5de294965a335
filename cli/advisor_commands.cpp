// `tidemark plan` and `tidemark pareto`: the recompute advisor, on a recorded session (through
// tidemarkd's Advisor service) or on a chain profile file (computed here, no server needed).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/job_commands.h"
#include "cli/plan_outcomes.h"
#include "src/advisor/megatron_flags.h"
#include "src/advisor/plan_json.h"
#include "src/advisor/planner.h"
#include "tidemark/v1/advisor.grpc.pb.h"
#include "tidemark/v1/control.grpc.pb.h"

namespace tidemark::cli {

namespace {

// What plan and pareto read from their arguments.
struct AdvisorArgs {
  bool haveSession = false;
  uint64_t session = 0;
  std::string profileFile;
  std::string budget;
  std::string strategy = "optimal";
  std::string blocks;
  std::string outFile;
  int64_t step = 0;
  // Sessions whose recorded re-runs time the recomputation (trainings of the job under a plan).
  std::vector<uint64_t> rerunTimesFrom;
  int points = 24;
  double margin = core::kDefaultMarginFraction;
  bool nested = false;
  bool megatron = false;              // plan: Megatron-LM's flags beside the plan
  std::string offload;                // a link speed ("25GB/s"), or empty
  int64_t offloadBytesPerSecond = 0;  // the same, parsed
};

bool readFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// Parses the arguments shared by plan and pareto; false with *code set when they are wrong.
bool parseAdvisorArgs(const char* command, const char* usage, const std::vector<std::string>& args,
                      bool wantBudget, AdvisorArgs* a, int* code) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "tidemark %s: %s needs a value\n", command, arg.c_str());
        return false;
      }
      *out = args[++i];
      return true;
    };
    std::string v;
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage, stdout);
      *code = kExitOk;
      return false;
    } else if (arg == "--profile" || arg == "--budget" || arg == "--strategy" ||
               arg == "--blocks" || arg == "--out" || arg == "-o" || arg == "--step" ||
               arg == "--points" || arg == "--margin" || arg == "--rerun-times-from" ||
               (arg == "--offload" && std::string(command) != "chain")) {
      if (!value(&v)) {
        *code = kExitUsage;
        return false;
      }
      if (arg == "--profile") a->profileFile = v;
      if (arg == "--budget") a->budget = v;
      if (arg == "--strategy") a->strategy = v;
      if (arg == "--blocks") a->blocks = v;
      if (arg == "--out" || arg == "-o") a->outFile = v;
      if (arg == "--offload") {
        absl::StatusOr<int64_t> speed = core::parseSpeed(v);
        if (!speed.ok()) {
          std::fprintf(stderr, "tidemark %s: --offload: %s\n", command,
                       std::string(speed.status().message()).c_str());
          *code = kExitUsage;
          return false;
        }
        a->offload = v;
        a->offloadBytesPerSecond = *speed;
      }
      if (arg == "--margin") {
        char* end = nullptr;
        const double pct = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !(pct >= 0 && pct < 50)) {
          std::fprintf(stderr, "tidemark %s: --margin needs a percentage in [0, 50), got '%s'\n",
                       command, v.c_str());
          *code = kExitUsage;
          return false;
        }
        a->margin = pct / 100.0;
      }
      if (arg == "--rerun-times-from") {
        for (absl::string_view part : absl::StrSplit(v, ',')) {
          const std::string id(part);
          uint64_t session = 0;
          if (!parseSessionId(id, &session)) {
            std::fprintf(stderr, "tidemark %s: --rerun-times-from: '%s' is not a session id\n",
                         command, id.c_str());
            *code = kExitUsage;
            return false;
          }
          a->rerunTimesFrom.push_back(session);
        }
      }
      if (arg == "--step" || arg == "--points") {
        char* end = nullptr;
        const long long n = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1) {
          std::fprintf(stderr, "tidemark %s: %s needs a positive integer, got '%s'\n", command,
                       arg.c_str(), v.c_str());
          *code = kExitUsage;
          return false;
        }
        if (arg == "--step") a->step = n;
        if (arg == "--points") a->points = static_cast<int>(std::min<long long>(n, 100000));
      }
    } else if (arg == "--nested" && std::string(command) != "chain") {
      a->nested = true;
    } else if (arg == "--megatron" && std::string(command) == "plan") {
      a->megatron = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "tidemark %s: unknown option '%s'\n%s", command, arg.c_str(), usage);
      *code = kExitUsage;
      return false;
    } else if (!acceptSessionArg(command, arg, &a->haveSession, &a->session, code)) {
      return false;
    }
  }
  if (a->haveSession == !a->profileFile.empty()) {
    std::fprintf(stderr, "tidemark %s: give either a SESSION or --profile FILE\n%s", command,
                 usage);
    *code = kExitUsage;
    return false;
  }
  if (!a->rerunTimesFrom.empty() && !a->profileFile.empty()) {
    std::fprintf(stderr, "tidemark %s: --rerun-times-from needs a SESSION, not --profile\n",
                 command);
    *code = kExitUsage;
    return false;
  }
  if (wantBudget && a->budget.empty()) {
    std::fprintf(stderr, "tidemark %s: --budget is required\n%s", command, usage);
    *code = kExitUsage;
    return false;
  }
  return true;
}

// Reads and checks a profile file; prints why not and returns false.
bool loadProfile(const char* command, const std::string& path, core::ChainProfile* out) {
  std::string text;
  if (!readFile(path, &text)) {
    std::fprintf(stderr, "tidemark %s: cannot read %s\n", command, path.c_str());
    return false;
  }
  absl::StatusOr<core::ChainProfile> p = core::parseChainProfile(text);
  if (!p.ok()) {
    std::fprintf(stderr, "tidemark %s: %s: %s\n", command, path.c_str(),
                 std::string(p.status().message()).c_str());
    return false;
  }
  *out = std::move(*p);
  return true;
}

v1::ChainSelector selector(const AdvisorArgs& a) {
  v1::ChainSelector s;
  s.set_session_id(a.session);
  s.set_step(a.step);
  s.set_blocks(a.blocks);
  for (uint64_t id : a.rerunTimesFrom) s.add_rerun_times_from(id);
  return s;
}

// A plan's segments, one line each (consecutive stored ones as one run); a nested recomputed
// segment's inner segments below it, indented: its re-run follows them.
void printSegments(const std::vector<core::PlanSegmentDoc>& segments, int depth) {
  for (size_t k = 0; k < segments.size(); ++k) {
    const core::PlanSegmentDoc& s = segments[k];
    std::string last = s.modules.back();
    size_t count = s.modules.size();
    while (s.mode == "store" && k + 1 < segments.size() && segments[k + 1].mode == "store") {
      last = segments[++k].modules.back();
      count += segments[k].modules.size();
    }
    std::string mods = s.modules.front();
    if (count > 1) mods += " .. " + last + " (" + std::to_string(count) + ")";
    if (s.mode == "selective") mods += "  (option " + s.option + ")";
    if (!s.inner.empty()) mods += "  (re-run as below)";
    const std::string mode = std::string(2 * depth, ' ') + s.mode;
    std::printf("%-10s %s\n", mode.c_str(), mods.c_str());
    printSegments(s.inner, depth + 1);
  }
}

// For a job that checkpoints already, what its recorded step ran (the document's
// source.as_recorded) is a third column beside the plan and store-all.
void printPlan(const core::PlanDocument& d) {
  const core::PlanSource::AsRecorded& ran = d.source.asRecorded;
  std::printf("plan: %s, budget %s (%s bytes)%s\n", d.strategy.c_str(),
              humanBytes(d.budgetBytes).c_str(), groupDigits(d.budgetBytes).c_str(),
              d.feasible ? "" : "  -- DOES NOT FIT");
  if (!d.source.session.empty())
    std::printf("from: session %s, step %lld\n", d.source.session.c_str(),
                static_cast<long long>(d.source.step));
  else if (!d.source.profile.empty())
    std::printf("from: %s\n", d.source.profile.c_str());
  if (ran.plan.empty()) {
    std::printf("\n%-28s %14s   %s\n", "", "PLAN", "STORE-ALL");
    std::printf("%-28s %14s   %s\n", "predicted peak", humanBytes(d.predictedPeakBytes).c_str(),
                humanBytes(d.baselinePeakBytes).c_str());
    std::printf("%-28s %14s   %s\n", "step time", msText(d.predictedStepNs).c_str(),
                msText(d.baselineStepNs).c_str());
  } else {
    // The job checkpoints already: what it ran, beside the plan and storing everything.
    std::printf("\n%-28s %14s %14s %14s\n", "", "PLAN", "AS RECORDED", "STORE-ALL");
    std::printf("%-28s %14s %14s %14s\n", "predicted peak",
                humanBytes(d.predictedPeakBytes).c_str(), humanBytes(ran.peakBytes).c_str(),
                humanBytes(d.baselinePeakBytes).c_str());
    std::printf("%-28s %14s %14s %14s\n", "step time", msText(d.predictedStepNs).c_str(),
                msText(ran.stepNs).c_str(), msText(d.baselineStepNs).c_str());
    std::printf("%-28s %14s %14s\n", "recomputation per step", msText(d.predictedExtraNs).c_str(),
                msText(ran.extraNs).c_str());
    std::printf("%-28s %14s %14s\n", "blocks (S stored, R re-run)", "", ran.plan.c_str());
  }
  std::printf("%-28s %14s   (%s%+.1f %%; no plan within the budget adds less than %s)\n",
              ran.plan.empty() ? "recomputation per step" : "",
              ran.plan.empty() ? msText(d.predictedExtraNs).c_str() : "",
              ran.plan.empty() ? "" : "the plan: ", 100.0 * d.predictedOverhead,
              msText(d.lowerBoundExtraNs).c_str());
  std::printf(
      "%-28s %14s   (%s)\n", "the peak is at", "",
      (d.predictedPeakPhase + (d.predictedPeakStage.empty() ? "" : " of " + d.predictedPeakStage))
          .c_str());
  std::printf("%-28s %14s\n", "static (outside the chain)", humanBytes(d.staticBytes).c_str());
  std::printf("%-28s %14s\n", "least feasible budget",
              humanBytes(d.minFeasibleBudgetBytes).c_str());
  if (d.epsilonBytes > 0)
    std::printf(
        "%-28s %14s   (a long chain, solved on a grid: no plan within the budget less\n"
        "%-28s %14s    this recomputes less)\n",
        "optimal within", humanBytes(d.epsilonBytes).c_str(), "", "");
  if (d.marginBytes > 0 && d.marginMet) {
    std::printf("%-28s %14s   (chosen to fit %s)\n", "safety margin",
                humanBytes(d.marginBytes).c_str(),
                humanBytes(d.budgetBytes - d.marginBytes).c_str());
  } else if (d.marginBytes > 0 && d.feasible) {
    std::printf("%-28s %14s   (not met: the plan keeps %s below the budget)\n", "safety margin",
                humanBytes(d.marginBytes).c_str(),
                humanBytes(d.budgetBytes - d.predictedPeakBytes).c_str());
  }
  std::printf("\n%-10s %s\n", "MODE", "MODULES");
  printSegments(d.segments, 0);
  for (const std::string& w : d.warnings) std::printf("\nwarning: %s\n", w.c_str());
}

// Prints (or writes) the plan and returns the exit code: kExitInfeasible when it does not fit.
// Megatron-LM's flag set beside the plan (src/advisor/megatron_flags.h), as text.
void printMegatron(const std::string& json, const core::PlanDocument& plan) {
  const nlohmann::json m = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return;
  const std::string flags = m.value("flags", "");
  const int64_t peak = m["predicted"].value("peak_bytes", int64_t{0});
  const int64_t extra = m["predicted"].value("extra_ns", int64_t{0});
  std::printf("\nMegatron-LM flags (%s of %d flag sets): %s\n",
              m.value("fits", false) ? "the cheapest that fits" : "none fits; the lowest peak",
              m.value("candidates", 0), flags.empty() ? "(none: no recomputation)" : flags.c_str());
  std::printf("  predicted peak %s, +%.1f ms per step; this plan +%.1f ms (%s)\n",
              humanBytes(peak).c_str(), extra / 1e6, plan.predictedExtraNs / 1e6,
              m.value("plan_expressible", false) ? "a flag set too"
                                                 : "per-block choices no flag set makes");
  if (const std::string note = m.value("note", ""); !note.empty())
    std::printf("  %s\n", note.c_str());
}

int finishPlan(const AdvisorArgs& a, const GlobalOptions& g, const std::string& json,
               const std::string& megatronJson = {}) {
  absl::StatusOr<core::PlanDocument> d = core::parsePlanDocument(json);
  if (!d.ok()) {
    std::fprintf(stderr, "tidemark plan: the plan document does not read back: %s\n",
                 std::string(d.status().message()).c_str());
    return kExitError;
  }
  if (!a.outFile.empty()) {
    std::ofstream out(a.outFile, std::ios::binary | std::ios::trunc);
    if (!(out << json)) {
      std::fprintf(stderr, "tidemark plan: cannot write %s\n", a.outFile.c_str());
      return kExitError;
    }
  }
  if (g.json && !megatronJson.empty()) {
    // Both: the plan document and the flags, side by side.
    nlohmann::ordered_json both;
    both["plan"] = nlohmann::ordered_json::parse(json);
    both["megatron"] = nlohmann::ordered_json::parse(megatronJson);
    std::fputs((both.dump(2) + "\n").c_str(), stdout);
  } else if (g.json) {
    std::fputs(json.c_str(), stdout);
  } else {
    printPlan(*d);
    if (!megatronJson.empty()) printMegatron(megatronJson, *d);
    if (!a.outFile.empty()) std::printf("\nwritten to %s\n", a.outFile.c_str());
  }
  if (!d->feasible) {
    std::fprintf(stderr,
                 "tidemark plan: no %s plan fits %s; the least budget any plan fits is %s "
                 "(%s bytes)\n",
                 d->strategy.c_str(), humanBytes(d->budgetBytes).c_str(),
                 humanBytes(d->minFeasibleBudgetBytes).c_str(),
                 groupDigits(d->minFeasibleBudgetBytes).c_str());
    return kExitInfeasible;
  }
  return kExitOk;
}

}  // namespace

int planCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  static const char* kUsage =
      "usage: tidemark plan (SESSION | --job JOB [--rank R] | --profile FILE) --budget SIZE\n"
      "                     [--strategy S] [--step N] [--blocks PREFIXES] [--margin PCT]\n"
      "                     [--nested] [--offload SPEED] [--megatron] [--rerun-times-from S]\n"
      "                     [--out FILE] [--json]\n\n"
      "A recompute plan that fits SIZE (6GiB, 512MiB, 1.5GB, bytes, or 70% of the store-all\n"
      "peak above the static memory) with the least recomputation, its predicted peak and step\n"
      "time. Strategies: optimal (default), greedy, sqrt-n, checkpoint-all, store-all.\n"
      "SESSION plans a recorded step (the last complete one, or --step N) on the server;\n"
      "--job plans the session of the job's rank R, by default of the rank that sets the job's\n"
      "memory need (docs/jobs.md), for `tidemark apply --job`.\n"
      "--profile plans a chain profile file here (docs/chain-model.md). --blocks names the\n"
      "modules the chain is made of by their prefixes: one, a comma-separated list, or glob\n"
      "patterns ('ResNet.layer*'); default: found from the recording.\n"
      "--margin: plans are chosen to fit PCT % under the budget (default 1), for the small\n"
      "blocks a measured peak holds that the model does not see.\n"
      "--nested lets the optimal plan nest recomputed segments (a segment's re-run checkpoints\n"
      "parts of itself again), on chains of up to 64 blocks: less memory for more recomputation\n"
      "(docs/chain-model.md). Applying such a plan needs torch 2 (nested non-reentrant\n"
      "checkpoints); the adapter refuses it on torch 1.13.\n"
      "--offload SPEED (25GB/s) lets plans move a block's activations to host memory after its\n"
      "forward and back for its backward, over a link of that speed (a GPU job).\n"
      "--rerun-times-from S[,S...]: time the recomputation by the blocks' recorded re-runs in\n"
      "these sessions (the same job trained under a plan), pooled, not by their forwards; a\n"
      "block re-run under an op-level option times that option (docs/plan-format.md).\n"
      "--megatron also prints the cheapest of Megatron-LM's recomputation flag sets that fits\n"
      "(--recompute-granularity, --recompute-method, --recompute-num-layers; the chain's\n"
      "blocks taken as Megatron's layers), simulated like any plan, beside this plan.\n"
      "--out writes the plan document (docs/plan-format.md); --json prints it (with --megatron:\n"
      "{\"plan\": the document, \"megatron\": the flags}).\n"
      "Exit code 4 when no plan fits the budget (the least feasible budget is named).\n";
  AdvisorArgs a;
  int code = kExitOk;
  std::vector<std::string> args = argsIn;
  if (!takeJobOption(g, "plan", &args, &code)) return code;
  if (!parseAdvisorArgs("plan", kUsage, args, /*wantBudget=*/true, &a, &code)) return code;
  if (!a.profileFile.empty()) {
    core::ChainProfile profile;
    if (!loadProfile("plan", a.profileFile, &profile)) return kExitUsage;
    if (!a.offload.empty()) profile.offloadBytesPerSecond = a.offloadBytesPerSecond;
    absl::StatusOr<core::BudgetSpec> budget = core::parseBudget(a.budget);
    absl::StatusOr<core::Strategy> strategy = core::parseStrategy(a.strategy);
    for (const absl::Status& s : {budget.status(), strategy.status()}) {
      if (!s.ok()) {
        std::fprintf(stderr, "tidemark plan: %s\n", std::string(s.message()).c_str());
        return kExitUsage;
      }
    }
    core::PlanReport report = core::makePlan(profile, core::resolveBudget(*budget, profile),
                                             *strategy, a.margin, nullptr, a.nested);
    report.source.profile = a.profileFile;
    const std::string megatron =
        a.megatron ? core::megatronToJson(core::megatronExport(profile, report.budgetBytes,
                                                               report.marginBytes, report.plan))
                   : std::string();
    return finishPlan(a, g, core::planToJson(profile, report), megatron);
  }
  v1::PlanRequest req;
  *req.mutable_chain() = selector(a);
  req.set_budget(a.budget);
  req.set_strategy(a.strategy);
  req.set_margin(a.margin);
  req.set_nested(a.nested);
  req.set_offload(a.offload);
  req.set_megatron(a.megatron);
  v1::PlanResponse resp;
  if (int code = callRpc<v1::Advisor>(g, "plan", &v1::Advisor::Stub::Plan, req, &resp, 120);
      code != kExitOk)
    return code;
  return finishPlan(a, g, resp.plan_json(), resp.megatron_json());
}

int chainCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  static const char* kUsage =
      "usage: tidemark chain SESSION [--step N] [--blocks PREFIXES] [--rerun-times-from S]\n"
      "                      [--out FILE] [--json]\n\n"
      "The chain profile the advisor builds from a recorded step (docs/chain-model.md): per\n"
      "block, its times, saved, output and working bytes, and the memory outside the chain;\n"
      "checked against the recording (the plan that ran, its predicted and measured peak).\n"
      "--rerun-times-from S[,S...]: re-run times from these sessions' re-runs (as `plan`).\n"
      "--out writes the profile file, which `tidemark plan --profile` reads.\n";
  AdvisorArgs a;
  int code = kExitOk;
  std::vector<std::string> args = argsIn;
  if (!takeJobOption(g, "chain", &args, &code)) return code;
  if (!parseAdvisorArgs("chain", kUsage, args, /*wantBudget=*/false, &a, &code)) return code;
  if (!a.profileFile.empty()) {
    std::fprintf(stderr, "tidemark chain: takes a SESSION, not --profile\n");
    return kExitUsage;
  }
  v1::ChainProfileRequest req;
  *req.mutable_chain() = selector(a);
  v1::ChainProfileResponse resp;
  if (int code =
          callRpc<v1::Advisor>(g, "chain", &v1::Advisor::Stub::GetChainProfile, req, &resp, 120);
      code != kExitOk)
    return code;
  if (!a.outFile.empty() || g.json) {
    // The profile, with the check beside it (`recorded`; a profile reader passes over it).
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(resp.profile_json());
    doc["recorded"] = {{"step", resp.step()},
                       {"plan", resp.recorded_plan()},
                       {"predicted_peak_bytes", resp.recorded_predicted_peak_bytes()},
                       {"measured_peak_bytes", resp.recorded_measured_peak_bytes()},
                       {"measured_step_ns", resp.measured_step_ns()}};
    if (resp.recorded_carried_peak_bytes() > 0)
      doc["recorded"]["carried_peak_bytes"] = resp.recorded_carried_peak_bytes();
    const std::string text = doc.dump(2) + "\n";
    if (!a.outFile.empty()) {
      std::ofstream out(a.outFile, std::ios::binary | std::ios::trunc);
      if (!(out << text)) {
        std::fprintf(stderr, "tidemark chain: cannot write %s\n", a.outFile.c_str());
        return kExitError;
      }
    }
    if (g.json) {
      std::fputs(text.c_str(), stdout);
      return kExitOk;
    }
  }
  absl::StatusOr<core::ChainProfile> p = core::parseChainProfile(resp.profile_json());
  if (!p.ok()) {
    std::fprintf(stderr, "tidemark chain: the profile does not read back: %s\n",
                 std::string(p.status().message()).c_str());
    return kExitError;
  }
  // A step that made what the later steps hold (the first's optimizer state) is checked with it
  // held from its start, as the model is calibrated.
  const int64_t measured = resp.recorded_carried_peak_bytes() > 0
                               ? resp.recorded_carried_peak_bytes()
                               : resp.recorded_measured_peak_bytes();
  const double err =
      measured > 0
          ? 100.0 * (double(resp.recorded_predicted_peak_bytes()) - double(measured)) / measured
          : 0.0;
  std::printf("chain %s: %d blocks, from step %lld (%s)\n", p->name.c_str(), p->size(),
              static_cast<long long>(resp.step()), msText(resp.measured_step_ns()).c_str());
  std::printf("static %s, chain input %s, floor (optimizer step) %s\n",
              humanBytes(p->staticBytes).c_str(), humanBytes(p->inputBytes).c_str(),
              humanBytes(p->floorBytes).c_str());
  const std::string carried =
      resp.recorded_carried_peak_bytes() > 0
          ? ", " + humanBytes(resp.recorded_carried_peak_bytes()) +
                " with what it leaves to the later steps (the optimizer state it made) held from "
                "its start"
          : "";
  std::printf(
      "check: the plan that ran (%s) predicts a peak of %s; the step measured %s%s (%+.1f %%)\n\n",
      resp.recorded_plan().c_str(), humanBytes(resp.recorded_predicted_peak_bytes()).c_str(),
      humanBytes(resp.recorded_measured_peak_bytes()).c_str(), carried.c_str(), err);
  // RE-RUN: what a plan's re-run of the block costs (its recorded re-runs, else its forward).
  std::printf("%-28s %9s %9s %9s %11s %11s %11s %11s %11s\n", "BLOCK", "FWD", "RE-RUN", "BWD",
              "SAVED", "OUTPUT", "FWD WORK", "BWD WORK", "OUTSIDE B");
  for (const core::Stage& st : p->stages) {
    std::printf("%-28s %9s %9s %9s %11s %11s %11s %11s %11s\n", st.name.c_str(),
                msText(st.forwardNs).c_str(), msText(st.rerunCostNs()).c_str(),
                msText(st.backwardNs).c_str(), humanBytes(st.savedBytes).c_str(),
                humanBytes(st.outputBytes).c_str(), humanBytes(st.forwardWorkingBytes).c_str(),
                humanBytes(st.backwardWorkingBytes).c_str(),
                humanBytes(st.backwardOutsideBytes).c_str());
  }
  // The selective options of each block: what it keeps with them, what re-running costs.
  bool optionsHeader = false;
  for (const core::Stage& st : p->stages) {
    if (st.options.empty()) continue;
    if (!optionsHeader)
      std::printf("\nselective options (kept of the saved bytes, re-run time):\n");
    optionsHeader = true;
    std::string line;
    for (const core::StageOption& o : st.options)
      line += (line.empty() ? "" : "; ") + o.name + " " + humanBytes(o.savedBytes) + ", " +
              msText(o.recomputeNs) + (o.policy.empty() ? "" : " (op-level)");
    std::printf("  %-28s %s\n", st.name.c_str(), line.c_str());
  }
  // Where the chain is not one: no recomputed segment runs into these blocks.
  std::string unlinked;
  for (int i = 1; i < p->size(); ++i)
    if (!p->stages[i].linked) unlinked += (unlinked.empty() ? "" : ", ") + p->stages[i].name;
  if (!unlinked.empty())
    std::printf(
        "\nnot fed by the block before (something in between made their input): %s; a plan "
        "recomputes no segment across them\n",
        unlinked.c_str());
  for (const std::string& w : resp.warnings()) std::printf("\nwarning: %s\n", w.c_str());
  if (!a.outFile.empty()) std::printf("\nwritten to %s\n", a.outFile.c_str());
  return kExitOk;
}

int paretoCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  static const char* kUsage =
      "usage: tidemark pareto (SESSION | --profile FILE) [--step N] [--blocks PREFIXES]\n"
      "                       [--points K] [--nested] [--offload SPEED]\n"
      "                       [--rerun-times-from S] [--json]\n\n"
      "The least recomputation any plan needs, for every budget (the optimal plans' Pareto\n"
      "curve), from one solve. The table shows K points spread over the curve (default 24);\n"
      "--json gives all of them. --nested: the curve of plans that may nest recomputed\n"
      "segments (as `tidemark plan --nested`); --offload SPEED: with offloading (as `plan`);\n"
      "--rerun-times-from S[,S...]: re-run times from these sessions (as `plan`).\n";
  AdvisorArgs a;
  int code = kExitOk;
  std::vector<std::string> args = argsIn;
  if (!takeJobOption(g, "pareto", &args, &code)) return code;
  if (!parseAdvisorArgs("pareto", kUsage, args, /*wantBudget=*/false, &a, &code)) return code;
  v1::ParetoResponse resp;
  if (!a.profileFile.empty()) {
    core::ChainProfile profile;
    if (!loadProfile("pareto", a.profileFile, &profile)) return kExitUsage;
    if (!a.offload.empty()) profile.offloadBytesPerSecond = a.offloadBytesPerSecond;
    const std::unique_ptr<core::ChainFront> solved =
        core::solveChain(profile, std::numeric_limits<int64_t>::max(), a.nested);
    const core::ParetoSummary sum = core::paretoSummary(profile, *solved);
    resp.set_chain_name(sum.chainName);
    resp.set_store_all_peak_bytes(sum.storeAllPeakBytes);
    resp.set_static_bytes(sum.staticBytes);
    resp.set_base_step_ns(sum.baseStepNs);
    resp.set_epsilon_bytes(sum.epsilonBytes);
    for (const auto& p : sum.points) {
      v1::ParetoPoint* out = resp.add_points();
      out->set_budget_bytes(p.budgetBytes);
      out->set_extra_ns(p.extraNs);
      out->set_plan(p.plan);
    }
  } else {
    v1::ParetoRequest req;
    *req.mutable_chain() = selector(a);
    req.set_nested(a.nested);
    req.set_offload(a.offload);
    if (int code = callRpc<v1::Advisor>(g, "pareto", &v1::Advisor::Stub::Pareto, req, &resp, 120);
        code != kExitOk)
      return code;
  }
  if (g.json) {
    std::string out = "{\"chain\": " + jsonString(resp.chain_name()) +
                      ", \"store_all_peak_bytes\": " + std::to_string(resp.store_all_peak_bytes()) +
                      ", \"static_bytes\": " + std::to_string(resp.static_bytes()) +
                      ", \"base_step_ns\": " + std::to_string(resp.base_step_ns()) +
                      ", \"epsilon_bytes\": " + std::to_string(resp.epsilon_bytes()) +
                      ", \"points\": [";
    for (int i = 0; i < resp.points_size(); ++i) {
      const v1::ParetoPoint& p = resp.points(i);
      out += std::string(i ? ",\n  " : "\n  ") +
             "{\"budget_bytes\": " + std::to_string(p.budget_bytes()) +
             ", \"extra_ns\": " + std::to_string(p.extra_ns()) +
             ", \"plan\": " + jsonString(p.plan()) + "}";
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return kExitOk;
  }
  std::printf("chain %s: store-all peak %s, static %s, step %s; %d %s\n\n",
              resp.chain_name().c_str(), humanBytes(resp.store_all_peak_bytes()).c_str(),
              humanBytes(resp.static_bytes()).c_str(), msText(resp.base_step_ns()).c_str(),
              resp.points_size(), resp.epsilon_bytes() > 0 ? "points" : "optimal points");
  if (resp.epsilon_bytes() > 0)
    std::printf(
        "(a long chain, solved on a grid: each plan adds no more than the optimum at %s "
        "less)\n\n",
        humanBytes(resp.epsilon_bytes()).c_str());
  std::printf("%14s %12s %9s  %s\n", "BUDGET", "EXTRA/STEP", "OVERHEAD", "PLAN");
  const int n = resp.points_size();
  const int shown = std::min(n, a.points);
  for (int k = 0; k < shown; ++k) {
    // Spread over the curve, always including both ends.
    const int i = shown == 1 ? 0 : static_cast<int>((int64_t(k) * (n - 1)) / (shown - 1));
    const v1::ParetoPoint& p = resp.points(i);
    std::string plan = p.plan();
    if (plan.size() > 60) plan = plan.substr(0, 57) + "...";
    std::printf("%14s %12s %8.1f%%  %s\n", humanBytes(p.budget_bytes()).c_str(),
                msText(p.extra_ns()).c_str(),
                resp.base_step_ns() > 0 ? 100.0 * p.extra_ns() / resp.base_step_ns() : 0.0,
                plan.c_str());
  }
  return kExitOk;
}

int applyCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  static const char* kUsage =
      "usage: tidemark apply SESSION PLAN [--no-wait | --wait SECONDS] [--json]\n\n"
      "Sends the plan document PLAN (from `tidemark plan --out`) to the running job of SESSION;\n"
      "its adapter applies it at the next step boundary and the job goes on. Waits (default\n"
      "60 s) until the job says it applied or refused the plan. Exit code 1 when it refused\n"
      "(the reason is printed) or did not answer in time. `tidemark plan-check SESSION` then\n"
      "compares the prediction with the steps that ran under the plan.\n";
  if (std::find(args.begin(), args.end(), "--job") != args.end()) return applyToJob(g, args);
  uint64_t session = 0;
  bool haveSession = false;
  std::string planFile;
  int waitS = 60;
  int code = kExitOk;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (a == "--no-wait") {
      waitS = 0;
    } else if (a == "--wait") {
      if (i + 1 >= args.size() || (waitS = std::atoi(args[i + 1].c_str())) < 0 ||
          args[i + 1].find_first_not_of("0123456789") != std::string::npos) {
        std::fprintf(stderr, "tidemark apply: --wait needs a number of seconds\n");
        return kExitUsage;
      }
      ++i;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "tidemark apply: unknown option '%s'\n%s", a.c_str(), kUsage);
      return kExitUsage;
    } else if (!haveSession) {
      if (!acceptSessionArg("apply", a, &haveSession, &session, &code)) return code;
    } else if (planFile.empty()) {
      planFile = a;
    } else {
      std::fprintf(stderr, "tidemark apply: unexpected argument '%s'\n", a.c_str());
      return kExitUsage;
    }
  }
  if (!haveSession || planFile.empty()) {
    std::fprintf(stderr, "tidemark apply: needs SESSION and PLAN\n%s", kUsage);
    return kExitUsage;
  }
  std::string text;
  if (!readPlanFile("apply", planFile, &text)) return kExitUsage;
  v1::ApplyPlanRequest req;
  req.set_session_id(session);
  req.set_plan_json(text);
  v1::ApplyPlanResponse resp;
  if (int code = callRpc<v1::Control>(g, "apply", &v1::Control::Stub::ApplyPlan, req, &resp, 30);
      code != kExitOk)
    return code;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(waitS);
  v1::PlanOutcome outcome;
  outcome.set_plan_id(resp.plan_id());
  outcome.set_state(v1::PLAN_STATE_SENT);
  while (waitS > 0) {
    v1::PlanCheckResponse check;
    if (int c = callPlanCheck(g, "apply", session, &check); c != kExitOk) return c;
    for (const v1::PlanOutcome& o : check.plans())
      if (o.plan_id() == resp.plan_id()) outcome = o;
    if (outcome.state() != v1::PLAN_STATE_SENT || std::chrono::steady_clock::now() >= deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (g.json) {
    std::printf("{\"plan_id\": %llu, \"state\": \"%s\", \"from_step\": %lld, \"message\": %s}\n",
                static_cast<unsigned long long>(resp.plan_id()), planStateName(outcome.state()),
                static_cast<long long>(outcome.from_step()), jsonString(outcome.message()).c_str());
  } else if (outcome.state() == v1::PLAN_STATE_APPLIED) {
    std::printf("plan %llu applied to session %llu from step %lld\n",
                static_cast<unsigned long long>(resp.plan_id()),
                static_cast<unsigned long long>(session),
                static_cast<long long>(outcome.from_step()));
    // What the job said beside "applied" (as plan-check shows it): a path other than the
    // recorded one, a segment that is not a chain in this model.
    if (!outcome.message().empty() && outcome.message() != "applied")
      std::printf("  note: %s\n", outcome.message().c_str());
  } else if (outcome.state() == v1::PLAN_STATE_SENT) {
    std::printf("plan %llu sent to session %llu; the job applies it at its next step boundary\n",
                static_cast<unsigned long long>(resp.plan_id()),
                static_cast<unsigned long long>(session));
  }
  if (outcome.state() == v1::PLAN_STATE_REFUSED) {
    std::fprintf(stderr, "tidemark apply: the job refused plan %llu: %s\n",
                 static_cast<unsigned long long>(resp.plan_id()), outcome.message().c_str());
    return kExitError;
  }
  if (outcome.state() == v1::PLAN_STATE_SENT && waitS > 0) {
    std::fprintf(stderr,
                 "tidemark apply: no answer from the job within %d s (it applies plans "
                 "at step boundaries); see tidemark plan-check %llu\n",
                 waitS, static_cast<unsigned long long>(session));
    return kExitError;
  }
  return kExitOk;
}

int planCheckCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  static const char* kUsage =
      "usage: tidemark plan-check SESSION [--json]\n\n"
      "The plans sent to SESSION (tidemark apply): for each, the predicted peak and extra time\n"
      "beside what the steps that ran under it measured, and the steps before it.\n";
  if (std::find(args.begin(), args.end(), "--job") != args.end()) return planCheckOfJob(g, args);
  uint64_t session = 0;
  int code = kExitOk;
  if (!parseSessionArgs(args, 1, kUsage, &session, &code)) return code;
  v1::PlanCheckResponse resp;
  if (int c = callPlanCheck(g, "plan-check", session, &resp); c != kExitOk) return c;
  if (g.json) {
    std::printf("{\"plans\": %s}\n", planOutcomesJson(resp).c_str());
    return kExitOk;
  }
  printPlanOutcomes(session, resp);
  return kExitOk;
}

}  // namespace tidemark::cli
