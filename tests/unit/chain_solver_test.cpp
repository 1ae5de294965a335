// The recompute advisor's chain model: the simulator against hand-computed schedules, the optimal
// dynamic program against exhaustive search, the baselines, the lower bound and the documents.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include <nlohmann/json.hpp>
#include "src/advisor/chain.h"
#include "src/advisor/plan_json.h"
#include "src/advisor/planner.h"
#include "src/advisor/simulator.h"
#include "src/advisor/solvers.h"
#include "src/advisor/stage_choices.h"
#include "tests/unit/chain_fixtures.h"

namespace tidemark::core {
namespace {

using chain_fixtures::randomChain;
using chain_fixtures::stage;

ChainProfile twoStages() {
  ChainProfile p;
  p.name = "two";
  p.staticBytes = 100;
  p.inputBytes = 10;
  p.stages = {stage("A", 5, 10, 50, 20, 3, 4), stage("B", 7, 14, 30, 10)};
  return p;
}

ChainPlan plan(std::vector<Segment> segments) { return ChainPlan{std::move(segments)}; }

TEST(ChainSimulator, StoreAllPeaksInTheLastBackward) {
  const ChainProfile p = twoStages();
  const SimResult r = simulate(p, storeAllPlan(p), true);
  // Forward A 133, forward B 190, end of forward 230, backward B 240, backward A 194.
  std::vector<int64_t> live;
  for (const SimPoint& pt : r.points) live.push_back(pt.liveBytes);
  EXPECT_EQ(live, (std::vector<int64_t>{133, 190, 230, 240, 194}));
  EXPECT_EQ(r.peakBytes, 240);
  EXPECT_EQ(r.peakAt.phase, SimPhase::kBackward);
  EXPECT_EQ(r.peakAt.stage, 1);
  EXPECT_EQ(r.extraNs, 0);
  EXPECT_EQ(r.stepNs, 36);
}

TEST(ChainSimulator, RecomputingTheFirstStageMovesThePeak) {
  const ChainProfile p = twoStages();
  const ChainPlan pl = plan({{0, 0, SegmentMode::kRecompute}, {1, 1, SegmentMode::kStore}});
  ASSERT_TRUE(validatePlan(p, pl).ok());
  const SimResult r = simulate(p, pl, true);
  std::vector<int64_t> live;
  for (const SimPoint& pt : r.points) live.push_back(pt.liveBytes);
  // Forward A 133, forward B 140, end 180, backward B 190, recompute A 153, backward A 194.
  EXPECT_EQ(live, (std::vector<int64_t>{133, 140, 180, 190, 153, 194}));
  EXPECT_EQ(r.peakBytes, 194);
  EXPECT_EQ(r.extraNs, 5);
  EXPECT_EQ(r.stepNs, 41);
  EXPECT_EQ(planSignature(pl), "R|S");
}

TEST(ChainSimulator, OneSegmentOverBothStages) {
  const ChainProfile p = twoStages();
  const SimResult r = simulate(p, plan({{0, 1, SegmentMode::kRecompute}}), true);
  std::vector<int64_t> live;
  for (const SimPoint& pt : r.points) live.push_back(pt.liveBytes);
  // Forward 133, 140; end 130; recompute A 143, B 200; backward B 240, A 194.
  EXPECT_EQ(live, (std::vector<int64_t>{133, 140, 130, 143, 200, 240, 194}));
  EXPECT_EQ(r.extraNs, 12);
}

TEST(ChainPlanCheck, RejectsPlansThatDoNotCoverTheChain) {
  ChainProfile p = twoStages();
  EXPECT_FALSE(validatePlan(p, plan({{0, 0, SegmentMode::kStore}})).ok());
  EXPECT_FALSE(
      validatePlan(p, plan({{1, 1, SegmentMode::kStore}, {0, 0, SegmentMode::kStore}})).ok());
  EXPECT_FALSE(validatePlan(p, plan({{0, 1, SegmentMode::kStore, 0}})).ok());
  p.stages[1].checkpointable = false;
  EXPECT_FALSE(validatePlan(p, plan({{0, 1, SegmentMode::kRecompute}})).ok());
  // A stage not fed by the one before: segments may start there, not run into it.
  p.stages[1].checkpointable = true;
  p.stages[1].linked = false;
  const absl::Status across = validatePlan(p, plan({{0, 1, SegmentMode::kRecompute}}));
  EXPECT_EQ(across.message(),
            "the recomputed segment [0, 1] runs into stage B, whose input is not the previous "
            "stage's output");
  EXPECT_TRUE(
      validatePlan(p, plan({{0, 0, SegmentMode::kRecompute}, {1, 1, SegmentMode::kRecompute}}))
          .ok());
}

// Every plan of the chain: each stage either starts a stored segment (with or without an option),
// is offloaded (when the chain has an offload speed) or starts a recomputed segment, of any
// length.
void forEachPlan(const ChainProfile& p, const std::function<void(const ChainPlan&)>& visit) {
  ChainPlan cur;
  std::function<void(int)> go = [&](int i) {
    if (i == p.size()) {
      visit(cur);
      return;
    }
    for (int k = i; k < p.size(); ++k) {
      cur.segments.push_back({i, k, SegmentMode::kStore});
      go(k + 1);
      cur.segments.pop_back();
    }
    for (int o = 0; o < static_cast<int>(p.stages[i].options.size()); ++o) {
      cur.segments.push_back({i, i, SegmentMode::kStore, o});
      go(i + 1);
      cur.segments.pop_back();
    }
    if (p.offloadBytesPerSecond > 0) {
      cur.segments.push_back({i, i, SegmentMode::kOffload});
      go(i + 1);
      cur.segments.pop_back();
    }
    // A recomputed segment: checkpointable stages, each after the first fed by the one before.
    for (int k = i; k < p.size() && p.stages[k].checkpointable && (k == i || p.stages[k].linked);
         ++k) {
      cur.segments.push_back({i, k, SegmentMode::kRecompute});
      go(k + 1);
      cur.segments.pop_back();
    }
  };
  go(0);
}

TEST(OptimalChainSolver, EqualsExhaustiveSearchOnRandomChains) {
  std::mt19937_64 rng(20261129);
  int budgetsChecked = 0;
  for (int n = 1; n <= 12; ++n) {
    const int chains = n <= 8 ? 4 : (n <= 10 ? 2 : 1);
    for (int c = 0; c < chains; ++c) {
      const ChainProfile p = randomChain(rng, n, /*withOptions=*/n <= 10);
      ASSERT_TRUE(validateProfile(p).ok());
      // (peak, extra) of every plan.
      std::vector<std::pair<int64_t, int64_t>> all;
      forEachPlan(p, [&](const ChainPlan& pl) {
        ASSERT_TRUE(validatePlan(p, pl).ok()) << planSignature(pl);
        const SimResult r = simulate(p, pl);
        all.push_back({r.peakBytes, r.extraNs});
      });
      std::sort(all.begin(), all.end());
      const OptimalChainSolver solver(p);
      EXPECT_EQ(solver.minFeasibleBudget(), all.front().first) << "n=" << n;
      // Every distinct peak is a budget where the optimum changes; check each and one byte less.
      std::set<int64_t> budgets;
      for (const auto& [peak, extra] : all) budgets.insert({peak, peak - 1});
      int64_t bestSoFar = std::numeric_limits<int64_t>::max();
      size_t k = 0;
      for (int64_t budget : budgets) {
        while (k < all.size() && all[k].first <= budget)
          bestSoFar = std::min(bestSoFar, all[k++].second);
        const std::optional<ChainPlan> got = solver.planFor(budget);
        if (bestSoFar == std::numeric_limits<int64_t>::max()) {
          EXPECT_FALSE(got.has_value()) << "n=" << n << " budget=" << budget;
          continue;
        }
        ASSERT_TRUE(got.has_value()) << "n=" << n << " budget=" << budget;
        ASSERT_TRUE(validatePlan(p, *got).ok());
        const SimResult r = simulate(p, *got);
        EXPECT_LE(r.peakBytes, budget) << planSignature(*got);
        EXPECT_EQ(r.extraNs, bestSoFar)
            << "n=" << n << " budget=" << budget << " " << planSignature(*got);
        EXPECT_LE(extraTimeLowerBound(p, budget), bestSoFar) << "n=" << n << " budget=" << budget;
        ++budgetsChecked;
      }
      // The curve is the same set of optima.
      for (const ParetoPoint& pt : solver.curve()) {
        const std::optional<ChainPlan> at = solver.planFor(pt.budgetBytes);
        ASSERT_TRUE(at.has_value());
        EXPECT_EQ(simulate(p, *at).extraNs, pt.extraNs);
      }
    }
  }
  EXPECT_GT(budgetsChecked, 1000);
}

TEST(OptimalChainSolver, ASolveCappedAtABudgetPlansAsTheWholeSolve) {
  // The plan, the least feasible budget and the curve below the cap are those of the uncapped
  // solve, for caps across the curve (below the least feasible budget too), on chains long enough
  // for the cap to cut recomputed segments short.
  std::mt19937_64 rng(20261202);
  int compared = 0;
  for (int n : {1, 2, 5, 12, 30, 60}) {
    for (int c = 0; c < 3; ++c) {
      const ChainProfile p = randomChain(rng, n, /*withOptions=*/c != 1);
      const OptimalChainSolver whole(p);
      const std::vector<ParetoPoint> curve = whole.curve();
      ASSERT_FALSE(curve.empty());
      std::vector<int64_t> caps = {whole.minFeasibleBudget() - 1, curve.back().budgetBytes + 7};
      for (size_t k = 0; k < curve.size(); k += std::max<size_t>(1, curve.size() / 6))
        caps.push_back(curve[k].budgetBytes + static_cast<int64_t>(k % 3));
      for (int64_t cap : caps) {
        const OptimalChainSolver capped(p, cap);
        EXPECT_EQ(capped.minFeasibleBudget(), whole.minFeasibleBudget()) << "n=" << n;
        for (int64_t budget : {cap, cap - 1, (whole.minFeasibleBudget() + cap) / 2}) {
          const std::optional<ChainPlan> a = whole.planFor(budget);
          const std::optional<ChainPlan> b = capped.planFor(budget);
          ASSERT_EQ(a.has_value(), b.has_value()) << "n=" << n << " cap=" << cap;
          if (a) {
            EXPECT_EQ(planSignature(*a), planSignature(*b)) << "n=" << n << " cap=" << cap;
            ++compared;
          }
        }
        std::vector<ParetoPoint> below;
        for (const ParetoPoint& pt : curve)
          if (pt.budgetBytes <= cap) below.push_back(pt);
        const std::vector<ParetoPoint> cut = capped.curve();
        ASSERT_EQ(cut.size(), below.size()) << "n=" << n << " cap=" << cap;
        for (size_t k = 0; k < cut.size(); ++k) {
          EXPECT_EQ(cut[k].budgetBytes, below[k].budgetBytes);
          EXPECT_EQ(cut[k].extraNs, below[k].extraNs);
        }
      }
    }
  }
  EXPECT_GT(compared, 200);
  // makePlan solves under its budget; an infeasible budget still gets the lowest-peak plan.
  const ChainProfile p = randomChain(rng, 40, true);
  const OptimalChainSolver whole(p);
  for (int64_t budget : {whole.minFeasibleBudget() - 1, whole.minFeasibleBudget(),
                         whole.curve()[whole.curve().size() / 2].budgetBytes}) {
    const PlanReport r = makePlan(p, budget, Strategy::kOptimal, 0.05);
    const PlanReport w = makePlan(p, budget, Strategy::kOptimal, 0.05, &whole);
    EXPECT_EQ(planSignature(r.plan), planSignature(w.plan)) << budget;
    EXPECT_EQ(r.minFeasibleBudgetBytes, w.minFeasibleBudgetBytes);
  }
  // Where no optimal plan is read (another strategy, store-all fits) the least feasible budget
  // is still the whole solve's.
  const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
  EXPECT_EQ(makePlan(p, storeAll, Strategy::kOptimal).minFeasibleBudgetBytes,
            whole.minFeasibleBudget());
  EXPECT_EQ(planSignature(makePlan(p, storeAll, Strategy::kOptimal).plan),
            planSignature(storeAllPlan(p)));
  EXPECT_EQ(makePlan(p, whole.minFeasibleBudget(), Strategy::kSqrtN).minFeasibleBudgetBytes,
            whole.minFeasibleBudget());
}

TEST(OptimalChainSolver, ACappedSolveFindsTheLeastBudgetWhereSegmentsNeedLessAsTheyGrow) {
  // A recomputed segment holds its last stage's gradient through its re-run, so a longer one may
  // need less than a shorter one (a large gradient, then a small one) where the re-run's moments
  // weigh most: a recording's recomputed stages with much outside memory while they run again. A
  // solve capped at a budget must not stop growing a segment at the larger need.
  std::mt19937_64 rng(11);
  int shrinking = 0;
  for (int n = 3; n <= 20; ++n) {
    for (int c = 0; c < 20; ++c) {
      ChainProfile p = randomChain(rng, n, /*withOptions=*/false);
      for (Stage& s : p.stages)
        if (rng() % 2 == 0) s.recomputeOutsideBytes = static_cast<int64_t>(rng() % 1200);
      for (int i = 0; i < n && p.stages[i].checkpointable; ++i) {
        RecomputedSegment segment(p, i);
        int64_t most = 0;
        for (int k = i; extends(p, i, k); ++k) {
          const int64_t local = segment.grow().local;
          ASSERT_LE(segment.leastNeedFromHereOn(), local);
          if (local < most) ++shrinking;
          most = std::max(most, local);
        }
      }
      EXPECT_EQ(OptimalChainSolver(p, 0).minFeasibleBudget(),
                OptimalChainSolver(p).minFeasibleBudget())
          << "n=" << n << " c=" << c;
    }
  }
  EXPECT_GT(shrinking, 100);  // (else the test would not test it)
}

TEST(OptimalChainSolver, BeatsSqrtNAtSqrtNsOwnMemory) {
  std::mt19937_64 rng(7);
  for (int n : {4, 6, 9, 12, 16, 25, 40}) {
    for (int c = 0; c < 3; ++c) {
      ChainProfile p = randomChain(rng, n, false);
      for (Stage& s : p.stages) s.checkpointable = true;
      const SimResult sqrtN = simulate(p, sqrtNPlan(p));
      const OptimalChainSolver solver(p);
      const std::optional<ChainPlan> best = solver.planFor(sqrtN.peakBytes);
      ASSERT_TRUE(best.has_value());
      // Never more; on heterogeneous chains long enough for segments to matter, strictly less.
      // (On 4 or 6 stages sqrt(n)'s two segments are sometimes already the optimum.)
      const int64_t extra = simulate(p, *best).extraNs;
      EXPECT_LE(extra, sqrtN.extraNs) << "n=" << n;
      if (n >= 9) {
        EXPECT_LT(extra, sqrtN.extraNs) << "n=" << n;
      }
    }
  }
  // A homogeneous chain: never worse.
  ChainProfile h;
  h.inputBytes = 10;
  for (int i = 0; i < 16; ++i) h.stages.push_back(stage("b" + std::to_string(i), 10, 20, 40, 10));
  const SimResult sqrtN = simulate(h, sqrtNPlan(h));
  EXPECT_EQ(planSignature(sqrtNPlan(h)), "RRRR|RRRR|RRRR|S|S|S|S");
  EXPECT_LE(simulate(h, *OptimalChainSolver(h).planFor(sqrtN.peakBytes)).extraNs, sqrtN.extraNs);
}

TEST(Baselines, ShapesOfThePlans) {
  ChainProfile p;
  p.inputBytes = 10;
  for (int i = 0; i < 5; ++i) p.stages.push_back(stage("b" + std::to_string(i), 10, 20, 40, 10));
  p.stages[2].checkpointable = false;
  EXPECT_EQ(planSignature(storeAllPlan(p)), "S|S|S|S|S");
  EXPECT_EQ(planSignature(checkpointAllPlan(p)), "R|R|S|R|R");
  // Each stage stores 50 bytes: a threshold of 100 makes segments of two.
  EXPECT_EQ(planSignature(greedyPlan(p, 100)), "RR|S|S|S");
  EXPECT_EQ(planSignature(greedyPlan(p, 49)), "R|R|S|R|S");
}

TEST(Baselines, GreedySearchFitsWhenAThresholdDoes) {
  std::mt19937_64 rng(11);
  for (int c = 0; c < 20; ++c) {
    ChainProfile p = randomChain(rng, 12, false);
    const OptimalChainSolver solver(p);
    const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
    const int64_t budget = (storeAll + solver.minFeasibleBudget()) / 2;
    const SimResult greedy = simulate(p, greedySearchPlan(p, budget));
    const std::optional<ChainPlan> best = solver.planFor(budget);
    ASSERT_TRUE(best.has_value());
    if (greedy.peakBytes <= budget) {
      EXPECT_GE(greedy.extraNs, simulate(p, *best).extraNs);
    }
  }
}

TEST(ChainProfileCheck, SizesAndTimesThatCannotBeAStepAreRefused) {
  // Sums past 2^63 made every figure wrap (a plan crashed, `pareto` printed 0 B): refused first.
  ChainProfile p = twoStages();
  ASSERT_TRUE(validateProfile(p).ok());
  p.staticBytes = 9000000000000000000;
  EXPECT_EQ(validateProfile(p).code(), absl::StatusCode::kInvalidArgument);
  p = twoStages();
  // Each fits, their sum does not.
  p.stages[0].savedBytes = kMaxProfileTotal / 2;
  p.stages[1].savedBytes = kMaxProfileTotal / 2;
  EXPECT_EQ(validateProfile(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(validateProfile(p).message()).find("sizes add up"), std::string::npos);
  p = twoStages();
  p.stages[1].options.push_back({"o", 1, kMaxProfileTotal, {}});
  EXPECT_NE(std::string(validateProfile(p).message()).find("times add up"), std::string::npos);
  // Large but possible: 1 PiB of activations over a year.
  p = twoStages();
  p.stages[0].savedBytes = int64_t{1} << 50;
  p.stages[0].forwardNs = int64_t{365} * 24 * 3600 * 1000000000;
  EXPECT_TRUE(validateProfile(p).ok());
}

TEST(LowerBound, ZeroWhenEverythingFitsAndPositiveBelow) {
  const ChainProfile p = twoStages();
  EXPECT_EQ(extraTimeLowerBound(p, 1000), 0);
  EXPECT_EQ(extraTimeLowerBound(p, 240), 0);  // store-all's peak: it fits
  // Store-all's peak is B's backward, 240, where A keeps its 60 bytes (input and saved): at 200
  // A must drop at least 40 of them, at no less than 5 ns per 60 bytes (its re-run), so at least
  // 3.33 ns: 3 after rounding down. (At the end of the forward, 230, only 30 must go: 2.5 ns.)
  EXPECT_EQ(extraTimeLowerBound(p, 200), 3);
  // The optimum there: recompute A, 5 ns.
  EXPECT_EQ(simulate(p, *OptimalChainSolver(p).planFor(200)).extraNs, 5);
}

TEST(LowerBound, SeesAPeakInTheBackwardThatTheEndOfTheForwardDoesNot) {
  // A chain whose last stage's backward needs a large working set: with everything stored the
  // end of the forward fits a budget that the backward does not, so only the backward says what
  // the stages before must drop.
  ChainProfile p;
  p.name = "backward peak";
  p.staticBytes = 1000;
  p.inputBytes = 10;
  p.stages = {stage("a", 40, 80, 200, 10), stage("b", 10, 20, 100, 10),
              stage("c", 10, 20, 50, 10, 0, 400)};
  const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
  ASSERT_EQ(storeAll, 1000 + 210 + 110 + 60 + 10 + 400 + 10);  // c's backward
  const int64_t budget = storeAll - 150;
  // The end of the forward, 1000 + 380 + 20, fits: that moment alone gave no bound.
  ASSERT_LT(1000 + 210 + 110 + 60 + 2 * 10, budget);
  const std::optional<ChainPlan> best = OptimalChainSolver(p).planFor(budget);
  ASSERT_TRUE(best.has_value());
  const int64_t optimum = simulate(p, *best).extraNs;
  const int64_t bound = extraTimeLowerBound(p, budget);
  // 150 bytes from a and b: b's 110 at 10/110 ns a byte, then 40 of a's 210 at 40/210.
  EXPECT_EQ(bound, 17);  // 10 + 7.62
  EXPECT_LE(bound, optimum);
  EXPECT_GT(bound, 0);
}

TEST(LowerBound, TakesARecomputedStagesForwardAtItsCheckpointedWorking) {
  // b's forward holds a large working set and much outside it; under a checkpoint it keeps
  // nothing (wc 0), and its re-run in the backward holds its working but not the outside bytes.
  // Recomputing b alone (10 ns) fits where storing it does not, and a (1,000 ns to re-run) need
  // not drop anything: the bound must not take b's first forward at its stored working, which
  // would ask a for bytes that no plan needs from it.
  ChainProfile p;
  p.name = "checkpointed forward";
  p.staticBytes = 1000;
  p.inputBytes = 10;
  p.stages = {stage("a", 1000, 2000, 200, 10), stage("b", 10, 20, 10, 10, 500)};
  p.stages[1].forwardOutsideBytes = 300;
  p.stages[1].recomputeOutsideBytes = 0;
  p.stages[1].checkpointedForwardWorkingBytes = 0;
  ASSERT_TRUE(validateProfile(p).ok());
  ASSERT_EQ(simulate(p, storeAllPlan(p)).peakBytes, 1000 + 210 + 10 + 500 + 10 + 300);
  const int64_t budget = 1000 + 210 + 10 + 500 + 10 + 10;  // b's re-run, with its gradient
  const std::optional<ChainPlan> best = OptimalChainSolver(p).planFor(budget);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(planSignature(*best), "S|R");
  EXPECT_EQ(simulate(p, *best).peakBytes, budget);
  EXPECT_EQ(simulate(p, *best).extraNs, 10);
  const int64_t bound = extraTimeLowerBound(p, budget);
  EXPECT_LE(bound, 10);
  EXPECT_GE(bound, 0);
}

TEST(Planner, InfeasibleBudgetNamesTheLeastThatFits) {
  const ChainProfile p = twoStages();
  const PlanReport r = makePlan(p, 150, Strategy::kOptimal);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.minFeasibleBudgetBytes, 194);
  EXPECT_EQ(r.predicted.peakBytes, 194);
  const PlanReport ok = makePlan(p, 194, Strategy::kOptimal);
  EXPECT_TRUE(ok.feasible);
  EXPECT_EQ(ok.predicted.extraNs, 5);
  EXPECT_EQ(ok.storeAllPeakBytes, 240);
}

TEST(Planner, TheMarginKeepsThePlanUnderTheBudget) {
  ChainProfile p;
  p.inputBytes = 10;
  for (int i = 0; i < 8; ++i) p.stages.push_back(stage("b" + std::to_string(i), 10, 20, 40, 10));
  const OptimalChainSolver solver(p);
  for (const ParetoPoint& pt : solver.curve()) {
    const PlanReport exact = makePlan(p, pt.budgetBytes, Strategy::kOptimal, 0.0, &solver);
    EXPECT_EQ(exact.predicted.extraNs, pt.extraNs);
    EXPECT_EQ(exact.marginBytes, 0);
    const PlanReport safe = makePlan(p, pt.budgetBytes, Strategy::kOptimal, 0.1, &solver);
    EXPECT_EQ(safe.marginBytes, std::llround(0.1 * pt.budgetBytes));
    EXPECT_TRUE(safe.feasible);
    // Under the margin when a plan fits there; else the plan with the lowest peak (the most
    // room under the budget), or store-all where it fits the budget itself.
    const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
    if (storeAll <= pt.budgetBytes) {
      EXPECT_EQ(safe.predicted.extraNs, 0);
      EXPECT_EQ(safe.marginMet, storeAll <= pt.budgetBytes - safe.marginBytes);
    } else if (solver.planFor(pt.budgetBytes - safe.marginBytes)) {
      EXPECT_TRUE(safe.marginMet);
      EXPECT_LE(safe.predicted.peakBytes, pt.budgetBytes - safe.marginBytes);
      EXPECT_GE(safe.predicted.extraNs, pt.extraNs);
    } else {
      EXPECT_FALSE(safe.marginMet);
      EXPECT_EQ(safe.predicted.peakBytes, solver.minFeasibleBudget());
    }
  }
  // A budget at the store-all peak (100 %) recomputes nothing, margin or not.
  const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
  const PlanReport full = makePlan(p, storeAll, Strategy::kOptimal, 0.1, &solver);
  EXPECT_EQ(planSignature(full.plan), planSignature(storeAllPlan(p)));
  EXPECT_FALSE(full.marginMet);
  EXPECT_TRUE(full.feasible);
}

TEST(PlanJson, ProfileRoundTripsAndPlanParses) {
  ChainProfile p = twoStages();
  p.stages[0].options.push_back({"mlp", 20, 2, {"A.mlp"}});
  p.stages[0].options.push_back({"attn", 30, 3, {"A.attn"}, 1, 2});
  p.stages[1].options.push_back({"keep matmul outputs", 10, 4, {}, -1, -1, kSavePolicyMatmul});
  p.stages[1].backwardOutsideBytes = 7;
  p.stages[1].rerunNs = 9;
  p.stages[1].linked = false;
  p.endOutsideBytes = 3;
  const std::string text = chainProfileToJson(p);
  absl::StatusOr<ChainProfile> back = parseChainProfile(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(chainProfileToJson(*back), text);
  // An option's measured transients travel; absent, they stay unknown (the defaults).
  EXPECT_EQ(back->stages[0].options[1].forwardWorkingBytes, 1);
  EXPECT_EQ(back->stages[0].options[1].backwardWorkingBytes, 2);
  EXPECT_EQ(back->stages[0].options[0].backwardWorkingBytes, -1);
  EXPECT_EQ(optionBackwardWorkingBytes(back->stages[0], back->stages[0].options[0]),
            p.stages[0].backwardWorkingBytes + 50 - 20);
  EXPECT_EQ(back->stages[1].options[0].policy, kSavePolicyMatmul);
  EXPECT_TRUE(back->stages[0].options[0].policy.empty());
  // A re-run's own time travels; absent, a re-run takes the forward's.
  EXPECT_EQ(back->stages[1].rerunCostNs(), 9);
  // So does a stage not fed by the one before; absent, a stage is.
  EXPECT_FALSE(back->stages[1].linked);
  EXPECT_TRUE(back->stages[0].linked);
  EXPECT_EQ(back->stages[0].rerunNs, 0);
  EXPECT_EQ(back->stages[0].rerunCostNs(), back->stages[0].forwardNs);

  PlanReport r = makePlan(*back, 194, Strategy::kOptimal);
  r.source.profile = "two.json";
  absl::StatusOr<PlanDocument> doc = parsePlanDocument(planToJson(*back, r));
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->strategy, "optimal");
  EXPECT_EQ(doc->budgetBytes, 194);
  EXPECT_EQ(doc->predictedPeakBytes, r.predicted.peakBytes);
  EXPECT_EQ(doc->source.profile, "two.json");
  ASSERT_FALSE(doc->segments.empty());
  EXPECT_EQ(doc->segments.front().modules.front(), "A");
  // Each segment says the input it was made for: its first stage's.
  EXPECT_EQ(doc->segments.front().inputBytes, back->inputBytes);
  EXPECT_TRUE(doc->warnings.empty());
  EXPECT_TRUE(doc->source.asRecorded.plan.empty());
  EXPECT_EQ(planToJson(*back, r).find("as_recorded"), std::string::npos);
  // What a step that re-ran blocks itself ran travels with the plan made from it.
  r.source.asRecorded = {"R|S", 300, 12, 400};
  doc = parsePlanDocument(planToJson(*back, r));
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->source.asRecorded.plan, "R|S");
  EXPECT_EQ(doc->source.asRecorded.peakBytes, 300);
  EXPECT_EQ(doc->source.asRecorded.extraNs, 12);
  EXPECT_EQ(doc->source.asRecorded.stepNs, 400);
  // ... read as strictly as the rest of the document.
  nlohmann::json stray = nlohmann::json::parse(planToJson(*back, r));
  stray["source"]["as_recorded"]["peak"] = 1;
  doc = parsePlanDocument(stray.dump());
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(doc.status().message().find("source.as_recorded: unknown key 'peak'"),
            std::string::npos)
      << doc.status();
  r.source.asRecorded = {};
  // What the model did not capture travels with the plan.
  r.warnings = {"blocks called more than once in one forward (A (2) calls): ..."};
  doc = parsePlanDocument(planToJson(*back, r));
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->warnings, r.warnings);
}

