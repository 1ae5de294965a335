#include "src/advisor/simulator.h"

#include <vector>

namespace tidemark::core {

const char* simPhaseName(SimPhase p) {
  switch (p) {
    case SimPhase::kForward:
      return "forward";
    case SimPhase::kEndOfForward:
      return "end of forward";
    case SimPhase::kRecompute:
      return "recompute";
    case SimPhase::kBackward:
      return "backward";
    case SimPhase::kOutside:
      return "outside forward and backward";
  }
  return "?";
}

namespace {

class Replay {
 public:
  Replay(const ChainProfile& profile, bool keepPoints)
      : m_profile(profile), m_keepPoints(keepPoints) {}

  void at(SimPhase phase, int stage, int64_t live) {
    const SimPoint p{phase, stage, m_profile.staticBytes + live};
    if (p.liveBytes > m_result.peakBytes || m_first) {
      m_result.peakBytes = p.liveBytes;
      m_result.peakAt = p;
      m_first = false;
    }
    if (m_keepPoints) m_result.points.push_back(p);
  }
  SimResult& result() { return m_result; }

 private:
  const ChainProfile& m_profile;
  bool m_keepPoints;
  bool m_first = true;
  SimResult m_result;
};

// What a stored stage keeps through the forward: its input and its saved activations (fewer
// with a selective option).
int64_t storedBytes(const ChainProfile& p, int i, int option) {
  const Stage& s = p.stages[i];
  return p.inBytes(i) + (option >= 0 ? s.options[option].savedBytes : s.savedBytes);
}

// The backward of a recomputed segment: its forward run again (following its inner plan: stored
// stages keep everything, inner recomputed segments only their input), then the backward of its
// parts in reverse, an inner recomputed segment's the same way, one level deeper. `base`: what
// earlier stages keep, not counting the segment's input (its first stage's input is counted
// with that stage).
void recomputedBackward(const ChainProfile& p, const Segment& seg, int64_t base, Replay& replay) {
  const int64_t incomingGrad = p.outBytes(seg.last);
  std::vector<Segment> stored;
  const std::vector<Segment>* parts = &seg.inner;
  if (seg.inner.empty()) {
    for (int i = seg.first; i <= seg.last; ++i) stored.push_back({i, i, SegmentMode::kStore});
    parts = &stored;
  }
  // held: what the segment's parts run again hold for their backward.
  int64_t held = 0;
  std::vector<int64_t> heldBefore(parts->size());
  for (size_t g = 0; g < parts->size(); ++g) {
    const Segment& part = (*parts)[g];
    heldBefore[g] = held;
    const int64_t partIn = p.inBytes(part.first);
    for (int i = part.first; i <= part.last; ++i) {
      const Stage& s = p.stages[i];
      // An inner recomputed segment runs without keeping anything but its input (under its own
      // checkpoint).
      const bool checkpointed = part.mode == SegmentMode::kRecompute;
      const int64_t checkpoint = checkpointed && i > part.first ? partIn : 0;
      replay.at(SimPhase::kRecompute, i,
                base + held + checkpoint + p.inBytes(i) +
                    (checkpointed ? s.checkpointedForwardWorking() : s.forwardWorkingBytes) +
                    s.outputBytes + incomingGrad + s.recomputeOutside());
      replay.result().extraNs += s.rerunCostNs();
      if (part.mode == SegmentMode::kStore) held += storedBytes(p, i, -1);
    }
    if (part.mode == SegmentMode::kRecompute) held += partIn;
  }
  for (size_t g = parts->size(); g-- > 0;) {
    const Segment& part = (*parts)[g];
    if (part.mode == SegmentMode::kRecompute) {
      recomputedBackward(p, part, base + heldBefore[g], replay);
      held -= p.inBytes(part.first);
      continue;
    }
    for (int i = part.last; i >= part.first; --i) {
      const Stage& s = p.stages[i];
      replay.at(SimPhase::kBackward, i,
                base + held + s.outputBytes + s.backwardWorkingBytes + p.inBytes(i) +
                    s.backwardOutsideBytes);
      held -= storedBytes(p, i, -1);
    }
  }
}

}  // namespace

SimResult simulate(const ChainProfile& p, const ChainPlan& plan, bool keepPoints) {
  Replay replay(p, keepPoints);
  const int n = p.size();
  // kept: bytes held for backward by the stages already run (not counting the current input).
  int64_t kept = 0;
  std::vector<int64_t> keptBefore(plan.segments.size());
  for (size_t g = 0; g < plan.segments.size(); ++g) {
    const Segment& seg = plan.segments[g];
    keptBefore[g] = kept;
    for (int i = seg.first; i <= seg.last; ++i) {
      const Stage& s = p.stages[i];
      const int64_t working = seg.option >= 0 ? optionForwardWorkingBytes(s, s.options[seg.option])
                              : seg.mode == SegmentMode::kRecompute ? s.checkpointedForwardWorking()
                                                                    : s.forwardWorkingBytes;
      replay.at(SimPhase::kForward, i,
                kept + p.inBytes(i) + working + s.outputBytes + s.forwardOutsideBytes);
      if (seg.mode == SegmentMode::kStore)
        kept += storedBytes(p, i, seg.option);
      else if (seg.mode == SegmentMode::kRecompute && i == seg.first)
        kept += p.inBytes(i);  // the checkpoint: the segment's input only
      // Offloaded: what it keeps goes to the host as it is saved; the device keeps nothing.
    }
  }
  // The chain's output and the gradient that starts the backward.
  replay.at(SimPhase::kEndOfForward, -1, kept + 2 * p.outBytes(n - 1) + p.endOutsideBytes);

  for (size_t g = plan.segments.size(); g-- > 0;) {
    const Segment& seg = plan.segments[g];
    const int64_t base = keptBefore[g];
    if (seg.mode == SegmentMode::kRecompute) {
      recomputedBackward(p, seg, base, replay);
      continue;
    }
    // held: what the segment holds for its backward, stage by stage (an offloaded stage's back
    // from the host, at the latest as its backward runs).
    int64_t held = 0;
    for (int i = seg.first; i <= seg.last; ++i) {
      held += storedBytes(p, i, seg.option);
      if (seg.mode == SegmentMode::kOffload)
        replay.result().extraNs += p.offloadNs(storedBytes(p, i, -1));
    }
    for (int i = seg.last; i >= seg.first; --i) {
      const Stage& s = p.stages[i];
      int64_t working = s.backwardWorkingBytes;
      if (seg.option >= 0) {
        // A selective option regenerates the dropped activations during the stage's backward:
        // its working set counts them.
        working = optionBackwardWorkingBytes(s, s.options[seg.option]);
        replay.result().extraNs += s.options[seg.option].recomputeNs;
      }
      // The stage's incoming gradient (its output's size), its working set, and the gradient it
      // produces for its input.
      replay.at(SimPhase::kBackward, i,
                base + held + s.outputBytes + working + p.inBytes(i) + s.backwardOutsideBytes);
      held -= storedBytes(p, i, seg.option);
    }
  }
  if (p.floorBytes > replay.result().peakBytes) {
    replay.result().peakBytes = p.floorBytes;
    replay.result().peakAt = SimPoint{SimPhase::kOutside, -1, p.floorBytes};
  }
  replay.result().stepNs = p.baseStepNs() + replay.result().extraNs;
  return std::move(replay.result());
}

}  // namespace tidemark::core
