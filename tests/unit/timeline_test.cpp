#include "src/core/timeline.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "src/core/timeline_codec.h"
#include "tests/unit/analysis_expectations.h"

namespace tidemark::core {
namespace {

// A recording of n blocks: block i is allocated at seq 2i+1 (ts 10*seq) with size i+1 and freed
// at seq 2i+2, except every fifth, which stays live.
Recording sawtooth(int n) {
  Recording rec;
  uint64_t seq = 1;
  for (int i = 0; i < n; ++i) {
    Block b;
    b.address = 0x1000 + static_cast<uint64_t>(i) * 64;
    b.sizeBytes = static_cast<uint64_t>(i) + 1;
    b.allocSeq = seq++;
    b.allocTsNs = static_cast<int64_t>(b.allocSeq) * 10;
    if (i % 5 != 0) {
      b.freeSeq = seq++;
      b.freeTsNs = static_cast<int64_t>(b.freeSeq) * 10;
    }
    rec.blocks.push_back(b);
  }
  rec.sortBySeq();
  return rec;
}

TEST(TimelineTest, SamplesHoldTheExtremesOfTheirEvents) {
  Recording rec = sawtooth(1000);
  auto cats = categorize(rec);
  LivenessReplay replay(rec, cats);
  Timeline t = buildTimeline(replay);
  ASSERT_FALSE(t.levels.empty());
  // Every level covers every event: its samples' extremes match a direct replay.
  int64_t trueMax = 0;
  int64_t trueMin = INT64_MAX;
  int64_t lastValue = 0;
  size_t events = 0;
  replay.forEachState([&](const MemoryState& s) {
    trueMax = std::max(trueMax, s.trackedBytes);
    trueMin = std::min(trueMin, s.trackedBytes);
    lastValue = s.trackedBytes;
    ++events;
  });
  for (const TimelineLevel& level : t.levels) {
    int64_t mx = 0;
    int64_t mn = INT64_MAX;
    for (const TimelineSample& s : level.samples) {
      mx = std::max(mx, s.max[0]);
      mn = std::min(mn, s.min[0]);
      EXPECT_EQ(s.max[0], s.max[1 + categoryIndex(Category::kUnknown)]);  // all UNKNOWN
    }
    EXPECT_EQ(mx, trueMax);
    EXPECT_EQ(mn, trueMin);
    EXPECT_EQ(level.samples.back().last[0], lastValue);
  }
  EXPECT_EQ(t.levels[0].samples.size(), (events + 63) / 64);
  EXPECT_EQ(t.levels.back().samples.size(), 1u);
}

TEST(TimelineTest, FoldKeepsMinMaxAndCarriesEmptyBuckets) {
  std::vector<TimelineSample> samples(2);
  samples[0].firstTsNs = 0;
  samples[0].lastTsNs = 9;
  samples[0].min[0] = 5;
  samples[0].max[0] = 50;
  samples[0].last[0] = 20;
  samples[1].firstTsNs = 90;
  samples[1].lastTsNs = 99;
  samples[1].min[0] = 1;
  samples[1].max[0] = 30;
  samples[1].last[0] = 2;
  auto buckets = foldTimeline(samples, 0, 99, 10);
  ASSERT_EQ(buckets.size(), 10u);
  EXPECT_FALSE(buckets[0].empty);
  EXPECT_EQ(buckets[0].max[0], 50);
  EXPECT_TRUE(buckets[5].empty);
  EXPECT_EQ(buckets[5].min[0], 20);  // the value carried from the last sample before
  EXPECT_EQ(buckets[5].max[0], 20);
  EXPECT_EQ(buckets[9].min[0], 1);
  EXPECT_EQ(buckets[9].last[0], 2);
  EXPECT_EQ(buckets[0].startTsNs, 0);
  EXPECT_EQ(buckets[9].endTsNs, 99);
}

TEST(TimelineTest, AFinestSampleEndsWhereMemoryStaysPut) {
  // 10 events a microsecond apart at 1 KiB, then, a second later, 10 more at 2 KiB: two finest
  // samples (not one of 20), so no sample holds values from both sides of the idle second.
  std::vector<std::vector<TimelineSample>> levels;
  TimelineBuilder builder(SIZE_MAX, [&](int level, int64_t, const std::vector<TimelineSample>& s) {
    if (levels.size() <= static_cast<size_t>(level)) levels.resize(static_cast<size_t>(level) + 1);
    levels[static_cast<size_t>(level)].insert(levels[static_cast<size_t>(level)].end(), s.begin(),
                                              s.end());
    return true;
  });
  for (int i = 0; i < 20; ++i) {
    MemoryState s;
    s.seq = static_cast<uint64_t>(i + 1);
    s.tsNs = (i < 10 ? 0 : 1'000'000'000) + i * 1000;
    s.trackedBytes = i < 10 ? 1024 : 2048;
    ASSERT_TRUE(builder.add(s));
  }
  ASSERT_TRUE(builder.finish());
  ASSERT_FALSE(levels.empty());
  ASSERT_EQ(levels[0].size(), 2u);
  EXPECT_EQ(levels[0][0].lastSeq, 10u);
  EXPECT_EQ(levels[0][0].max[0], 1024);
  EXPECT_EQ(levels[0][1].firstSeq, 11u);
  EXPECT_EQ(levels[0][1].min[0], 2048);
}

TEST(TimelineTest, ACoarseSampleAcrossAnIdleStretchIsReadFromTheLevelBelow) {
  // Level 0: 10 B early (t 0-9), then nothing until 100 B late (t 90-99). Level 1: one sample of
  // both, its first event early: folded as it is, its high and last values would stand at t 0
  // and over the idle stretch.
  Timeline t;
  t.levels.resize(2);
  TimelineSample early, late;
  early.firstTsNs = 0;
  early.lastTsNs = 9;
  early.firstSeq = 1;
  early.lastSeq = 64;
  early.min[0] = early.max[0] = early.last[0] = 10;
  late = early;
  late.firstTsNs = 90;
  late.lastTsNs = 99;
  late.firstSeq = 65;
  late.lastSeq = 128;
  late.min[0] = late.max[0] = late.last[0] = 100;
  t.levels[0].samples = {early, late};
  TimelineSample both = early;
  both.absorb(late);
  t.levels[1].samples = {both};
  const auto coarse = foldTimeline(t.levels[1].samples, 0, 99, 10);
  EXPECT_EQ(coarse[0].max[0], 100);  // what the plain fold says
  EXPECT_EQ(coarse[5].last[0], 100);
  const auto read = foldTimeline(t.levels[1].samples, 0, 99, 10, 1, finerSamplesOf(t));
  EXPECT_EQ(read[0].max[0], 10);
  EXPECT_EQ(read[5].min[0], 10);  // idle: the early value carried
  EXPECT_EQ(read[5].max[0], 10);
  EXPECT_EQ(read[9].max[0], 100);
  EXPECT_EQ(read[9].last[0], 100);
}

TEST(TimelineTest, ChooseLevelPicksTheCoarsestWithEnoughSamples) {
  Recording rec = sawtooth(20000);
  auto cats = categorize(rec);
  Timeline t = buildTimeline(LivenessReplay(rec, cats));
  const int64_t from = t.levels[0].samples.front().firstTsNs;
  const int64_t to = t.levels[0].samples.back().lastTsNs;
  const int level = chooseLevel(t, from, to, 100);
  EXPECT_GE(samplesInRange(t.levels[level], from, to).size(), 100u);
  if (level + 1 < static_cast<int>(t.levels.size())) {
    EXPECT_LT(samplesInRange(t.levels[level + 1], from, to).size(), 100u);
  }
  EXPECT_EQ(chooseLevel(t, from, to, 1000000), 0);  // none has enough: the finest
}

TEST(TimelineTest, CodecRoundTrip) {
  std::mt19937_64 rng(7);
  std::vector<TimelineSample> in(37);
  for (TimelineSample& s : in) {
    s.firstTsNs = static_cast<int64_t>(rng());
    s.lastSeq = rng();
    for (int i = 0; i < kSeriesCount; ++i) {
      s.min[i] = static_cast<int64_t>(rng());
      s.max[i] = -static_cast<int64_t>(rng() >> 1);
      s.last[i] = static_cast<int64_t>(i);
    }
  }
  const std::string bytes = encodeSamples(in.data(), in.size());
  EXPECT_EQ(bytes.size(), in.size() * kEncodedSampleBytes);
  std::vector<TimelineSample> out;
  ASSERT_TRUE(decodeSamples(bytes, &out));
  testing::expectSameSamples(out, in);
  EXPECT_FALSE(decodeSamples(bytes.substr(1), &out));
}

TEST(PeaksTest, OnePassEqualsOneScanPerRange) {
  std::mt19937_64 rng(11);
  Recording rec;
  std::vector<std::pair<uint64_t, uint64_t>> live;  // address, allocSeq
  uint64_t seq = 1;
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && rng() % 2 == 0) {
      const size_t k = rng() % live.size();
      for (Block& b : rec.blocks) {
        if (b.address == live[k].first && b.live()) b.freeSeq = seq;
      }
      live.erase(live.begin() + static_cast<long>(k));
    } else {
      Block b;
      b.address = 0x1000 + static_cast<uint64_t>(i) * 64;
      b.sizeBytes = 1 + rng() % 1000;
      b.allocSeq = seq;
      rec.blocks.push_back(b);
      live.emplace_back(b.address, seq);
    }
    ++seq;
  }
  rec.sortBySeq();
  auto cats = categorize(rec);
  LivenessReplay replay(rec, cats);
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {1, 100}, {100, 101}, {250, 900}, {1200, 4000}, {4500, seq + 10}};
  auto peaks = replay.peaks(ranges);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const MemoryState one = replay.peak(ranges[i].first, ranges[i].second);
    EXPECT_EQ(peaks[i].trackedBytes, one.trackedBytes) << i;
    EXPECT_EQ(peaks[i].seq, one.seq) << i;
  }
}

}  // namespace
}  // namespace tidemark::core

