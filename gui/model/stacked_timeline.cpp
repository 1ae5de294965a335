#include "gui/model/stacked_timeline.h"

#include <algorithm>

namespace tidemark::gui {

StackedTimeline StackedTimeline::build(const std::vector<TimelineBucket>& buckets) {
  StackedTimeline t;
  for (const TimelineBucket& b : buckets) {
    t.startNs.push_back(b.startNs);
    t.endNs.push_back(b.endNs);
    std::array<int64_t, kCategories + 1> s{};
    for (int c = 0; c < kCategories; ++c)
      s[c + 1] = s[c] + std::max<int64_t>(0, b.lastBytes[c + 1]);
    t.stack.push_back(s);
    const int64_t env = std::max(b.maxBytes[0], s[kCategories]);
    t.envelope.push_back(env);
    t.yMax = std::max(t.yMax, env);
  }
  return t;
}

int StackedTimeline::bucketAt(int64_t ns) const {
  auto it = std::upper_bound(startNs.begin(), startNs.end(), ns);
  if (it == startNs.begin()) return -1;
  const int i = static_cast<int>(it - startNs.begin()) - 1;
  return ns <= endNs[static_cast<size_t>(i)] ? i : -1;
}

}  // namespace tidemark::gui