TEST(PlanJson, AProfileReadsPastTheCheckOfItsRecording) {
  ChainProfile p = twoStages();
  nlohmann::json j = nlohmann::json::parse(chainProfileToJson(p));
  j["recorded"] = {{"step", 4},
                   {"plan", "S|R"},
                   {"predicted_peak_bytes", 300},
                   {"measured_peak_bytes", 301},
                   {"measured_step_ns", 9}};
  absl::StatusOr<ChainProfile> back = parseChainProfile(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), p.size());
  // ... as strictly as the rest.
  j["recorded"]["peak"] = 1;
  back = parseChainProfile(j.dump());
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("profile.recorded: unknown key 'peak'"), std::string::npos)
      << back.status();
}

TEST(PlanJson, NestedAndOpLevelPlansTravelInTheDocument) {
  ChainProfile p = twoStages();
  p.stages[1].options.push_back({"keep matmul outputs", 10, 4, {}, -1, -1, kSavePolicyMatmul});
  PlanReport r;
  r.plan.segments = {{0, 1, SegmentMode::kRecompute}};
  r.plan.segments[0].inner = {{0, 0, SegmentMode::kRecompute}, {1, 1, SegmentMode::kStore}};
  r.predicted = simulate(p, r.plan);
  const std::string nested = planToJson(p, r);
  absl::StatusOr<PlanDocument> doc = parsePlanDocument(nested);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ(doc->segments.size(), 1u);
  ASSERT_EQ(doc->segments[0].inner.size(), 2u);
  EXPECT_EQ(doc->segments[0].inner[0].mode, "recompute");
  EXPECT_EQ(doc->segments[0].inner[0].modules, std::vector<std::string>{"A"});
  EXPECT_EQ(doc->segments[0].inner[1].mode, "store");
  EXPECT_NE(nested.find("\"version\": 2"), std::string::npos);
  // A plan that does not nest is version 1, what readers from before nesting apply.
  r.plan.segments = {{0, 0, SegmentMode::kRecompute}, {1, 1, SegmentMode::kStore, 0}};
  const std::string flat = planToJson(p, r);
  EXPECT_NE(flat.find("\"version\": 1"), std::string::npos);
  doc = parsePlanDocument(flat);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->segments[1].policy, kSavePolicyMatmul);
  EXPECT_EQ(doc->segments[1].mode, "selective");
  // Inner segments that do not fit their segment are refused, saying where.
  auto refusal = [&](const std::string& inner) {
    nlohmann::json j = nlohmann::json::parse(nested);
    j["segments"][0]["inner"] = nlohmann::json::parse(inner);
    absl::StatusOr<PlanDocument> d = parsePlanDocument(j.dump());
    return d.ok() ? std::string("ok") : std::string(d.status().message());
  };
  EXPECT_EQ(
      refusal(R"([{"mode": "store", "modules": ["B"]}, {"mode": "store", "modules": ["A"]}])"),
      "segments[0].inner[0]: module B is not the segment's next module");
  EXPECT_EQ(refusal(R"([{"mode": "store", "modules": ["A"]}])"),
            "segments[0]: its inner segments cover 1 of its 2 modules");
  EXPECT_EQ(
      refusal(R"([{"mode": "selective", "modules": ["A"]}, {"mode": "store", "modules": ["B"]}])"),
      "segments[0].inner[0]: inner segments store or recompute");
  EXPECT_EQ(refusal(R"("x")"), "segments[0]: inner must be a list");
}

