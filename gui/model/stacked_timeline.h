#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "gui/model/category_colors.h"

namespace tidemark::gui {

// One bucket of the server's timeline: the range and, per series (0 the total, then each
// category), the highest bytes reached and the bytes at its end.
struct TimelineBucket {
  int64_t startNs = 0;
  int64_t endNs = 0;
  std::array<int64_t, kCategories + 1> maxBytes{};
  std::array<int64_t, kCategories + 1> lastBytes{};
};

// What the timeline draws: per bucket, the categories stacked (their bytes at the bucket's end,
// cumulative, WEIGHT at the bottom) and the total's highest value (an envelope, so that a peak
// inside a bucket is not lost between two ends).
struct StackedTimeline {
  std::vector<int64_t> startNs, endNs;
  std::vector<std::array<int64_t, kCategories + 1>> stack;  // stack[i][c]: below category c
  std::vector<int64_t> envelope;
  int64_t yMax = 0;

  static StackedTimeline build(const std::vector<TimelineBucket>& buckets);
  // The bucket whose range holds ns, or -1.
  int bucketAt(int64_t ns) const;
};

}  // namespace tidemark::gui
