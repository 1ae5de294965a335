#include "src/advisor/stage_choices.h"

#include <algorithm>

namespace tidemark::core {

void storedChoices(const ChainProfile& p, int i, std::vector<StageChoice>* out) {
  out->clear();
  const Stage& s = p.stages[i];
  const int64_t in = p.inBytes(i);
  const int64_t forwardLocal = in + s.forwardWorkingBytes + s.outputBytes + s.forwardOutsideBytes;
  const int64_t backwardLocal =
      in + s.savedBytes + s.outputBytes + s.backwardWorkingBytes + in + s.backwardOutsideBytes;
  out->push_back({std::max(forwardLocal, backwardLocal), in + s.savedBytes, 0, -1});
  for (int o = 0; o < static_cast<int>(s.options.size()); ++o) {
    const StageOption& opt = s.options[o];
    const int64_t optionBackwardLocal = in + opt.savedBytes + s.outputBytes +
                                        optionBackwardWorkingBytes(s, opt) + in +
                                        s.backwardOutsideBytes;
    const int64_t optionForwardLocal =
        in + optionForwardWorkingBytes(s, opt) + s.outputBytes + s.forwardOutsideBytes;
    out->push_back({std::max(optionForwardLocal, optionBackwardLocal), in + opt.savedBytes,
                    opt.recomputeNs, o});
  }
  if (p.offloadBytesPerSecond > 0)
    out->push_back(
        {std::max(forwardLocal, backwardLocal), 0, p.offloadNs(in + s.savedBytes), -1, true});
}

std::vector<int64_t> leastOutputAhead(const ChainProfile& p) {
  const int n = p.size();
  std::vector<int64_t> out(n);
  for (int k = n - 1; k >= 0; --k) {
    out[k] = p.stages[k].outputBytes;
    if (k + 1 < n && extends(p, k, k + 1)) out[k] = std::min(out[k], out[k + 1]);
  }
  return out;
}

RecomputedSegment::RecomputedSegment(const ChainProfile& p, int first)
    : m_profile(p), m_first(first), m_next(first), m_in(p.inBytes(first)) {}

StageChoice RecomputedSegment::grow() {
  const int k = m_next++;
  const Stage& t = m_profile.stages[k];
  const int64_t tin = m_profile.inBytes(k);
  // Forward: only the segment's input stays (from the second stage on).
  m_forwardMax =
      std::max(m_forwardMax, (k == m_first ? 0 : m_in) + tin + t.checkpointedForwardWorking() +
                                 t.outputBytes + t.forwardOutsideBytes);
  // Recompute: the stages re-run in store mode; the incoming gradient is added below.
  m_recomputeMax = std::max(
      m_recomputeMax, m_held + tin + t.forwardWorkingBytes + t.outputBytes + t.recomputeOutside());
  m_held += tin + t.savedBytes;
  // Backward of stage k: everything held up to k, its gradients and working set.
  m_backwardMax = std::max(m_backwardMax, m_held + t.outputBytes + t.backwardWorkingBytes + tin +
                                              t.backwardOutsideBytes);
  m_extra += t.rerunCostNs();
  return {std::max({m_forwardMax, m_recomputeMax + t.outputBytes, m_backwardMax}), m_in, m_extra,
          -1};
}

}  // namespace tidemark::core