// apply --job: the ranks switch far enough ahead that every one is sent the plan in time — at
// least 3 steps, and at least 2 s (plus the time spent reading the ranks) at the fastest pace.
TEST(PlanJson, AJobSwitchesFarEnoughAheadOfItsFurthestRank) {
  const int64_t ms = 1'000'000;
  std::vector<StepSpan> steps;
  for (int64_t i = 1; i <= 8; ++i)
    steps.push_back({i, i * 1000 * ms, i * 1000 * ms + 100 * i * ms});
  steps.push_back({9, 9000 * ms, 0});  // open
  const RankProgress p = rankProgress(steps);
  EXPECT_EQ(p.lastStep, 9);
  EXPECT_EQ(p.stepNs, 600 * ms);  // the median of steps 4-8: 400 ... 800 ms
  EXPECT_EQ(rankProgress({}).stepNs, 0);
  EXPECT_EQ(rankProgress({{1, 5, 0}}).stepNs, 0);  // no step closed yet
  // Slow steps: 3 ahead. Unknown pace: 3 ahead.
  EXPECT_EQ(jobApplyStep({{10, 2000 * ms}, {12, 3000 * ms}}), 15);
  EXPECT_EQ(jobApplyStep({{10, 0}, {12, 0}}), 15);
  // 400 ms on the fastest rank: 13 steps are 5 s.
  EXPECT_EQ(jobApplyStep({{10, 500 * ms}, {12, 400 * ms}}), 25);
  // 10 ms steps: 500 ahead; 700 when reading the ranks took a second (sending takes as long).
  EXPECT_EQ(jobApplyStep({{12, 10 * ms}}), 512);
  EXPECT_EQ(jobApplyStep({{12, 10 * ms}}, 1000 * ms), 712);
}

