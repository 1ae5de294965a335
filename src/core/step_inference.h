#pragma once

#include <vector>

#include "src/core/breakdown.h"
#include "src/core/recording.h"

namespace tidemark::core {

// Whether a recording's steps are to be inferred: it has no step marks, and no phase marks either.
// An adapter marks every step it sees begin; one that marked phases and no step saw none begin (a
// session attached and detached within one step), and what repeats inside part of a step (a loop
// over 2,000 parameters) is no step: inferred there, it made a step of each repetition.
bool stepsToInfer(const Recording& recording);

// Steps for a recording that has no step marks (no adapter): training repeats itself, so the
// tracked total, taken event by event, is periodic. The period is the shortest of the highest
// peaks of the autocorrelation (2 to 64 periods' worth; a peak past its first fall, not the
// self-similarity of a smooth series at short lags), and each step ends at the lowest
// point of memory near the end of its period (after the optimizer, before the next forward).
// Returns no steps when nothing repeats (the best correlation is below minCorrelation). When the
// whole recording does not repeat, its second half is tried, then its last quarter, and so on
// (a start-up longer than the steps hides them): the steps are those of the longest tail that
// repeats, reaching back a period at a time while the period before has the same shape.
std::vector<StepInterval> inferSteps(const LivenessReplay& replay, double minCorrelation = 0.4);

// The tracked total after one event.
struct TotalPoint {
  uint64_t seq;
  int64_t ts;
  double total;
};
// The same from the totals after each event, in sequence order (a streaming analysis keeps them
// as it replays, or only the last of them: the steps are then found in that tail).
std::vector<StepInterval> inferSteps(const std::vector<TotalPoint>& events,
                                     double minCorrelation = 0.4);

}  // namespace tidemark::core
