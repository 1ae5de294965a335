// Nested checkpointing in the chain model: the simulator against a hand-computed schedule, the
// nested dynamic program against exhaustive search over every nested plan, never worse than one
// level, and what it buys on long homogeneous chains.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "src/advisor/chain.h"
#include "src/advisor/nested_solver.h"
#include "src/advisor/planner.h"
#include "src/advisor/simulator.h"
#include "src/advisor/solvers.h"
#include "tests/unit/chain_fixtures.h"

namespace tidemark::core {
namespace {

using chain_fixtures::randomChain;
using chain_fixtures::stage;

ChainProfile twoStages() {
  ChainProfile p;
  p.staticBytes = 100;
  p.inputBytes = 10;
  p.stages = {stage("A", 5, 10, 50, 20, 3, 4), stage("B", 7, 14, 30, 10)};
  return p;
}

std::vector<int64_t> liveOf(const SimResult& r) {
  std::vector<int64_t> live;
  for (const SimPoint& pt : r.points) live.push_back(pt.liveBytes);
  return live;
}

TEST(NestedSimulator, AnInnerSegmentIsRunAgainAtItsOwnBackward) {
  const ChainProfile p = twoStages();
  // One segment over both stages; its re-run keeps only A's input and stores B.
  Segment outer{0, 1, SegmentMode::kRecompute};
  outer.inner = {{0, 0, SegmentMode::kRecompute}, {1, 1, SegmentMode::kStore}};
  const ChainPlan nested{{outer}};
  ASSERT_TRUE(validatePlan(p, nested).ok());
  EXPECT_EQ(planSignature(nested), "R[R|S]");
  EXPECT_EQ(planDepth(nested), 2);
  const SimResult r = simulate(p, nested, true);
  // Forward A 133, B 140; end 130; re-run A keeping its input 143, B stored 150; backward B 190;
  // A run again at its own backward 153, its backward 194.
  EXPECT_EQ(liveOf(r), (std::vector<int64_t>{133, 140, 130, 143, 150, 190, 153, 194}));
  EXPECT_EQ(r.peakBytes, 194);
  EXPECT_EQ(r.extraNs, 5 + 7 + 5);  // both re-run once, A once more
  // The one-level segment holds A's activations through B's backward: 240.
  EXPECT_EQ(simulate(p, ChainPlan{{{0, 1, SegmentMode::kRecompute}}}).peakBytes, 240);
  EXPECT_EQ(planDepth(ChainPlan{{{0, 1, SegmentMode::kRecompute}}}), 1);
}

TEST(NestedPlanCheck, RejectsInnerPlansThatDoNotFit) {
  const ChainProfile p = twoStages();
  Segment outer{0, 1, SegmentMode::kRecompute};
  outer.inner = {{0, 1, SegmentMode::kRecompute}};  // itself
  EXPECT_FALSE(validatePlan(p, ChainPlan{{outer}}).ok());
  outer.inner = {{0, 0, SegmentMode::kStore}};  // does not cover B
  EXPECT_FALSE(validatePlan(p, ChainPlan{{outer}}).ok());
  Segment stored{0, 0, SegmentMode::kStore};
  stored.inner = {{0, 0, SegmentMode::kStore}};  // only a recomputed segment has one
  EXPECT_FALSE(validatePlan(p, ChainPlan{{stored, {1, 1, SegmentMode::kStore}}}).ok());
  ChainProfile withOption = p;
  withOption.stages[0].options.push_back({"half", 25, 2, {"A.mlp"}});
  outer.inner = {{0, 0, SegmentMode::kStore, 0}, {1, 1, SegmentMode::kStore}};
  EXPECT_FALSE(validatePlan(withOption, ChainPlan{{outer}}).ok());
}

// Every inner plan of a re-run of [first, last]: parts covering it in order, each a stored stage
// or a recomputed segment (not the whole) with any inner plan of its own. The plan that stores
// every stage is written as no inner plan, once.
void forEachInner(const ChainProfile& p, int first, int last,
                  const std::function<void(const std::vector<Segment>&)>& visit) {
  std::vector<Segment> cur;
  std::function<void(int)> go = [&](int i) {
    if (i > last) {
      const bool allStored = std::all_of(
          cur.begin(), cur.end(), [](const Segment& s) { return s.mode == SegmentMode::kStore; });
      visit(allStored ? std::vector<Segment>{} : cur);
      return;
    }
    cur.push_back({i, i, SegmentMode::kStore});
    go(i + 1);
    cur.pop_back();
    for (int k = i; k <= last; ++k) {
      if (i == first && k == last) break;
      forEachInner(p, i, k, [&](const std::vector<Segment>& inner) {
        Segment seg{i, k, SegmentMode::kRecompute};
        seg.inner = inner;
        cur.push_back(seg);
        go(k + 1);
        cur.pop_back();
      });
    }
  };
  go(first);
}

// Every plan of the chain, nested to any depth: each stage starts a stored stage (with or
// without an option), is offloaded (with an offload speed) or starts a recomputed segment with
// any inner plan.
void forEachNestedPlan(const ChainProfile& p, const std::function<void(const ChainPlan&)>& visit) {
  ChainPlan cur;
  std::function<void(int)> go = [&](int i) {
    if (i == p.size()) {
      visit(cur);
      return;
    }
    for (int o = -1; o < static_cast<int>(p.stages[i].options.size()); ++o) {
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
      forEachInner(p, i, k, [&](const std::vector<Segment>& inner) {
        Segment seg{i, k, SegmentMode::kRecompute};
        seg.inner = inner;
        cur.segments.push_back(seg);
        go(k + 1);
        cur.segments.pop_back();
      });
    }
  };
  go(0);
}

TEST(NestedChainSolver, EqualsExhaustiveSearchOverNestedPlans) {
  std::mt19937_64 rng(20261203);
  int budgetsChecked = 0, nestedOptima = 0;
  for (int n = 1; n <= 8; ++n) {
    const int chains = n <= 5 ? 5 : (n <= 7 ? 2 : 1);
    for (int c = 0; c < chains; ++c) {
      ChainProfile p = randomChain(rng, n, /*withOptions=*/n <= 6);
      // The longest chains with every stage checkpointable and fed by the one before: the whole
      // space, over a million plans.
      if (n >= 7)
        for (Stage& s : p.stages) s.checkpointable = s.linked = true;
      // (peak, extra, depth) of every plan.
      struct Seen {
        int64_t peak, extra;
        int depth;
        bool operator<(const Seen& o) const {
          return peak != o.peak ? peak < o.peak : extra < o.extra;
        }
      };
      std::vector<Seen> all;
      size_t plans = 0;
      forEachNestedPlan(p, [&](const ChainPlan& pl) {
        ++plans;
        const SimResult r = simulate(p, pl);
        all.push_back({r.peakBytes, r.extraNs, planDepth(pl)});
      });
      std::sort(all.begin(), all.end());
      const NestedChainSolver solver(p);
      EXPECT_EQ(solver.minFeasibleBudget(), all.front().peak) << "n=" << n;
      std::set<int64_t> budgets;
      for (const Seen& s : all) budgets.insert({s.peak, s.peak - 1});
      int64_t best = std::numeric_limits<int64_t>::max();
      int bestDepth = 0;
      size_t k = 0;
      for (int64_t budget : budgets) {
        while (k < all.size() && all[k].peak <= budget) {
          if (all[k].extra < best || (all[k].extra == best && all[k].depth < bestDepth)) {
            best = all[k].extra;
            bestDepth = all[k].depth;
          }
          ++k;
        }
        const std::optional<ChainPlan> got = solver.planFor(budget);
        if (best == std::numeric_limits<int64_t>::max()) {
          EXPECT_FALSE(got.has_value()) << "n=" << n << " budget=" << budget;
          continue;
        }
        ASSERT_TRUE(got.has_value()) << "n=" << n << " budget=" << budget;
        ASSERT_TRUE(validatePlan(p, *got).ok()) << planSignature(*got);
        const SimResult r = simulate(p, *got);
        EXPECT_LE(r.peakBytes, budget) << planSignature(*got);
        EXPECT_EQ(r.extraNs, best)
            << "n=" << n << " budget=" << budget << " " << planSignature(*got);
        // The lower bound holds for nested plans too.
        EXPECT_LE(extraTimeLowerBound(p, budget), best) << "n=" << n << " budget=" << budget;
        if (bestDepth > 1) ++nestedOptima;
        ++budgetsChecked;
      }
      for (const ParetoPoint& pt : solver.curve()) {
        const std::optional<ChainPlan> at = solver.planFor(pt.budgetBytes);
        ASSERT_TRUE(at.has_value());
        EXPECT_EQ(simulate(p, *at).extraNs, pt.extraNs);
      }
      if (n == 8) {
        RecordProperty("plans_8", std::to_string(plans));
        EXPECT_GT(plans, 1000000u);  // the search is the whole nested plan space
      }
    }
  }
  RecordProperty("budgets_checked", std::to_string(budgetsChecked));
  RecordProperty("nested_optima", std::to_string(nestedOptima));
  EXPECT_GT(budgetsChecked, 1000);
  // Nesting is where the optimum is at many of them (else the test would not test it).
  EXPECT_GT(nestedOptima, 100);
}

TEST(NestedChainSolver, NeverWorseThanOneLevelAndCappedSolvesPlanAsTheWhole) {
  std::mt19937_64 rng(3);
  int compared = 0;
  for (int n : {1, 3, 7, 12, 20, 32}) {
    for (int c = 0; c < 3; ++c) {
      const ChainProfile p = randomChain(rng, n, c != 1);
      const OptimalChainSolver flat(p);
      const NestedChainSolver nested(p);
      EXPECT_LE(nested.minFeasibleBudget(), flat.minFeasibleBudget()) << "n=" << n;
      const std::vector<ParetoPoint> curve = flat.curve();
      for (const ParetoPoint& pt : curve) {
        const std::optional<ChainPlan> got = nested.planFor(pt.budgetBytes);
        ASSERT_TRUE(got.has_value());
        const SimResult r = simulate(p, *got);
        EXPECT_LE(r.peakBytes, pt.budgetBytes);
        EXPECT_LE(r.extraNs, pt.extraNs) << "n=" << n << " " << planSignature(*got);
        ++compared;
      }
      // Capped: the same plans up to the cap, the same least feasible budget.
      const std::vector<ParetoPoint> whole = nested.curve();
      for (size_t k = 0; k < whole.size(); k += std::max<size_t>(1, whole.size() / 4)) {
        const int64_t cap = whole[k].budgetBytes + static_cast<int64_t>(k % 2);
        const NestedChainSolver capped(p, cap);
        EXPECT_EQ(capped.minFeasibleBudget(), nested.minFeasibleBudget());
        const std::optional<ChainPlan> a = nested.planFor(cap), b = capped.planFor(cap);
        ASSERT_EQ(a.has_value(), b.has_value());
        if (a) {
          EXPECT_EQ(planSignature(*a), planSignature(*b)) << "n=" << n << " cap=" << cap;
        }
      }
      const NestedChainSolver below(p, nested.minFeasibleBudget() - 1);
      EXPECT_EQ(below.minFeasibleBudget(), nested.minFeasibleBudget());
      EXPECT_TRUE(below.curve().empty());
    }
  }
  EXPECT_GT(compared, 100);
}

// A homogeneous transformer-like chain: each block saves 16 times its output.
ChainProfile homogeneous(int blocks, int64_t savedPerOutput) {
  ChainProfile p;
  p.staticBytes = 1000000;
  p.inputBytes = 1000;
  for (int i = 0; i < blocks; ++i)
    p.stages.push_back(stage("b" + std::to_string(i), 10, 20, savedPerOutput * 1000, 1000));
  return p;
}

TEST(NestedChainSolver, LongHomogeneousChainsFitInFarLessMemory) {
  for (int blocks : {32, 48}) {
    for (int64_t saved : {4, 16}) {
      const ChainProfile p = homogeneous(blocks, saved);
      const int64_t flat = OptimalChainSolver(p).minFeasibleBudget() - p.staticBytes;
      const int64_t nested = NestedChainSolver(p).minFeasibleBudget() - p.staticBytes;
      RecordProperty("least_" + std::to_string(blocks) + "_" + std::to_string(saved),
                     std::to_string(nested) + "/" + std::to_string(flat));
      EXPECT_LE(nested * 100, flat * 65) << blocks << " blocks, saved " << saved << ": " << nested
                                         << " against " << flat << " above static";
      const std::optional<ChainPlan> least = NestedChainSolver(p).planFor(nested + p.staticBytes);
      ASSERT_TRUE(least.has_value());
      EXPECT_EQ(simulate(p, *least).peakBytes, nested + p.staticBytes);
      EXPECT_GE(planDepth(*least), 2) << planSignature(*least);
    }
  }
}

TEST(NestedChainSolver, APlanAskedNestedForALongerChainSaysItIsOneLevelDeep) {
  const ChainProfile p = homogeneous(kNestedStagesMax + 1, 16);
  const int64_t least = OptimalChainSolver(p).minFeasibleBudget();
  const PlanReport r = makePlan(p, least, Strategy::kOptimal, 0, nullptr, /*nested=*/true);
  EXPECT_TRUE(r.feasible);
  EXPECT_LE(planDepth(r.plan), 1);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("was planned one level deep"), std::string::npos);
  // Within the limit a nested plan reaches below the one-level least budget, and says nothing.
  const ChainProfile q = homogeneous(kNestedStagesMax, 16);
  const PlanReport n = makePlan(q, OptimalChainSolver(q).minFeasibleBudget() - 1,
                                Strategy::kOptimal, 0, nullptr, /*nested=*/true);
  EXPECT_TRUE(n.feasible);
  EXPECT_GE(planDepth(n.plan), 2);
  EXPECT_TRUE(n.warnings.empty());
}

}  // namespace
}  // namespace tidemark::core