#include "src/core/ops.h"

namespace tidemark::core {
namespace {

ScopeInterval scope(const char* name, uint32_t thread, uint64_t b, uint64_t e) {
  ScopeInterval s;
  s.name = name;
  s.threadId = thread;
  s.beginSeq = b;
  s.endSeq = e;
  s.beginTsNs = static_cast<int64_t>(b) * 10;
  s.endTsNs = static_cast<int64_t>(e) * 10;
  return s;
}

TEST(OpsTest, SelfTimeIsTotalMinusDirectChildren) {
  Recording rec;
  rec.scopes = {scope("model", 1, 1, 100),      scope("model.a", 1, 10, 40),
                scope("model.a.x", 1, 20, 30),  scope("model.b", 1, 50, 90),
                scope("model.a", 1, 200, 210),     // a second call, outside "model"
                scope("model", 2, 5, 15),          // another thread: not a parent of anything
                scope("open", 1, 300, kOpenSeq)};  // still open: left out
  rec.sortBySeq();
  std::vector<OpStat> ops = moduleTimes(rec);
  std::map<std::string, OpStat> by;
  for (const OpStat& o : ops) by[o.name] = o;
  EXPECT_EQ(by.count("open"), 0u);
  EXPECT_EQ(by["model"].calls, 2);
  EXPECT_EQ(by["model"].totalNs, 990 + 100);
  EXPECT_EQ(by["model"].selfNs, (990 - 300 - 400) + 100);
  EXPECT_EQ(by["model.a"].calls, 2);
  EXPECT_EQ(by["model.a"].totalNs, 300 + 100);
  EXPECT_EQ(by["model.a"].selfNs, 300 - 100 + 100);
  EXPECT_EQ(by["model.a.x"].selfNs, 100);
  EXPECT_EQ(ops.front().name, "model");  // largest total first
}

}  // namespace
}  // namespace tidemark::core

