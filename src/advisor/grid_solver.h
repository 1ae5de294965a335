#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "src/advisor/chain.h"
#include "src/advisor/solvers.h"

namespace tidemark::core {

// The Pareto curve of long chains (thousands of stages), within a bound it proves.
//
// The exact solver's fronts grow with the chain, and every stage weighs every front entry of every
// segment end: O(n^2 F), beyond a second past a few hundred stages. This solver runs the same
// recurrence (docs/chain-model.md) on grids of headroom values, twice:
//
//  - conservatively: each grid value holds the cheapest plan found whose exact need fits under
//    it (the need travels with the cost). What earlier stages leave is read at the grid value
//    below it, which always fits, or at the one above when that plan still fits exactly; every
//    plan it names fits where its exact peak says;
//  - optimistically, on a finer grid: rounded up, so its cost at each grid value is no more than
//    the optimum's there (a lower bound on every plan).
//
// The exact curve lies between the two. epsilonBytes() is the least shift that puts the first
// under the second at every budget, measured on this chain after the solve: every plan named at
// budget b + epsilonBytes() costs no more extra time than the optimum at b. A segment's best end
// for a grid value is a range minimum over segment ends (a monotone stack per grid value), so a
// pass costs O(n (G log n + L)) for G grid values and segments of up to L stages.
class GridChainSolver : public ChainFront {
 public:
  // The plans' grid puts this many values between the least feasible budget and storing
  // everything.
  static constexpr int kDefaultRangePoints = 20000;
  // The plans' grid over all headroom values has at most this many values, and its rows (each
  // stage's values up to its top) at most kMaxTableBytes in all, the plans' table (2 bytes a
  // value, 4 where a choice's code does not fit in 2: past 16,384 stages): a longer chain gets a
  // coarser grid.
  static constexpr int kMaxGridPoints = 1 << 15;
  static constexpr int64_t kMaxTableBytes = int64_t{128} << 20;
  // The bound's grid (no table) is this many times finer, within its own caps on values and on
  // its rows' values in all, its pass's work: about 0.7 s per 10^8 values on two cores, so
  // kBoundCellsPerStage values per stage keep a solve near 0.6 s per 1,000 stages (the targets:
  // 1 s at 1,000 stages, 10 s at 10,000), and kMaxBoundCells caps longer chains.
  static constexpr int kBoundRefinement = 16;
  static constexpr int kMaxBoundPoints = 1 << 18;
  static constexpr int64_t kBoundCellsPerStage = 80000;
  static constexpr int64_t kMaxBoundCells = int64_t{1} << 30;
  // A pass of at least this many values in all is shared among up to kMaxThreads threads, each
  // computing its part of every row (two barriers a stage).
  static constexpr int64_t kCellsPerThread = int64_t{1} << 22;
  static constexpr int kMaxThreads = 4;

  // threads: how many share each pass (0: up to kMaxThreads, one per processor, when the pass
  // has kCellsPerThread values or more; the answer is the same whatever the number).
  explicit GridChainSolver(const ChainProfile& profile, int rangePoints = kDefaultRangePoints,
                           int threads = 0);

  std::vector<ParetoPoint> curve() const override;
  int64_t minFeasibleBudget() const override { return m_minFeasibleBudget; }
  std::optional<ChainPlan> planFor(int64_t budgetBytes) const override;
  int64_t epsilonBytes() const override { return m_epsilonBytes; }

  // No plan within budgetBytes adds less extra time than this (unbounded below the least
  // feasible budget: INT64_MAX).
  int64_t lowerBoundAt(int64_t budgetBytes) const;
  int64_t gridStepBytes() const { return m_step; }
  int gridPoints() const { return m_grid + 1; }
  int64_t boundStepBytes() const { return m_up.step; }
  int boundPoints() const { return m_up.points; }

  // The headroom values of each stage: offset[i] + g * step for g in [0, points). Offsets make
  // storing a stage lead exactly from one stage's values onto the next one's. From top[i] up,
  // storing every stage from i on fits: those values cost nothing and are not computed (a row
  // is as long as its stages' store-all need, not the chain's).
  struct Grid {
    int64_t step = 1;
    int points = 1;
    std::vector<int64_t> offset;  // per stage, 0 .. n; each in [0, step)
    std::vector<int> top;         // per stage, 0 .. n: the first value that stores all from it
    bool down = true;             // round headroom down (plans that fit), else up (a bound)
    int64_t value(int stage, int g) const { return offset[stage] + static_cast<int64_t>(g) * step; }
    // The grid value of `stage` a headroom is read at (-1: none, below the grid).
    int at(int stage, int64_t headroom) const;
    // Where value g of `stage`, less `kept` (at most the value), is read: at(stage + 1, ...) is
    // shifted(g, shift(stage, kept)). A recomputed segment's end may be at any stage, so its
    // read is one index good for every stage's values, shifted(g, shiftAnyStage(stage, kept)):
    // down, at most the headroom whatever the offset; up, at least it.
    int64_t shift(int stage, int64_t kept) const;
    int64_t shiftAnyStage(int stage, int64_t kept) const;
    int shifted(int g, int64_t shift) const {
      const int64_t x = g + shift;
      if (x < 0) return down ? -1 : 0;
      return static_cast<int>(x < points - 1 ? x : points - 1);
    }
  };

  // What the conservative pass chose at each value of each row, in 2 bytes a value when every
  // code fits, else 4.
  struct ChoiceTable {
    bool wide = false;
    std::vector<int16_t> narrow;
    std::vector<int32_t> full;
    void assign(size_t values, int32_t code) {
      if (wide)
        full.assign(values, code);
      else
        narrow.assign(values, static_cast<int16_t>(code));
    }
    void set(size_t at, int32_t code) {
      if (wide)
        full[at] = code;
      else
        narrow[at] = static_cast<int16_t>(code);
    }
    int32_t get(size_t at) const { return wide ? full[at] : narrow[at]; }
  };

 private:
  struct Point {
    int64_t budgetBytes = 0;
    int64_t extraNs = 0;
    int grid = -1;  // the grid value its plan was read at; -1: the store-all plan
  };
  ChainPlan planAt(int grid) const;

  const ChainProfile& m_profile;
  int64_t m_step = 1;
  int m_grid = 0;  // grid values 0 .. m_grid, m_step bytes apart
  int64_t m_minFeasibleBudget = 0;
  int64_t m_epsilonBytes = 0;
  Grid m_down, m_up;  // the plans' grid and the bound's
  // Stage i, grid value g <= m_down.top[i]: what the conservative pass chose, at
  // m_choice.get(m_rowStart[i] + g) (above its top, stage i and every stage after it are stored).
  ChoiceTable m_choice;
  std::vector<size_t> m_rowStart;
  std::vector<int64_t> m_lower;  // the optimistic pass's cost at each bound grid value (stage 0)
  std::vector<Point> m_points;   // the curve: real plans, ascending budget, descending time
};

}  // namespace tidemark::core
