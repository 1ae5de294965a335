#include "gui/model/step_compare.h"

#include <algorithm>

namespace tidemark::gui {

int64_t StepCurve::peak() const {
  return bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
}

StepCurve stepCurve(int64_t step, int64_t stepBeginNs, const std::vector<TimelineBucket>& buckets) {
  StepCurve c;
  c.step = step;
  for (const TimelineBucket& b : buckets) {
    if (b.endNs <= stepBeginNs) continue;
    c.fromNs.push_back(std::max<int64_t>(0, b.startNs - stepBeginNs));
    c.toNs.push_back(b.endNs - stepBeginNs);
    c.bytes.push_back(b.maxBytes[0]);
  }
  return c;
}

StepComparison compareSteps(StepCurve a, const std::array<int64_t, kCategories>& peakA, StepCurve b,
                            const std::array<int64_t, kCategories>& peakB) {
  StepComparison s;
  s.spanNs = std::max(a.spanNs(), b.spanNs());
  s.yMax = std::max(a.peak(), b.peak());
  s.a = std::move(a);
  s.b = std::move(b);
  s.peakA = peakA;
  s.peakB = peakB;
  return s;
}

std::optional<std::pair<size_t, size_t>> defaultComparison(const std::vector<StepSpan>& steps) {
  std::optional<size_t> first, last;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].endNs <= steps[i].beginNs) continue;
    if (!first) first = i;
    last = i;
  }
  if (!first || *first == *last) return std::nullopt;
  return std::make_pair(*first, *last);
}

int64_t StepComparison::total(const std::array<int64_t, kCategories>& byCategory) {
  int64_t t = 0;
  for (int64_t b : byCategory) t += b;
  return t;
}

}  // namespace tidemark::gui
