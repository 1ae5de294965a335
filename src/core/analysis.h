#pragma once

#include <vector>

#include "src/core/breakdown.h"
#include "src/core/categorize.h"
#include "src/core/peak.h"
#include "src/core/recording.h"
#include "src/core/timeline.h"

namespace tidemark::core {

// Everything the analysis pass derives from a finished recording; the store keeps it in result
// tables so that queries do not replay millions of events.
struct Analysis {
  std::vector<BlockCategory> categories;  // one per block of the recording, same order
  CategorizeStats stats;
  Timeline timeline;
  std::vector<PeakReport> peaks;  // the whole recording first, then each step
  // Steps found from the recording's periodicity when it has no step marks (else empty).
  std::vector<StepInterval> inferredSteps;
};

// Expects recording.sortBySeq().
Analysis analyze(const Recording& recording);

}  // namespace tidemark::core
