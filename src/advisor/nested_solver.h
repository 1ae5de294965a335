#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "src/advisor/chain.h"
#include "src/advisor/chain_front.h"
#include "src/advisor/solvers.h"

namespace tidemark::core {

// The optimal plan with nested checkpointing, for every budget at once (docs/chain-model.md,
// "Nested checkpointing"): a recomputed segment's re-run may itself keep only the inputs of
// inner segments and recompute those again at their backward, to any depth — Rotor's persistent
// schedule (Beaumont et al. 2019) written into tidemark's memory model, exact in bytes.
//
// Beside the one-level solver's fronts (stages i.. at the top level), it keeps for every segment
// [i, q] the front of its re-run (R(i, q): headroom needed above what is kept below it, extra
// time, its own re-run included) and, for every segment end q, the fronts of the parts that cover
// i..q inside a re-run of a segment ending at q. A re-run differs from the top level in three
// ways: the segment's incoming gradient is live through it, outside memory is the backward's, and
// it has no end-of-forward moment. O(n^3) front merges: meant for chains of tens of stages
// (kNestedStagesMax); a plan the one-level solver finds is always among its plans, so its optimum
// is never worse.
class NestedChainSolver : public ChainFront {
 public:
  explicit NestedChainSolver(const ChainProfile& profile,
                             int64_t maxBudgetBytes = std::numeric_limits<int64_t>::max());

  std::vector<ParetoPoint> curve() const override;
  int64_t minFeasibleBudget() const override { return m_minFeasibleBudget; }
  std::optional<ChainPlan> planFor(int64_t budgetBytes) const override;

 private:
  // The parts of a re-run of [i, q] read back for headroom h (a recomputed segment's inner plan;
  // empty when it stores every stage).
  std::vector<Segment> readRerun(int i, int q, int64_t h) const;
  const Front& rerun(int i, int q) const { return m_rerun[i * m_n + q]; }
  const Front& inside(int q, int i) const { return m_inside[q * (m_n + 1) + i]; }

  const ChainProfile& m_profile;
  int m_n = 0;
  int64_t m_maxBudget = 0;
  int64_t m_minFeasibleBudget = 0;
  std::vector<Front> m_top;     // stages i..n-1 at the top level; [n]: the end of the forward
  std::vector<Front> m_rerun;   // [i * n + q]: R(i, q), empty when [i, q] cannot be recomputed
  std::vector<Front> m_inside;  // [q * (n + 1) + i]: parts i..q inside a re-run ending at q
};

// Chains up to this many stages get nested plans (NestedChainSolver) when asked; longer ones are
// planned one level deep.
inline constexpr int kNestedStagesMax = 64;

}  // namespace tidemark::core
