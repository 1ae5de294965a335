#include "src/core/timeline.h"

#include <algorithm>
#include <cstdint>

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

TimelineBuilder::TimelineBuilder(size_t samplesPerChunk, ChunkFn onChunk)
    : m_perChunk(samplesPerChunk), m_onChunk(std::move(onChunk)) {}

bool TimelineBuilder::add(const MemoryState& s) {
  if (!m_ok) return false;
  const SeriesValues v = seriesOf(s);
  if (m_inSample > 0 && s.tsNs - m_current.lastTsNs > Timeline::kIdleNs) {
    m_inSample = 0;
    if (!emit(0, m_current)) return false;
  }
  if (m_inSample == 0) {
    m_current = TimelineSample{};
    m_current.firstTsNs = s.tsNs;
    m_current.firstSeq = s.seq;
    m_current.min = v;
    m_current.max = v;
  } else {
    for (int i = 0; i < kSeriesCount; ++i) {
      m_current.min[i] = std::min(m_current.min[i], v[i]);
      m_current.max[i] = std::max(m_current.max[i], v[i]);
    }
  }
  m_current.lastTsNs = s.tsNs;
  m_current.lastSeq = s.seq;
  m_current.last = v;
  if (++m_inSample == Timeline::kFinestEvents) {
    m_inSample = 0;
    return emit(0, m_current);
  }
  return true;
}

bool TimelineBuilder::emit(size_t level, const TimelineSample& sample) {
  while (m_levels.size() < level + 2) m_levels.emplace_back();
  m_levels[level].buffer.push_back(sample);
  ++m_levels[level].emitted;
  if (m_levels[level].buffer.size() == m_perChunk && !flush(level)) return false;
  Level& up = m_levels[level + 1];
  if (up.pendingCount == 0)
    up.pending = sample;
  else
    up.pending.absorb(sample);
  if (++up.pendingCount < Timeline::kLevelFactor) return true;
  up.pendingCount = 0;
  const TimelineSample merged = up.pending;  // emit may move the levels
  return emit(level + 1, merged);
}

bool TimelineBuilder::flush(size_t level) {
  Level& l = m_levels[level];
  if (l.buffer.empty()) return true;
  m_ok = m_onChunk(static_cast<int>(level), l.chunk, l.buffer);
  ++l.chunk;
  l.buffer.clear();
  return m_ok;
}

std::vector<TimelineSample> TimelineBuilder::unemitted(int level) const {
  std::vector<TimelineSample> out;
  for (size_t l = static_cast<size_t>(std::max(level, 0)); l >= 1; --l) {
    if (l < m_levels.size() && m_levels[l].pendingCount > 0) out.push_back(m_levels[l].pending);
  }
  if (m_inSample > 0) out.push_back(m_current);
  return out;
}

bool TimelineBuilder::finish() {
  if (!m_ok) return false;
  if (m_inSample > 0 && !emit(0, m_current)) return false;
  m_inSample = 0;
  if (m_levels.empty()) m_levels.emplace_back();
  // Each level is whole once the one below is: its last sample merges what the one below left.
  for (size_t level = 0; level < m_levels.size(); ++level) {
    Level& l = m_levels[level];
    if (level > 0 && l.pendingCount > 0) {
      l.pendingCount = 0;
      if (!emit(level, TimelineSample(l.pending))) return false;
    }
    if (!flush(level)) return false;
    if (m_levels[level].emitted <= 1) {  // the top: one sample (or none)
      m_levelCount = static_cast<int>(level) + 1;
      break;
    }
  }
  m_levels.clear();
  return true;
}

Timeline buildTimeline(const LivenessReplay& replay) {
  Timeline t;
  TimelineBuilder builder(SIZE_MAX, [&t](int level, int64_t, const std::vector<TimelineSample>& s) {
    while (t.levels.size() <= static_cast<size_t>(level)) {
      TimelineLevel l;
      l.eventsPerSample = Timeline::kFinestEvents;
      for (size_t i = 0; i < t.levels.size(); ++i) l.eventsPerSample *= Timeline::kLevelFactor;
      t.levels.push_back(std::move(l));
    }
    auto& samples = t.levels[static_cast<size_t>(level)].samples;
    samples.insert(samples.end(), s.begin(), s.end());
    return true;
  });
  replay.forEachState([&](const MemoryState& s) { builder.add(s); });
  builder.finish();
  if (t.levels.empty()) t.levels.push_back({Timeline::kFinestEvents, {}});
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

std::vector<TimelineSample> samplesWithin(const std::vector<TimelineSample>& level,
                                          const TimelineSample& coarser) {
  auto begin =
      std::lower_bound(level.begin(), level.end(), coarser.firstSeq,
                       [](const TimelineSample& s, uint64_t seq) { return s.firstSeq < seq; });
  auto end =
      std::upper_bound(begin, level.end(), coarser.lastSeq,
                       [](uint64_t seq, const TimelineSample& s) { return seq < s.firstSeq; });
  return {begin, end};
}

FinerSamples finerSamplesOf(const Timeline& timeline) {
  return [&timeline](int level, const TimelineSample& coarser) {
    if (level < 0 || level >= static_cast<int>(timeline.levels.size()))
      return std::vector<TimelineSample>{};
    return samplesWithin(timeline.levels[static_cast<size_t>(level)].samples, coarser);
  };
}

std::vector<TimelineBucket> foldTimeline(const std::vector<TimelineSample>& samples, int64_t fromTs,
                                         int64_t toTs, int buckets, int level,
                                         const FinerSamples& finer) {
  std::vector<TimelineBucket> out(static_cast<size_t>(std::max(buckets, 1)));
  const double width = static_cast<double>(toTs - fromTs + 1) / static_cast<double>(out.size());
  for (size_t b = 0; b < out.size(); ++b) {
    out[b].startTsNs = fromTs + static_cast<int64_t>(width * static_cast<double>(b));
    out[b].endTsNs = fromTs + static_cast<int64_t>(width * static_cast<double>(b + 1)) - 1;
  }
  out.back().endTsNs = toTs;
  auto bucketOf = [&](int64_t ts) {
    const int64_t at = std::clamp(ts, fromTs, toTs);
    return std::min(static_cast<size_t>(static_cast<double>(at - fromTs) / width), out.size() - 1);
  };
  std::function<void(const TimelineSample&, int)> place = [&](const TimelineSample& s, int l) {
    if (l > 0 && finer && bucketOf(s.lastTsNs) >= bucketOf(s.firstTsNs) + 2) {
      std::vector<TimelineSample> parts = finer(l - 1, s);
      if (!parts.empty()) {
        for (const TimelineSample& p : parts)
          if (p.lastTsNs >= fromTs && p.firstTsNs <= toTs) place(p, l - 1);
        return;
      }
    }
    TimelineBucket& bucket = out[bucketOf(s.firstTsNs)];
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
  };
  for (const TimelineSample& s : samples) place(s, level);
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