TEST(PlanJson, BadProfilesSayWhatIsWrong) {
  auto error = [](const std::string& text) {
    absl::StatusOr<ChainProfile> p = parseChainProfile(text);
    return p.ok() ? std::string("ok") : std::string(p.status().message());
  };
  const std::string head =
      R"({"format": "tidemark-chain-profile", "version": 1, "input_bytes": 1, )";
  EXPECT_EQ(error("{"), "not valid JSON");
  EXPECT_EQ(error(R"({"format": "tidemark-plan", "version": 1})"),
            "format is 'tidemark-plan', expected 'tidemark-chain-profile'");
  EXPECT_EQ(error(R"({"format": "tidemark-chain-profile", "version": 9})"),
            "tidemark-chain-profile version 9 is newer than this tidemark reads (1)");
  EXPECT_EQ(error(head + R"("stages": []})"), "the chain has no stages");
  EXPECT_EQ(error(head + R"("stages": [{"name": "a", "forward_ns": 1, "backward_ns": 1,
            "saved_bytes": 1, "output_bytes": 1, "saved_byte": 3}]})"),
            "stages[0]: unknown key 'saved_byte'");
  EXPECT_EQ(error(head + R"("stages": [{"name": "a", "forward_ns": "1", "backward_ns": 1,
            "saved_bytes": 1, "output_bytes": 1}]})"),
            "stages[0]: forward_ns must be an integer");
  EXPECT_EQ(error(head + R"("stages": [{"name": "a", "backward_ns": 1,
            "saved_bytes": 1, "output_bytes": 1}]})"),
            "stages[0]: missing forward_ns");
  EXPECT_EQ(error(head + R"("stages": [{"name": "a", "forward_ns": 1, "backward_ns": 1,
            "saved_bytes": -1, "output_bytes": 1}]})"),
            "stage 0 (a): a negative size");
  EXPECT_EQ(error(head + R"("stages": [{"name": "a", "forward_ns": 1, "backward_ns": 1,
            "saved_bytes": 4, "output_bytes": 1, "options": [{"name": "o", "saved_bytes": 1,
            "recompute_ns": 1, "recompute": [], "backward_working_bytes": -1}]}]})"),
            "stages[0].options[0]: backward_working_bytes must not be negative");
  EXPECT_EQ(error(head + R"("stages": [{"name": "a", "forward_ns": 1, "backward_ns": 1,
            "saved_bytes": 4, "output_bytes": 1, "options": [
            {"name": "o", "saved_bytes": 1, "recompute_ns": 1, "recompute": []},
            {"name": "o", "saved_bytes": 2, "recompute_ns": 1, "recompute": []}]}]})"),
            "stage 0 (a): two options are named 'o'");
  // An op-level option's policy: every call of the compute-heavy ops, or some calls of them.
  auto withPolicy = [&](const std::string& policy) {
    return error(head + R"("stages": [{"name": "a", "forward_ns": 1, "backward_ns": 1,
            "saved_bytes": 4, "output_bytes": 1, "options": [{"name": "o", "saved_bytes": 1,
            "recompute_ns": 1, "recompute": [], "policy": ")" +
                 policy + R"("}]}]})");
  };
  for (const char* good : {"matmul", "matmul:addmm#0", "matmul:addmm#0,bmm#12,_foo_2#3"})
    EXPECT_EQ(withPolicy(good), "ok") << good;
  for (const char* bad :
       {"matmul:", "matmul:addmm", "matmul:addmm#", "matmul:#0", "matmul:Addmm#0",
        "matmul:addmm#0,", "matmul:addmm#x", "mm:addmm#0", "matmul:addmm#12345678901", "matmulx"})
    EXPECT_EQ(withPolicy(bad), absl::StrCat("stage 0 (a): option 'o' has an unknown policy '", bad,
                                            "' (matmul, or matmul:OP#N,... for some of the calls)"))
        << bad;
}

}  // namespace
}  // namespace tidemark::core
