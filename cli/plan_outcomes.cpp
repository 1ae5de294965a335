// What became of the plans sent to a session, as plan-check and apply print it.
#include "cli/plan_outcomes.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/client.h"
#include "cli/format.h"
#include "src/advisor/plan_json.h"
#include "tidemark/v1/advisor.grpc.pb.h"

namespace tidemark::cli {

bool readPlanFile(const char* command, const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tidemark %s: cannot read %s\n", command, path.c_str());
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  if (absl::StatusOr<core::PlanDocument> d = core::parsePlanDocument(*text); !d.ok()) {
    std::fprintf(stderr, "tidemark %s: %s is not a plan: %s\n", command, path.c_str(),
                 std::string(d.status().message()).c_str());
    return false;
  }
  return true;
}

const char* planStateName(v1::PlanState s) {
  switch (s) {
    case v1::PLAN_STATE_SENT:
      return "sent";
    case v1::PLAN_STATE_APPLIED:
      return "applied";
    case v1::PLAN_STATE_REFUSED:
      return "refused";
    default:
      return "?";
  }
}

int callPlanCheck(const GlobalOptions& g, const char* what, uint64_t session,
                  v1::PlanCheckResponse* resp) {
  v1::PlanCheckRequest req;
  req.set_session_id(session);
  return callRpc<v1::Advisor>(g, what, &v1::Advisor::Stub::PlanCheck, req, resp);
}

double errorPct(int64_t measured, int64_t predicted) {
  return predicted > 0 ? 100.0 * double(measured - predicted) / double(predicted) : 0.0;
}

std::string planOutcomesJson(const v1::PlanCheckResponse& resp) {
  std::string out = "[";
  for (int i = 0; i < resp.plans_size(); ++i) {
    const v1::PlanOutcome& o = resp.plans(i);
    char buf[1024];
    std::snprintf(
        buf, sizeof buf,
        "%s{\"plan_id\": %llu, \"state\": \"%s\", \"strategy\": %s, \"budget_bytes\": "
        "%lld, \"from_step\": %lld, \"steps_measured\": %lld, "
        "\"predicted_peak_bytes\": %lld, \"measured_peak_bytes\": %lld, "
        "\"peak_error\": %.5f, \"predicted_extra_ns\": %lld, \"measured_extra_ns\": "
        "%lld, \"measured_step_ns\": %lld, \"before_peak_bytes\": %lld, "
        "\"before_step_ns\": %lld, \"steps_before\": %lld, \"message\": ",
        i ? ",\n  " : "\n  ", static_cast<unsigned long long>(o.plan_id()),
        planStateName(o.state()), jsonString(o.strategy()).c_str(),
        static_cast<long long>(o.budget_bytes()), static_cast<long long>(o.from_step()),
        static_cast<long long>(o.steps_measured()),
        static_cast<long long>(o.predicted_peak_bytes()),
        static_cast<long long>(o.measured_peak_bytes()),
        errorPct(o.measured_peak_bytes(), o.predicted_peak_bytes()) / 100.0,
        static_cast<long long>(o.predicted_extra_ns()),
        static_cast<long long>(o.measured_extra_ns()), static_cast<long long>(o.measured_step_ns()),
        static_cast<long long>(o.before_peak_bytes()), static_cast<long long>(o.before_step_ns()),
        static_cast<long long>(o.steps_before()));
    out += buf + jsonString(o.message()) + "}";
  }
  out += "]";
  return out;
}

namespace {
// The measured recomputation more than 15 % off the prediction (docs/plan-format.md: times
// from recorded forwards are estimates; recorded re-runs calibrate them).
bool recomputeFarOff(const v1::PlanOutcome& o) {
  return o.measured_extra_ns() > 0 &&
         std::fabs(errorPct(o.measured_extra_ns(), o.predicted_extra_ns())) > 15.0;
}
}  // namespace

void printPlanOutcomes(uint64_t session, const v1::PlanCheckResponse& resp) {
  if (resp.plans_size() == 0) {
    std::printf("no plan was sent to session %llu (tidemark apply SESSION PLAN)\n",
                static_cast<unsigned long long>(session));
    return;
  }
  for (const v1::PlanOutcome& o : resp.plans()) {
    std::printf("plan %llu (%s, budget %s): %s", static_cast<unsigned long long>(o.plan_id()),
                o.strategy().c_str(), humanBytes(o.budget_bytes()).c_str(),
                planStateName(o.state()));
    if (o.state() == v1::PLAN_STATE_REFUSED) std::printf(": %s", o.message().c_str());
    if (o.state() != v1::PLAN_STATE_APPLIED) {
      std::printf("\n");
      continue;
    }
    std::printf(" from step %lld, %lld steps measured\n", static_cast<long long>(o.from_step()),
                static_cast<long long>(o.steps_measured()));
    // What the job said beside "applied" (the path its steps took is not the recorded one).
    if (!o.message().empty() && o.message() != "applied")
      std::printf("  note: %s\n", o.message().c_str());
    if (o.steps_measured() == 0) {
      std::printf("  no complete step under the plan yet\n");
      continue;
    }
    // BEFORE: the steps before the plan, none when it ran from the job's first step.
    const bool before = o.steps_before() > 0;
    std::printf("  %-14s %12s %12s %9s %12s\n", "", "PREDICTED", "MEASURED", "ERROR", "BEFORE");
    std::printf("  %-14s %12s %12s %+8.1f%% %12s\n", "peak",
                humanBytes(o.predicted_peak_bytes()).c_str(),
                humanBytes(o.measured_peak_bytes()).c_str(),
                errorPct(o.measured_peak_bytes(), o.predicted_peak_bytes()),
                before ? humanBytes(o.before_peak_bytes()).c_str() : "-");
    // Recomputation as recorded (its phases), not a difference of step times (noise). None
    // recorded while the plan recomputes: a compiled model, whose recomputation runs inside its
    // compiled backward (no phase to see), not a free one.
    const bool unseen = o.measured_extra_ns() == 0 && o.predicted_extra_ns() > 0;
    if (unseen)
      std::printf("  %-14s %12s %12s %9s %12s\n", "recompute",
                  msText(o.predicted_extra_ns()).c_str(), "not seen", "-", "-");
    else
      std::printf("  %-14s %12s %12s %+8.1f%% %12s\n", "recompute",
                  msText(o.predicted_extra_ns()).c_str(), msText(o.measured_extra_ns()).c_str(),
                  errorPct(o.measured_extra_ns(), o.predicted_extra_ns()), "-");
    std::printf("  %-14s %12s %12s %9s %12s\n", "step time", "",
                msText(o.measured_step_ns()).c_str(), "",
                before ? msText(o.before_step_ns()).c_str() : "-");
    std::printf("  %-14s %12s %12s\n", "within budget", "",
                o.measured_peak_bytes() <= o.budget_bytes() ? "yes" : "NO");
    // A plan applied from the second step has only the first before it, which made the
    // optimizer's state (and warmed the caches): its peak and time are no baseline.
    if (before && o.from_step() == 2)
      std::printf(
          "  (BEFORE is step 1 alone, which made the optimizer's state: no baseline for the "
          "peak or the time)\n");
    if (unseen)
      std::printf(
          "  (no recomputation recorded: under torch.compile it runs inside the compiled "
          "backward; the step time shows its cost)\n");
    else if (recomputeFarOff(o))
      std::printf(
          "  (re-run times are estimates; plans made with `tidemark plan SOURCE "
          "--rerun-times-from %llu` time them by this training's re-runs)\n",
          static_cast<unsigned long long>(session));
  }
}

}  // namespace tidemark::cli
