#include "src/core/analysis.h"

namespace tidemark::core {

Analysis analyze(const Recording& recording) {
  Analysis a;
  a.categories = categorize(recording, &a.stats);
  const LivenessReplay replay(recording, a.categories);
  a.timeline = buildTimeline(replay);
  a.peaks = computePeaks(recording, a.categories, replay);
  return a;
}

}  // namespace tidemark::core
