#include "src/advisor/planner.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "src/advisor/grid_solver.h"

namespace tidemark::core {

namespace {

bool nestsAt(const ChainProfile& profile, bool nested) {
  return nested && profile.size() <= kNestedStagesMax;
}

// An exact solve up to maxBudgetBytes, nested or one level deep.
std::unique_ptr<ChainFront> exactSolve(const ChainProfile& profile, int64_t maxBudgetBytes,
                                       bool nested) {
  if (nestsAt(profile, nested)) return std::make_unique<NestedChainSolver>(profile, maxBudgetBytes);
  return std::make_unique<OptimalChainSolver>(profile, maxBudgetBytes);
}

}  // namespace

std::unique_ptr<ChainFront> solveChain(const ChainProfile& profile, int64_t maxBudgetBytes,
                                       bool nested) {
  if (nestsAt(profile, nested)) return std::make_unique<NestedChainSolver>(profile, maxBudgetBytes);
  if (profile.size() <= kExactStagesMax)
    return std::make_unique<OptimalChainSolver>(profile, maxBudgetBytes);
  return std::make_unique<GridChainSolver>(profile);
}

PlanReport makePlan(const ChainProfile& profile, int64_t budgetBytes, Strategy strategy,
                    double marginFraction, const ChainFront* solved, bool nested) {
  PlanReport r;
  r.storeAllPeakBytes = simulate(profile, storeAllPlan(profile)).peakBytes;
  std::unique_ptr<ChainFront> own;
  if (solved == nullptr) {
    // Only budgets up to this one are read back: the solve keeps what fits under it. Where no
    // optimal plan is read (another strategy, or storing everything fits) only the least
    // feasible budget is: a solve capped at 0 keeps no front, just that.
    const bool optimalPlanRead =
        strategy == Strategy::kOptimal && r.storeAllPeakBytes > budgetBytes;
    if (optimalPlanRead)
      own = solveChain(profile, budgetBytes, nested);
    else
      own = exactSolve(profile, 0, nested);
    solved = own.get();
  }
  r.strategy = strategy;
  r.budgetBytes = budgetBytes;
  r.marginBytes = static_cast<int64_t>(std::llround(std::max(0.0, marginFraction) * budgetBytes));
  const int64_t target = budgetBytes - r.marginBytes;
  r.baseStepNs = profile.baseStepNs();
  r.minFeasibleBudgetBytes = solved->minFeasibleBudget();
  r.lowerBoundExtraNs = extraTimeLowerBound(profile, budgetBytes);
  switch (strategy) {
    case Strategy::kStoreAll:
      r.plan = storeAllPlan(profile);
      break;
    case Strategy::kCheckpointAll:
      r.plan = checkpointAllPlan(profile);
      break;
    case Strategy::kSqrtN:
      r.plan = sqrtNPlan(profile);
      break;
    case Strategy::kGreedy:
      r.plan = greedySearchPlan(profile, target);
      if (simulate(profile, r.plan).peakBytes > target)
        r.plan = greedySearchPlan(profile, budgetBytes);
      break;
    case Strategy::kOptimal: {
      if (r.storeAllPeakBytes <= budgetBytes) {
        r.plan = storeAllPlan(profile);
        break;
      }
      std::optional<ChainPlan> plan = solved->planFor(target);
      if (!plan) {
        // Nothing under the margin: the plan for the least feasible budget has the lowest peak,
        // the most room under the budget there is (or, infeasible, the closest there is). Above
        // a capped solve's budget it takes one of its own (small: nothing fits but the least).
        plan = solved->planFor(r.minFeasibleBudgetBytes);
        if (!plan)
          plan = exactSolve(profile, r.minFeasibleBudgetBytes, nested)
                     ->planFor(r.minFeasibleBudgetBytes);
      }
      r.plan = *plan;
      r.epsilonBytes = solved->epsilonBytes();
      break;
    }
  }
  if (nested && strategy == Strategy::kOptimal && profile.size() > kNestedStagesMax)
    r.warnings.push_back(absl::StrCat("nested plans are made for chains of up to ",
                                      kNestedStagesMax, " blocks; this chain of ", profile.size(),
                                      " was planned one level deep"));
  r.predicted = simulate(profile, r.plan, /*keepPoints=*/true);
  r.feasible = r.predicted.peakBytes <= budgetBytes;
  r.marginMet = r.predicted.peakBytes <= target;
  return r;
}

ParetoSummary paretoSummary(const ChainProfile& profile, const ChainFront& solved) {
  ParetoSummary out;
  out.chainName = profile.name;
  out.storeAllPeakBytes = simulate(profile, storeAllPlan(profile)).peakBytes;
  out.staticBytes = profile.staticBytes;
  out.baseStepNs = profile.baseStepNs();
  out.epsilonBytes = solved.epsilonBytes();
  for (const ParetoPoint& pt : solved.curve())
    out.points.push_back(
        {pt.budgetBytes, pt.extraNs, planSignature(*solved.planFor(pt.budgetBytes))});
  return out;
}

absl::StatusOr<BudgetSpec> parseBudget(std::string_view text) {
  const std::string s(text);
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("bad budget '", s, "' (examples: 6GiB, 512MiB, 1.5GB, 123456, 70%)"));
  };
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || !std::isfinite(value) || value <= 0) return bad();
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(' '));
  BudgetSpec spec;
  if (unit == "%") {
    if (value > 1000) return bad();
    spec.fraction = value / 100.0;
    return spec;
  }
  static const struct {
    const char* name;
    double scale;
  } kUnits[] = {{"", 1},
                {"B", 1},
                {"KiB", 1024.0},
                {"MiB", 1024.0 * 1024},
                {"GiB", 1024.0 * 1024 * 1024},
                {"TiB", 1024.0 * 1024 * 1024 * 1024},
                {"KB", 1e3},
                {"MB", 1e6},
                {"GB", 1e9},
                {"TB", 1e12}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      const double bytes = value * u.scale;
      if (bytes > 9e18) return bad();
      spec.bytes = static_cast<int64_t>(std::llround(bytes));
      return spec;
    }
  }
  return bad();
}

absl::StatusOr<int64_t> parseSpeed(std::string_view text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("bad speed '", std::string(text), "' (examples: 25GB/s, 16GiB/s, 1000000/s)"));
  };
  if (text.size() < 3 || text.substr(text.size() - 2) != "/s") return bad();
  absl::StatusOr<BudgetSpec> bytes = parseBudget(text.substr(0, text.size() - 2));
  if (!bytes.ok() || bytes->bytes <= 0) return bad();
  return bytes->bytes;
}

int64_t resolveBudget(const BudgetSpec& spec, const ChainProfile& profile) {
  if (spec.bytes >= 0) return spec.bytes;
  const int64_t storeAll = simulate(profile, storeAllPlan(profile)).peakBytes;
  return profile.staticBytes +
         static_cast<int64_t>(std::llround(spec.fraction * double(storeAll - profile.staticBytes)));
}

}  // namespace tidemark::core