#include "src/core/step_inference.h"

namespace tidemark::core {
namespace {

// A recording written event by event, one event per 10 ns, each block at an address of its own.
struct RecordingWriter {
  Recording rec;
  uint64_t seq = 1;
  uint64_t addr = 0x100000;
  size_t alloc(uint64_t size) {
    Block b;
    b.address = addr;
    addr += 0x1000;
    b.sizeBytes = size;
    b.allocSeq = seq;
    b.allocTsNs = static_cast<int64_t>(seq) * 10;
    ++seq;
    rec.blocks.push_back(b);
    return rec.blocks.size() - 1;
  }
  void release(size_t i) {
    rec.blocks[i].freeSeq = seq;
    rec.blocks[i].freeTsNs = static_cast<int64_t>(seq) * 10;
    ++seq;
  }
};

// `steps` training-like steps: a persistent block, then per step 20 activations allocated and
// freed in reverse, then a temporary, all at one event per 10 ns.
Recording periodic(int steps) {
  RecordingWriter w;
  auto alloc = [&](uint64_t size) { return w.alloc(size); };
  auto release = [&](size_t i) { w.release(i); };
  Recording& rec = w.rec;
  alloc(1000);
  for (int s = 0; s < steps; ++s) {
    std::vector<size_t> acts;
    for (int i = 0; i < 20; ++i) acts.push_back(alloc(100 + static_cast<uint64_t>(i)));
    for (int i = 19; i >= 0; --i) release(acts[static_cast<size_t>(i)]);
    release(alloc(50));
  }
  rec.sortBySeq();
  return rec;
}

TEST(StepInferenceTest, FindsTheStepsOfAPeriodicRecording) {
  Recording rec = periodic(12);
  auto cats = categorize(rec);
  LivenessReplay replay(rec, cats);
  std::vector<StepInterval> steps = inferSteps(replay);
  // Boundaries fall where memory is back at its floor: 12 steps have 11 or 12 whole ones between.
  ASSERT_GE(steps.size(), 11u);
  ASSERT_LE(steps.size(), 12u);
  const uint64_t period = 20 * 2 + 2;
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].beginSeq, steps[i - 1].endSeq);
    EXPECT_EQ(steps[i].endSeq - steps[i].beginSeq, period) << i;
  }
  // Each whole step peaks at the persistent block plus its 20 activations.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const StepInterval& s : steps) ranges.emplace_back(s.beginSeq, s.endSeq);
  for (const MemoryState& p : replay.peaks(ranges)) EXPECT_EQ(p.trackedBytes, 1000 + 2190);
}

