#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tidemark::core {

// The chain model of docs/chain-model.md: a training step as a sequence of stages (blocks that
// checkpointing can wrap), each with its measured times and sizes, plus the static memory that is
// live throughout (weights, gradients, optimizer state, allocator slack, everything outside the
// chain). Sizes are bytes, times nanoseconds.

// A selective way to store a stage: keep only savedBytes of its activations and regenerate the
// rest during its backward for recomputeNs (e.g. checkpoint the MLP inside a block).
struct StageOption {
  std::string name;
  int64_t savedBytes = 0;
  int64_t recomputeNs = 0;
  std::vector<std::string> recompute;  // the child modules whose forward is re-run
  // The stage's forward transient with this option (the child frees what it does not keep as
  // soon as it ends). -1: not known, the stage's own.
  int64_t forwardWorkingBytes = -1;
  // The stage's backward transient with this option, on top of what the option keeps (as the
  // stage's backwardWorkingBytes is on top of all it keeps): the regenerated activations come
  // back when the child's backward begins, after what ran before it has freed its own. -1: not
  // known, all of them regenerated at the start of the stage's backward.
  int64_t backwardWorkingBytes = -1;
  // An op-level option (torch 2's selective activation checkpointing) instead of a child module:
  // the block runs under a checkpoint that keeps the outputs of the ops this policy names and
  // re-runs the rest at its backward. kSavePolicyMatmul: matrix products, convolutions and
  // attention kernels (the compute-heavy ops). Empty: a child-module option.
  std::string policy = {};
};

inline constexpr const char* kSavePolicyMatmul = "matmul";
// A policy an option may have: kSavePolicyMatmul (every such call's outputs kept), or
// "matmul:OP#N,..." (the outputs of those calls only: the N-th call, from 0, of aten::OP in the
// block's forward; e.g. "matmul:addmm#0,bmm#1").
bool isSavePolicy(std::string_view policy);

struct Stage;
// The option's transients: forward (forwardWorkingBytes, or when not known the stage's own) and
// backward (backwardWorkingBytes, or when not known the stage's own plus everything the option
// drops).
int64_t optionForwardWorkingBytes(const Stage& s, const StageOption& o);
int64_t optionBackwardWorkingBytes(const Stage& s, const StageOption& o);

struct Stage {
  std::string name;
  int64_t forwardNs = 0;
  int64_t backwardNs = 0;
  // What a re-run of the stage's forward takes when a plan recomputes it (0: its forward time).
  // From a recording: the stage's recorded re-runs when there are some (a re-run is not the
  // forward: a recorded forward also holds the recording's work on the tensors it saves, and on
  // a CPU a re-run may run in fresh pages).
  int64_t rerunNs = 0;
  int64_t savedBytes = 0;           // kept for backward when stored, not counting the stage's input
  int64_t outputBytes = 0;          // the boundary tensor handed to the next stage
  int64_t forwardWorkingBytes = 0;  // transient on top of input and output during forward
  // The same when the stage runs inside a recomputed segment (under a checkpoint, keeping nothing
  // for its backward; -1: as forwardWorkingBytes). From a recording, a stage the recorded step
  // ran under a checkpoint has its own, measured from that forward.
  int64_t checkpointedForwardWorkingBytes = -1;
  int64_t backwardWorkingBytes = 0;  // transient on top of the gradients during backward
  bool checkpointable = true;
  // Whether the stage's input is the previous stage's output. False where something between them
  // made its input (a pooling between a U-Net's blocks, a residual added outside the blocks,
  // another stack's embedding): a recomputed segment may start at the stage, but none runs from
  // the previous stage into it (it would re-run the stages as a chain they are not). The first
  // stage's is not read.
  bool linked = true;
  std::vector<StageOption> options;
  // Memory outside the chain, on top of the static bytes, live while this stage runs forward,
  // backward, or again for its backward (a recomputation; -1: as its backward): the loss's
  // tensors, parameter gradients as they appear. From a recording, it is what the chain's terms do
  // not explain at that moment.
  int64_t forwardOutsideBytes = 0;
  int64_t backwardOutsideBytes = 0;
  int64_t recomputeOutsideBytes = -1;

