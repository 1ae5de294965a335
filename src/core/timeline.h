#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "src/core/breakdown.h"

namespace tidemark::core {

// Series of a timeline: index 0 is the tracked total, 1 + categoryIndex(c) each category.
inline constexpr int kSeriesCount = kCategoryCount + 1;
using SeriesValues = std::array<int64_t, kSeriesCount>;

// What a stretch of consecutive events did to memory: per series, the lowest and highest value
// after any of its events, and the value after its last event.
struct TimelineSample {
  int64_t firstTsNs = 0;
  int64_t lastTsNs = 0;
  uint64_t firstSeq = 0;
  uint64_t lastSeq = 0;
  SeriesValues min{};
  SeriesValues max{};
  SeriesValues last{};
  void absorb(const TimelineSample& s);  // extends this sample by a later one
};

// One level of detail: samples of `eventsPerSample` consecutive events (fewer where an idle
// stretch of Timeline::kIdleNs ends a finest sample early, and in the last).
struct TimelineLevel {
  int eventsPerSample = 0;
  std::vector<TimelineSample> samples;  // in time order
};

// The pyramid: level 0 is the finest; each next level merges kLevelFactor samples of the one below.
struct Timeline {
  static constexpr int kFinestEvents = 64;
  // A finest sample ends early where memory stays put this long (an idle stretch: loading, a
  // pause), so that no sample holds values from both sides of it.
  static constexpr int64_t kIdleNs = 10'000'000;
  // 2: the level a query reads holds 1 to 2 times the samples it asks for, whatever the
  // session's length (4 apart it held 1 to 4 times: 1.9 times as many samples at 300M events as
  // at 10M), for about a tenth more store.
  static constexpr int kLevelFactor = 2;
  std::vector<TimelineLevel> levels;
};

Timeline buildTimeline(const LivenessReplay& replay);

// Builds the pyramid one memory state at a time, handing each level's samples on in chunks of
// `samplesPerChunk` as they complete: memory stays at a chunk per level whatever the number of
// states. The levels handed on are exactly buildTimeline's (a level above one that holds a single
// sample is never handed on).
class TimelineBuilder {
 public:
  // level, the chunk's index in that level (samplesPerChunk samples a chunk, the last may hold
  // fewer), its samples. Returning false stops the builder (add and finish return false).
  using ChunkFn =
      std::function<bool(int level, int64_t chunk, const std::vector<TimelineSample>& samples)>;
  TimelineBuilder(size_t samplesPerChunk, ChunkFn onChunk);
  bool add(const MemoryState& state);
  bool finish();
  int levelCount() const { return m_levelCount; }
  // The newest events, that no sample of `level` covers yet (the builder still merges them), as
  // samples in time order: the partial sample of each level from `level` down, then the finest.
  std::vector<TimelineSample> unemitted(int level) const;

 private:
  struct Level {
    int64_t emitted = 0;
    int64_t chunk = 0;
    std::vector<TimelineSample> buffer;  // samples of the chunk being filled
    TimelineSample pending;              // merging the level below's samples into one
    int pendingCount = 0;
  };
  bool emit(size_t level, const TimelineSample& sample);
  bool flush(size_t level);
  size_t m_perChunk;
  ChunkFn m_onChunk;
  std::vector<Level> m_levels;
  TimelineSample m_current;  // the finest sample being filled
  int m_inSample = 0;
  int m_levelCount = 0;
  bool m_ok = true;
};

// A level's samples as the store keeps them: a chunk of consecutive samples, by index.
struct TimelineChunk {
  int level = 0;
  int64_t index = 0;
  std::vector<TimelineSample> samples;
};

// A bucket of a timeline query. `empty` when no sample fell in it (values then carry over).
struct TimelineBucket {
  int64_t startTsNs = 0;
  int64_t endTsNs = 0;
  bool empty = true;
  SeriesValues min{};
  SeriesValues max{};
  SeriesValues last{};
};

// The samples of level `level` that make up `coarser` (a sample of level + 1), in order, or none
// when that level is not at hand.
using FinerSamples =
    std::function<std::vector<TimelineSample>(int level, const TimelineSample& coarser)>;

// Folds the samples of one level (`level`) in [fromTs, toTs] into `buckets` equal-width buckets
// (a sample goes to the bucket of its first event). A sample that spans more than two buckets (a
// coarse sample across an idle stretch: its events are few, its time long) would put a value
// where it never was; it is replaced by the finer samples it is made of (`finer`), down to the
// finest level. The store's and the in-memory timelines share this fold.
std::vector<TimelineBucket> foldTimeline(const std::vector<TimelineSample>& samples, int64_t fromTs,
                                         int64_t toTs, int buckets, int level = 0,
                                         const FinerSamples& finer = nullptr);
// The samples of a level (in seq order) whose events are those of `coarser` (seq within it).
std::vector<TimelineSample> samplesWithin(const std::vector<TimelineSample>& level,
                                          const TimelineSample& coarser);
// The finer samples of a level of `timeline` (held whole).
FinerSamples finerSamplesOf(const Timeline& timeline);
// Which level to read for a query: the coarsest with at least `buckets` samples in range.
int chooseLevel(const Timeline& timeline, int64_t fromTs, int64_t toTs, int buckets);
// The samples of one level whose events overlap [fromTs, toTs].
std::vector<TimelineSample> samplesInRange(const TimelineLevel& level, int64_t fromTs,
                                           int64_t toTs);

}  // namespace tidemark::core
