#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "gui/model/stacked_timeline.h"

namespace tidemark::gui {

// One step's memory on a time axis that starts at the step's beginning: per bucket, the offsets
// of its start and end from the step's start and the total's highest value in it.
struct StepCurve {
  int64_t step = 0;
  std::vector<int64_t> fromNs, toNs, bytes;
  int64_t spanNs() const { return toNs.empty() ? 0 : toNs.back(); }
  int64_t peak() const;
};

StepCurve stepCurve(int64_t step, int64_t stepBeginNs, const std::vector<TimelineBucket>& buckets);

// Two steps overlaid: both curves, the longer span, the higher peak, and by category the bytes
// at each step's peak and the change from A to B.
struct StepComparison {
  StepCurve a, b;
  int64_t spanNs = 0, yMax = 0;
  std::array<int64_t, kCategories> peakA{}, peakB{};
  int64_t change(int category) const {
    return peakB[static_cast<size_t>(category)] - peakA[static_cast<size_t>(category)];
  }
  // Each step's peak: the sum of its categories there (what the steps' table shows).
  int64_t totalA() const { return total(peakA); }
  int64_t totalB() const { return total(peakB); }
  static int64_t total(const std::array<int64_t, kCategories>& byCategory);
};

StepComparison compareSteps(StepCurve a, const std::array<int64_t, kCategories>& peakA, StepCurve b,
                            const std::array<int64_t, kCategories>& peakB);

// The pair shown before the user picks one (indices into the steps, in order): the first and the
// last finished step, which shows what the warm-up changed; none with fewer than two finished.
struct StepSpan {
  int64_t beginNs = 0, endNs = 0;  // endNs 0 while the step runs
};
std::optional<std::pair<size_t, size_t>> defaultComparison(const std::vector<StepSpan>& steps);

}  // namespace tidemark::gui
