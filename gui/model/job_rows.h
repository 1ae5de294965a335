#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "gui/model/stacked_timeline.h"

namespace tidemark::gui {

// A rank's total memory over time on the job's common axis: each session's own clock put on the
// realtime clock by its start (ranks on several hosts have no common monotonic clock).
struct RankCurve {
  uint64_t session = 0;
  std::vector<std::pair<int64_t, int64_t>> points;  // (realtime ns, total bytes)
  int64_t peak() const;
};

// The buckets' highest totals, each at its bucket's middle, on the realtime clock.
RankCurve rankCurve(uint64_t session, int64_t startNs, int64_t startWallNs,
                    const std::vector<TimelineBucket>& buckets);

// What every rank's row shares: the time span of all curves and the highest total (so that the
// ranks' heights compare).
struct JobAxis {
  int64_t fromWallNs = 0, toWallNs = 0;
  int64_t maxBytes = 0;
};
JobAxis jobAxis(const std::vector<RankCurve>& curves);

}  // namespace tidemark::gui