TEST(StepInferenceTest, StepsAreFoundUnderTheirLayersUpsAndDowns) {
  // As torch 2 records a small model: a start-up, then steps whose 12 layers each add an
  // activation and wiggle with temporaries: a smooth swell per step, which at short lags
  // correlates with itself better than a step with the next (63 "steps" of 5 were found so).
  RecordingWriter w;
  auto alloc = [&](uint64_t size) { return w.alloc(size); };
  auto release = [&](size_t i) { w.release(i); };
  Recording& rec = w.rec;
  for (int i = 0; i < 120; ++i) alloc(40 + static_cast<uint64_t>(i % 7) * 3);  // start-up
  constexpr int kSteps = 6;
  constexpr int kLayers = 12;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<size_t> acts;
    for (int l = 0; l < kLayers; ++l) {
      acts.push_back(alloc(400));
      std::vector<size_t> temps;
      for (int t = 0; t < 6; ++t) temps.push_back(alloc(60));
      for (size_t t : temps) release(t);
    }
    for (int l = kLayers - 1; l >= 0; --l) {
      std::vector<size_t> temps;
      for (int t = 0; t < 6; ++t) temps.push_back(alloc(60));
      for (size_t t : temps) release(t);
      release(acts[static_cast<size_t>(l)]);
    }
  }
  rec.sortBySeq();
  auto cats = categorize(rec);
  LivenessReplay replay(rec, cats);
  const std::vector<StepInterval> steps = inferSteps(replay);
  ASSERT_GE(steps.size(), static_cast<size_t>(kSteps - 2));
  ASSERT_LE(steps.size(), static_cast<size_t>(kSteps));
  // Whole steps after the first (which may take in the end of the start-up): a step's events.
  const uint64_t period = kLayers * (2 + 2 * 12);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].endSeq - steps[i].beginSeq, period) << i;
  }
  // Each peaks at the start-up's blocks, all 12 activations and one layer's temporaries.
  uint64_t startup = 0;
  for (int i = 0; i < 120; ++i) startup += 40 + static_cast<uint64_t>(i % 7) * 3;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const StepInterval& st : steps) ranges.emplace_back(st.beginSeq, st.endSeq);
  for (const MemoryState& p : replay.peaks(ranges)) {
    EXPECT_EQ(p.trackedBytes, startup + kLayers * 400 + 6 * 60);
  }
}

TEST(StepInferenceTest, StepsAreFoundAfterAStartUpLongerThanThem) {
  // Imports, model building and data loading can make most of a short job's events: here some
  // 4,000 events of irregular start-up churn, then 8 steps of 110 events (a fifth of them).
  RecordingWriter w;
  Recording& rec = w.rec;
  uint32_t lcg = 12345;
  auto next = [&]() { return lcg = lcg * 1103515245u + 12345u; };
  std::vector<size_t> live;
  for (int i = 0; i < 3000; ++i) {
    live.push_back(w.alloc(16 + (next() >> 16) % 4096));
    if (live.size() > 3 && (next() >> 20) % 3 == 0) {
      const size_t at = (next() >> 8) % live.size();
      w.release(live[at]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  constexpr int kSteps = 8;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<size_t> acts;
    for (int i = 0; i < 50; ++i) acts.push_back(w.alloc(1000 + static_cast<uint64_t>(i) * 10));
    for (int i = 49; i >= 0; --i) w.release(acts[static_cast<size_t>(i)]);
    for (int t = 0; t < 5; ++t) w.release(w.alloc(300));
  }
  rec.sortBySeq();
  ASSERT_GT(w.seq - 1, 4 * static_cast<uint64_t>(kSteps) * 110);
  auto cats = categorize(rec);
  LivenessReplay replay(rec, cats);
  const std::vector<StepInterval> steps = inferSteps(replay);
  ASSERT_GE(steps.size(), static_cast<size_t>(kSteps - 2));
  ASSERT_LE(steps.size(), static_cast<size_t>(kSteps));
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].endSeq - steps[i].beginSeq, 110u) << i;
  }
}

TEST(StepInferenceTest, NothingRepeatsNoSteps) {
  Recording rec;
  for (uint64_t i = 0; i < 500; ++i) {  // memory only grows
    Block b;
    b.address = 0x1000 + i * 64;
    b.sizeBytes = 64;
    b.allocSeq = i + 1;
    rec.blocks.push_back(b);
  }
  rec.sortBySeq();
  auto cats = categorize(rec);
  EXPECT_TRUE(inferSteps(LivenessReplay(rec, cats)).empty());
}

}  // namespace
}  // namespace tidemark::core
