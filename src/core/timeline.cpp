#include "src/core/timeline.h"

#include <algorithm>

namespace tidemark::core {

void TimelineSample::absorb(const TimelineSample& s) {
  lastTsNs = s.lastTsNs;
  lastSeq = s.lastSeq;
  for (int i = 0; i < kSeriesCount; ++i) {
    min[i] = std::min(min[i], s.min[i]);
    max[i] = std::max(max[i], s.max[i]);
  }
  last = s.last;
}

namespace {
SeriesValues seriesOf(const MemoryState& s) {
  SeriesValues v{};
  v[0] = s.trackedBytes;
  for (int c = 0; c < kCategoryCount; ++c) v[c + 1] = s.bytes[c];
  return v;
}
}  // namespace

Timeline buildTimeline(const LivenessReplay& replay) {
  Timeline t;
  TimelineLevel finest;
  finest.eventsPerSample = Timeline::kFinestEvents;
  TimelineSample current;
  int inSample = 0;
  replay.forEachState([&](const MemoryState& s) {
    const SeriesValues v = seriesOf(s);
    if (inSample == 0) {
      current = TimelineSample{};
      current.firstTsNs = s.tsNs;
      current.firstSeq = s.seq;
      current.min = v;
      current.max = v;
    } else {
      for (int i = 0; i < kSeriesCount; ++i) {
        current.min[i] = std::min(current.min[i], v[i]);
        current.max[i] = std::max(current.max[i], v[i]);
      }
    }
    current.lastTsNs = s.tsNs;
    current.lastSeq = s.seq;
    current.last = v;
    if (++inSample == Timeline::kFinestEvents) {
      finest.samples.push_back(current);
      inSample = 0;
    }
  });
  if (inSample > 0) finest.samples.push_back(current);
  t.levels.push_back(std::move(finest));
  // Coarser levels until one has a single sample.
  while (t.levels.back().samples.size() > 1) {
    const TimelineLevel& below = t.levels.back();
    TimelineLevel up;
    up.eventsPerSample = below.eventsPerSample * Timeline::kLevelFactor;
    for (size_t i = 0; i < below.samples.size(); i += Timeline::kLevelFactor) {
      TimelineSample merged = below.samples[i];
      const size_t end = std::min(below.samples.size(), i + Timeline::kLevelFactor);
      for (size_t j = i + 1; j < end; ++j) merged.absorb(below.samples[j]);
      up.samples.push_back(merged);
    }
    t.levels.push_back(std::move(up));
  }
  return t;
}

std::vector<TimelineSample> samplesInRange(const TimelineLevel& level, int64_t fromTs,
                                           int64_t toTs) {
  auto begin =
      std::lower_bound(level.samples.begin(), level.samples.end(), fromTs,
                       [](const TimelineSample& s, int64_t ts) { return s.lastTsNs < ts; });
  auto end = std::upper_bound(begin, level.samples.end(), toTs,
                              [](int64_t ts, const TimelineSample& s) { return ts < s.firstTsNs; });
  return {begin, end};
}

int chooseLevel(const Timeline& timeline, int64_t fromTs, int64_t toTs, int buckets) {
  int chosen = 0;
  for (int l = 0; l < static_cast<int>(timeline.levels.size()); ++l) {
    if (samplesInRange(timeline.levels[l], fromTs, toTs).size() >= static_cast<size_t>(buckets)) {
      chosen = l;
    }
  }
  return chosen;
}

std::vector<TimelineBucket> foldTimeline(const std::vector<TimelineSample>& samples, int64_t fromTs,
                                         int64_t toTs, int buckets) {
  std::vector<TimelineBucket> out(static_cast<size_t>(std::max(buckets, 1)));
  const double width = static_cast<double>(toTs - fromTs + 1) / static_cast<double>(out.size());
  for (size_t b = 0; b < out.size(); ++b) {
    out[b].startTsNs = fromTs + static_cast<int64_t>(width * static_cast<double>(b));
    out[b].endTsNs = fromTs + static_cast<int64_t>(width * static_cast<double>(b + 1)) - 1;
  }
  out.back().endTsNs = toTs;
  for (const TimelineSample& s : samples) {
    const int64_t at = std::clamp(s.firstTsNs, fromTs, toTs);
    auto b = static_cast<size_t>(static_cast<double>(at - fromTs) / width);
    b = std::min(b, out.size() - 1);
    TimelineBucket& bucket = out[b];
    if (bucket.empty) {
      bucket.empty = false;
      bucket.min = s.min;
      bucket.max = s.max;
    } else {
      for (int i = 0; i < kSeriesCount; ++i) {
        bucket.min[i] = std::min(bucket.min[i], s.min[i]);
        bucket.max[i] = std::max(bucket.max[i], s.max[i]);
      }
    }
    bucket.last = s.last;
  }
  // An empty bucket holds the value the memory had all along: the last one before it.
  SeriesValues carry{};
  bool haveCarry = false;
  for (TimelineBucket& bucket : out) {
    if (!bucket.empty) {
      carry = bucket.last;
      haveCarry = true;
    } else if (haveCarry) {
      bucket.min = carry;
      bucket.max = carry;
      bucket.last = carry;
    }
  }
  return out;
}

}  // namespace tidemark::core
