// The optimal chain planner on 200-block chains: the whole Pareto curve from one solve, beside
// the target of 1 s (DESIGN.md section 6). Chains: homogeneous (a transformer's blocks),
// heterogeneous (times and sizes varying tenfold), and heterogeneous with a selective option on
// every block. Prints one JSON line per chain. `--grid N` solves N-block chains on the grid
// (the long chains' solver) and, where the exact solver can (N <= 400), measures how far the grid's
// curve is from the exact one beside the bound it proves. `--nested N`: nested plans on N-block
// chains beside one-level ones.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "src/advisor/grid_solver.h"
#include "src/advisor/nested_solver.h"
#include "src/advisor/planner.h"
#include "src/advisor/simulator.h"
#include "src/advisor/solvers.h"

using namespace tidemark::core;

namespace {

ChainProfile makeChain(const std::string& kind, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> vary(1, 10);
  ChainProfile p;
  p.name = kind;
  p.staticBytes = int64_t{4} << 30;
  p.inputBytes = int64_t{16} << 20;
  for (int i = 0; i < n; ++i) {
    Stage s;
    s.name = "blocks." + std::to_string(i);
    const bool homogeneous = kind == "homogeneous";
    const int64_t k = homogeneous ? 5 : vary(rng);
    s.forwardNs = k * 1'000'000;
    s.backwardNs = 2 * s.forwardNs;
    s.savedBytes = (homogeneous ? 5 : vary(rng)) * (int64_t{32} << 20);
    s.outputBytes = int64_t{16} << 20;
    s.forwardWorkingBytes = s.savedBytes / 8;
    s.backwardWorkingBytes = s.savedBytes / 4;
    if (kind == "options") s.options.push_back({"mlp", s.savedBytes / 2, s.forwardNs / 3, {}});
    p.stages.push_back(std::move(s));
  }
  return p;
}

// `bench_pareto --plans N`: the plan for one budget (what `tidemark plan` solves: a solve capped
// at the budget) on N-block chains, at budgets 10/50/90 % of the way from the least feasible one
// to storing everything (makePlan: the solve, the plan read back and simulated; the best of 3).
// One JSON line per chain and budget.
int plansAtBudgets(int n) {
  for (const char* kind : {"homogeneous", "heterogeneous", "options"}) {
    const ChainProfile p = makeChain(kind, n, 42);
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t least = OptimalChainSolver(p, 0).minFeasibleBudget();
    const double leastS =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
    for (int percent : {10, 50, 90}) {
      const int64_t budget = least + (storeAll - least) * percent / 100;
      PlanReport r;
      double s = 1e9;
      for (int rep = 0; rep < 3; ++rep) {  // the best of 3, as the whole solve's
        const auto t1 = std::chrono::steady_clock::now();
        r = makePlan(p, budget, Strategy::kOptimal);
        s = std::min(s,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
      }
      std::printf(
          "{\"chain\": \"%s\", \"blocks\": %d, \"budget_percent\": %d, \"plan_s\": %.4f, "
          "\"least_feasible_s\": %.4f, \"feasible\": %s, \"extra_ns\": %lld}\n",
          kind, n, percent, s, leastS, r.feasible ? "true" : "false",
          static_cast<long long>(r.predicted.extraNs));
      std::fflush(stdout);
    }
  }
  return 0;
}

// `bench_pareto --grid N`: the grid solver's whole curve (best of 3), its proven epsilon as a share
// of the budget range, and (N <= 400) the largest shift that actually puts its curve under the
// exact one: for each exact point (b, t), the least budget at which the grid's curve costs <= t,
// less b.
int gridCurves(int n) {
  for (const char* kind : {"homogeneous", "heterogeneous", "options"}) {
    const ChainProfile p = makeChain(kind, n, 42);
    double best = 1e9;
    std::unique_ptr<GridChainSolver> grid;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      grid = std::make_unique<GridChainSolver>(p);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const std::vector<ParetoPoint> curve = grid->curve();
    const int64_t range = curve.back().budgetBytes - grid->minFeasibleBudget();
    long long measured = -1;
    double exactS = -1;
    if (n <= 400) {
      const auto t0 = std::chrono::steady_clock::now();
      const OptimalChainSolver exact(p);
      const std::vector<ParetoPoint> exactCurve = exact.curve();
      exactS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      measured = 0;
      for (const ParetoPoint& pt : exactCurve) {
        const auto it = std::partition_point(curve.begin(), curve.end(), [&](const ParetoPoint& q) {
          return q.extraNs > pt.extraNs;
        });
        measured = std::max<long long>(measured, it->budgetBytes - pt.budgetBytes);
      }
    }
    std::printf(
        "{\"chain\": \"%s\", \"blocks\": %d, \"grid_solve_s\": %.4f, \"grid_points\": %d, "
        "\"bound_points\": %d, \"curve_points\": %zu, \"range_bytes\": %lld, "
        "\"epsilon_bytes\": %lld, \"epsilon_share\": %.6f, \"measured_shift_bytes\": %lld, "
        "\"exact_solve_s\": %.4f}\n",
        kind, n, best, grid->gridPoints(), grid->boundPoints(), curve.size(),
        static_cast<long long>(range), static_cast<long long>(grid->epsilonBytes()),
        range > 0 ? static_cast<double>(grid->epsilonBytes()) / range : 0.0, measured, exactS);
    std::fflush(stdout);
  }
  return 0;
}

// `bench_pareto --nested N`: the nested solver's whole curve on N-block chains (best of 3) beside
// the one-level solver's, the least feasible budget of each (above static), and the extra time
// each needs at the one-level least feasible budget. One JSON line per chain.
int nestedCurves(int n) {
  for (const char* kind : {"homogeneous", "heterogeneous", "options"}) {
    const ChainProfile p = makeChain(kind, n, 42);
    auto bestOf3 = [](auto solve) {
      double best = 1e9;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        solve();
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return best;
    };
    const double flatS = bestOf3([&] { (void)OptimalChainSolver(p).curve(); });
    const double nestedS = bestOf3([&] { (void)NestedChainSolver(p).curve(); });
    const OptimalChainSolver flat(p);
    const NestedChainSolver nested(p);
    const int64_t at = flat.minFeasibleBudget();
    const ChainPlan flatPlan = *flat.planFor(at), nestedPlan = *nested.planFor(at);
    std::printf(
        "{\"chain\": \"%s\", \"blocks\": %d, \"one_level_solve_s\": %.4f, "
        "\"nested_solve_s\": %.4f, \"one_level_points\": %zu, \"nested_points\": %zu, "
        "\"one_level_least_above_static\": %lld, \"nested_least_above_static\": %lld, "
        "\"one_level_extra_ns_at_its_least\": %lld, \"nested_extra_ns_there\": %lld, "
        "\"nested_depth_there\": %d}\n",
        kind, n, flatS, nestedS, flat.curve().size(), nested.curve().size(),
        static_cast<long long>(at - p.staticBytes),
        static_cast<long long>(nested.minFeasibleBudget() - p.staticBytes),
        static_cast<long long>(simulate(p, flatPlan).extraNs),
        static_cast<long long>(simulate(p, nestedPlan).extraNs), planDepth(nestedPlan));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

// A chain length from the command line (1 .. 100,000), or 0 when it is not one.
int chainLength(const char* text) {
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && n >= 1 && n <= 100000 ? static_cast<int>(n) : 0;
}

int usage(FILE* out) {
  std::fprintf(out,
               "usage: bench_pareto [N]            the exact whole curve of N-block chains "
               "(default 200)\n"
               "       bench_pareto --plans N      the plan for one budget (10/50/90 %%)\n"
               "       bench_pareto --grid N       the long chains' grid solver and its bound\n"
               "       bench_pareto --nested N     nested plans beside one-level ones\n"
               "One JSON line per chain (homogeneous, heterogeneous, with options).\n");
  return out == stdout ? 0 : 2;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--help" || mode == "-h") return usage(stdout);
  if (mode == "--plans" || mode == "--grid" || mode == "--nested") {
    const int n = argc == 3 ? chainLength(argv[2]) : 0;
    if (n == 0) return usage(stderr);
    if (mode == "--plans") return plansAtBudgets(n);
    return mode == "--grid" ? gridCurves(n) : nestedCurves(n);
  }
  if (argc > 2 || (argc == 2 && chainLength(argv[1]) == 0)) return usage(stderr);
  const int n = argc > 1 ? chainLength(argv[1]) : 200;
  for (const char* kind : {"homogeneous", "heterogeneous", "options"}) {
    const ChainProfile p = makeChain(kind, n, 42);
    double best = 1e9;
    size_t points = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      const OptimalChainSolver solver(p);
      points = solver.curve().size();
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // Reconstructing and simulating the plan of every curve point, as the advisor's pareto does.
    const OptimalChainSolver solver(p);
    const auto t0 = std::chrono::steady_clock::now();
    for (const ParetoPoint& pt : solver.curve()) (void)simulate(p, *solver.planFor(pt.budgetBytes));
    const double plans =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "{\"chain\": \"%s\", \"blocks\": %d, \"solve_s\": %.4f, \"curve_points\": %zu, "
        "\"plans_and_simulations_s\": %.4f}\n",
        kind, n, best, points, plans);
  }
  return 0;
}
