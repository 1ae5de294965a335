#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/core/recording.h"

namespace tidemark::core {

// A module's times over every steady step of a recording (each complete step but the first,
// which creates the optimizer state; the only step when there is one): the mean of its runs,
// stalls beyond 4x the median left out. One step's times move by tens of percent on a busy
// machine, and a plan's cost is paid every step.
struct ModuleTimes {
  int64_t forwardNs = -1;  // its forward (first call of the step), in steps that did not re-run it
  int64_t rerunNs = -1;    // each run of its forward inside a recompute phase (a plan's re-run)
  int forwards = 0;        // how many runs each figure is of (0: none, the figure is -1)
  int reruns = 0;
  // Its re-runs under an op-level option (torch's selective checkpointing re-running the ops
  // the policy does not keep), by policy: not re-runs of the whole module, timed apart.
  std::map<std::string, int64_t> policyRerunNs;
};

// The op-level policies a recording's steps ran modules under (selective segments with a policy
// of the plans the job applied): from each entry's step on, until the next entry's, the
// policy of each module named. Empty: every re-run was of a whole module.
struct PlannedPolicies {
  std::vector<std::pair<int64_t, std::map<std::string, std::string>>> fromStep;  // by step
  // The policy module `name` (or the module it is in) ran under in step `step`; "" for none.
  std::string at(int64_t step, const std::string& name) const;
};

// Every module's recorded re-runs (its scopes inside recompute phases of the steady steps), by
// name and the op-level policy it ran under ("": the whole module re-run), in nanoseconds:
// gathered from other recordings of the job (trainings under a plan) one at a time, so that only
// these are held — at most kMaxRerunSamples per module and policy (the first).
using RerunKey = std::pair<std::string, std::string>;  // module, policy
using RerunSamples = std::map<RerunKey, std::vector<int64_t>>;
inline constexpr size_t kMaxRerunSamples = 4096;
void addRecordedReruns(const Recording& rec, const PlannedPolicies& policies, RerunSamples* into);

// The times of the modules named (scopes of that name; a name not in the recording has none).
// A forward in a step that re-ran the module is no sample: a plan's checkpoint wraps a segment
// of several blocks in the scope of its first, and the others' own forward scopes are empty.
// rerunsFrom: re-runs recorded elsewhere, which replace the recording's own for the modules (and
// policies) that have some there. policies: those the recording's own steps ran under.
std::map<std::string, ModuleTimes> moduleTimesOverSteps(const Recording& rec,
                                                        const std::vector<std::string>& names,
                                                        const RerunSamples* rerunsFrom = nullptr,
                                                        const PlannedPolicies* policies = nullptr);

// A recording's re-runs beside its forwards: the summed re-run times over the summed forward
// times of the modules that have both (a job planned in mid-run: forwards before the plan,
// re-runs after; or re-runs from another recording). 0 when no module has both.
double rerunOverForward(const std::map<std::string, ModuleTimes>& times);

}  // namespace tidemark::core