  int64_t checkpointedForwardWorking() const {
    return checkpointedForwardWorkingBytes >= 0 ? checkpointedForwardWorkingBytes
                                                : forwardWorkingBytes;
  }
  int64_t recomputeOutside() const {
    return recomputeOutsideBytes >= 0 ? recomputeOutsideBytes : backwardOutsideBytes;
  }

  // The time a plan adds each time it re-runs the stage's forward.
  int64_t rerunCostNs() const { return rerunNs > 0 ? rerunNs : forwardNs; }
};

struct ChainProfile;
// Whether a recomputed segment that runs from stage first through stage k - 1 may go on to stage
// k: the loop condition of the solvers that grow a segment one stage at a time.
bool extends(const ChainProfile& p, int first, int k);

struct ChainProfile {
  std::string name;
  int64_t staticBytes = 0;
  int64_t inputBytes = 0;       // the chain's input (the first stage's input)
  int64_t endOutsideBytes = 0;  // outside the chain at the end of the forward, on top of static
  // The step's peak away from the forward and backward (the optimizer step, say): no plan's peak
  // is below it.
  int64_t floorBytes = 0;
  // The host link's speed for offloaded stages, bytes per second (0: offloading not offered).
  int64_t offloadBytesPerSecond = 0;
  std::vector<Stage> stages;

  int size() const { return static_cast<int>(stages.size()); }
  // The input of stage i: the chain input for i == 0, the previous stage's output otherwise.
  int64_t inBytes(int i) const { return i == 0 ? inputBytes : stages[i - 1].outputBytes; }
  int64_t outBytes(int i) const { return stages[i].outputBytes; }
  // The step time without recomputation: every forward and backward once.
  int64_t baseStepNs() const;
  // What offloading `bytes` costs a step: to the host after the forward and back for the
  // backward, neither overlapped with compute (rounded up).
  int64_t offloadNs(int64_t bytes) const;
};

// The most a profile's sizes may add up to (64 PiB), and its times (2^56 ns, 2.3 years): every
// live total, extra time and bound the model forms is a few such sums (a nested plan re-runs a
// stage at most once per level, 64 levels), so they all stay far inside 64-bit integers.
inline constexpr int64_t kMaxProfileTotal = int64_t{1} << 56;

// Rejects what the model cannot mean: no stages, negative sizes or times, an option that keeps
// more than the stage saves, unnamed or duplicate stages, sizes or times adding up past
// kMaxProfileTotal.
absl::Status validateProfile(const ChainProfile& profile);

// kOffload: the stage's input and activations go to host memory after its forward and come back
// for its backward (the profile's offloadBytesPerSecond).
enum class SegmentMode { kStore, kRecompute, kOffload };

// A run of consecutive stages [first, last] with one mode. A stored segment of one stage may use
// one of the stage's selective options (option >= 0); a recomputed segment keeps only its input
// and re-runs its whole forward at the start of its backward.
//
// Nested checkpointing: a recomputed segment's re-run may itself follow a plan, `inner` (empty:
// every stage of the segment stored, the one-level plan). Its segments cover [first, last] in
// order, stored ones without options, recomputed ones with their own `inner`, to any depth; the
// segment itself is not one of them (a region re-running itself whole gains nothing).
struct Segment {
  Segment() = default;
  Segment(int first_, int last_, SegmentMode mode_ = SegmentMode::kStore, int option_ = -1)
      : first(first_), last(last_), mode(mode_), option(option_) {}

  int first = 0;
  int last = 0;
  SegmentMode mode = SegmentMode::kStore;
  int option = -1;
  std::vector<Segment> inner;
};

// Segments in order, covering every stage exactly once.
struct ChainPlan {
  std::vector<Segment> segments;
};

// Checks that a plan covers the chain in order, recomputes only checkpointable stages and uses
// options that exist; a recomputed segment's inner plan the same way within the segment.
absl::Status validatePlan(const ChainProfile& profile, const ChainPlan& plan);

// The stage-by-stage description used in plan documents and tests: "S" stored, "R" recomputed,
// "|" between segments, "s<k>" stored with option k, "O" offloaded; a recomputed segment with an
// inner plan is "R[<inner plan>]". Examples: "S|RR|RRR|S", "R[S|RR|S]|S".
std::string planSignature(const ChainPlan& plan);
// How deeply the plan nests recomputed segments: 0 with none, 1 with one-level ones.
int planDepth(const ChainPlan& plan);

}  // namespace tidemark::core
