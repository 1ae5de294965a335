#pragma once
// A plan as Megatron-LM's recomputation flags: the flag sets Megatron offers
// (--recompute-granularity full with --recompute-method block or uniform and
// --recompute-num-layers N, or --recompute-granularity selective), each simulated on the chain
// like any plan, and the cheapest that fits the budget. The chain's checkpointable stages are
// taken as Megatron's transformer layers (docs/plan-format.md, "Megatron-LM flags").

#include <cstdint>
#include <string>
#include <vector>

#include "src/advisor/chain.h"
#include "src/advisor/simulator.h"

namespace tidemark::core {

struct MegatronChoice {
  std::vector<std::string> flags;  // none: no recomputation
  ChainPlan plan;                  // the same, in the chain's terms
  SimResult predicted;
  bool fits = false;  // its predicted peak is within the bytes asked
};

struct MegatronExport {
  // The cheapest flag set that fits; when none does, the one with the lowest peak (fits false).
  MegatronChoice best;
  int candidates = 0;       // flag sets simulated
  bool sameAsPlan = false;  // the plan compared with is one of them (the same segments)
  // Where the flags stand for something a little different: Megatron's selective recomputation
  // re-runs the core attention only (not its projections, which tidemark's attention option
  // re-runs too); empty when there is nothing to say.
  std::string note;
};

// The flag sets for a chain, fitted as tidemark's plans are (makePlan): within the budget less
// its margin, or — no flags at all — within the budget itself (the step as it ran), compared
// with `plan` (tidemark's plan for that budget).
MegatronExport megatronExport(const ChainProfile& profile, int64_t budgetBytes, int64_t marginBytes,
                              const ChainPlan& plan);

// {"flags": "...", "fits": ..., "predicted": {"peak_bytes", "extra_ns"}, "plan_expressible": ...,
// "candidates": N, "note": "..."}
std::string megatronToJson(const MegatronExport& e);

}  // namespace tidemark::core
