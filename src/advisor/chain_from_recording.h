#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/advisor/chain.h"
#include "src/advisor/stage_times.h"
#include "src/core/categorize.h"
#include "src/core/recording.h"

namespace tidemark::core {

// A chain profile measured on one recorded step, with what ran when it was recorded.
struct RecordedChain {
  ChainProfile profile;
  int64_t step = 0;
  // The blocks are <prefix>.0, <prefix>.1, ... of these prefixes (comma-separated).
  std::string blocksPrefix;
  ChainPlan recordedPlan;         // blocks the recording ran under checkpoint are recomputed
  int64_t measuredPeakBytes = 0;  // the step's peak, as recorded
  // A step that made what the later steps hold from their start (the first step's optimizer
  // state): its peak with that held from its start, as the model is calibrated; else 0.
  int64_t carriedPeakBytes = 0;
  int64_t measuredStepNs = 0;
  // When the recorded step ran each moment of the chain's schedule (for drawing a plan's
  // predicted memory over the recorded timeline): after stage i's forward, at the end of the
  // forward, at the start and in the middle of stage i's backward.
  std::vector<int64_t> forwardEndNs, backwardBeginNs, backwardMidNs;
  int64_t endOfForwardNs = 0;
  // What the chain model does not capture in this recording (blocks called more than once in
  // one forward: siamese or shared blocks), for the plans made from it to say.
  std::vector<std::string> warnings;
  // The blocks' activations are device memory (a GPU job): offloading them to the host means
  // something. A CPU job's are host memory already.
  bool onDevice = false;
};

// Builds the chain model of a recorded step (docs/plan-format.md, "Profiles from a recording"):
// the blocks are the module scopes named <prefix>.<n> in the step's forward: of the families at
// one depth called in turn with nothing between them but their containers' entries (a ResNet's
// layer1.0 ... layer4.1), the run whose blocks take the most forward time, unless blocksPrefix
// names the prefixes (one, a comma-separated list, or glob patterns); their times come from their
// forward and "[backward]" scopes, their saved bytes from the tensors the adapter tagged as saved
// by them, their output and working sets from the blocks born inside them. Everything the chain
// does not explain at each moment becomes the static and outside terms, so that the model
// reproduces the recorded step. step 0 takes the last complete step (the last without
// recomputation, when some ran without); firstPlannedStep > 0: among the steps before it only (a
// job that ran a recompute plan from that step on: the steps under the plan recompute what the
// plan chose, and a model that checkpoints by itself recomputes in every step, so recomputation
// alone does not tell them apart).
// Times are typical runs over the steady steps (means, stalls left out); what a re-run costs comes
// from the recording's own re-runs, or rerunTimesFrom's when given (other recordings of the job,
// under a plan), and for a block never re-run from its forward times their re-run/forward ratio
// (docs/plan-format.md). plannedPolicies: the op-level policies the recording's own steps ran
// blocks under (its applied plans), whose re-runs time those options, not the whole block's.
// Expects recording.sortBySeq() and categories = categorize(recording).
absl::StatusOr<RecordedChain> chainFromRecording(const Recording& recording,
                                                 const std::vector<BlockCategory>& categories,
                                                 int64_t step, std::string_view blocksPrefix,
                                                 int64_t firstPlannedStep = 0,
                                                 const RerunSamples* rerunTimesFrom = nullptr,
                                                 const PlannedPolicies* plannedPolicies = nullptr);

}  // namespace tidemark::core
