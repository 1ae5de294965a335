#include "gui/model/job_rows.h"

#include <algorithm>

namespace tidemark::gui {

int64_t RankCurve::peak() const {
  int64_t best = 0;
  for (const auto& [ts, bytes] : points) best = std::max(best, bytes);
  return best;
}

RankCurve rankCurve(uint64_t session, int64_t startNs, int64_t startWallNs,
                    const std::vector<TimelineBucket>& buckets) {
  RankCurve c;
  c.session = session;
  for (const TimelineBucket& b : buckets) {
    const int64_t middle = b.startNs + (b.endNs - b.startNs) / 2;
    c.points.emplace_back(startWallNs + (middle - startNs), b.maxBytes[0]);
  }
  return c;
}

JobAxis jobAxis(const std::vector<RankCurve>& curves) {
  JobAxis a;
  bool any = false;
  for (const RankCurve& c : curves) {
    for (const auto& [ts, bytes] : c.points) {
      a.fromWallNs = any ? std::min(a.fromWallNs, ts) : ts;
      a.toWallNs = any ? std::max(a.toWallNs, ts) : ts;
      a.maxBytes = std::max(a.maxBytes, bytes);
      any = true;
    }
  }
  if (a.toWallNs <= a.fromWallNs) a.toWallNs = a.fromWallNs + 1;
  return a;
}

}  // namespace tidemark::gui
