#pragma once

#include <cstdint>
#include <vector>

#include "src/advisor/chain.h"

namespace tidemark::core {

// Where in the schedule a memory figure was taken.
// kOutside: the profile's floor (the optimizer step, say) is the peak.
enum class SimPhase { kForward, kEndOfForward, kRecompute, kBackward, kOutside };
const char* simPhaseName(SimPhase p);

struct SimPoint {
  SimPhase phase = SimPhase::kForward;
  int stage = -1;  // -1 at the end of the forward
  int64_t liveBytes = 0;
};

struct SimResult {
  int64_t peakBytes = 0;
  SimPoint peakAt;
  int64_t extraNs = 0;  // recomputation the plan adds to a step
  int64_t stepNs = 0;   // the predicted step: every forward and backward once, plus extraNs
  std::vector<SimPoint> points;  // the whole schedule, when asked for
};

// Replays the plan's schedule (forward, recompute, backward, frees) on the memory model of
// docs/chain-model.md and reports the highest live total, static memory included. The plan must
// be valid (validatePlan). This is the reference the solvers are tested against.
SimResult simulate(const ChainProfile& profile, const ChainPlan& plan, bool keepPoints = false);

}  // namespace tidemark::core
