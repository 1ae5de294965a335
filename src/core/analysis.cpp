#include "src/core/analysis.h"

#include "src/core/step_inference.h"

namespace tidemark::core {

Analysis analyze(const Recording& recording) {
  Analysis a;
  a.categories = categorize(recording, &a.stats);
  const LivenessReplay replay(recording, a.categories);
  a.timeline = buildTimeline(replay);
  if (stepsToInfer(recording)) {
    a.inferredSteps = inferSteps(replay);
    Recording withSteps = recording;  // the peaks per step need the steps in the recording
    withSteps.steps = a.inferredSteps;
    a.peaks = computePeaks(withSteps, a.categories, replay);
  } else {
    a.peaks = computePeaks(recording, a.categories, replay);
  }
  return a;
}

}  // namespace tidemark::core
