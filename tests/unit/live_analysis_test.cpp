// The live analysis (answers while events arrive, at a bounded cost) against the analysis of the
// whole recording: equal wherever a block's category is known within the step it was born in,
// bounded in what it holds whatever the length, and current when a fact comes late.
#include "src/core/live_analysis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "src/core/analysis.h"
#include "src/core/streaming_analysis.h"
#include "tests/unit/analysis_expectations.h"

namespace tidemark::core {
namespace {

using testing::expectSameItems;
using testing::expectSameSamples;
using testing::expectSameState;

// Feeds a recording to a live analysis as the ingest would: every event in sequence order, with
// the innermost module and op scope of the allocating thread at each allocation.
// after: called after each event (the ingest's rhythm of taking rows, in a test).
void feed(const Recording& rec, LiveAnalysis& live, uint64_t untilSeq = kOpenSeq,
          const std::function<void()>& after = nullptr) {
  std::map<std::string, uint32_t> iids;
  auto iid = [&](const std::string& s) -> uint32_t {
    if (s.empty()) return 0;
    auto [it, added] = iids.emplace(s, static_cast<uint32_t>(iids.size() + 1));
    if (added) live.name(it->second, s);
    return it->second;
  };
  std::multimap<uint64_t, std::function<void()>> events;
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint32_t>>> modules, ops;  // thread: open
  auto innermost = [](auto& stacks, uint32_t thread) {
    auto it = stacks.find(thread);
    return it == stacks.end() || it->second.empty() ? 0u : it->second.back().second;
  };
  for (const Block& b : rec.blocks) {
    events.emplace(b.allocSeq, [&, b] {
      live.alloc(b, innermost(modules, b.threadId), innermost(ops, b.threadId));
    });
    if (!b.live())
      events.emplace(b.freeSeq,
                     [&, b] { live.free(b.kind, b.device, b.address, b.freeSeq, b.freeTsNs); });
  }
  for (const Tag& t : rec.tags)
    events.emplace(t.seq, [&, t] { live.tag(t.seq, t.address, t.category, iid(t.name)); });
  for (const PhaseInterval& p : rec.phases) {
    events.emplace(p.beginSeq, [&, p] { live.phaseBegin(p.beginSeq, p.phase); });
    if (p.endSeq != kOpenSeq)
      events.emplace(p.endSeq, [&, p] { live.phaseEnd(p.beginSeq, p.endSeq); });
  }
  for (const auto* list : {&rec.scopes, &rec.ops}) {
    const bool isOp = list == &rec.ops;
    if (isOp && !list->empty()) live.opScopeSeen();
    for (const ScopeInterval& s : *list) {
      auto& stacks = isOp ? ops : modules;
      events.emplace(s.beginSeq, [&, s, isOp] {
        stacks[s.threadId].emplace_back(s.beginSeq, iid(s.name));
        if (!isOp) live.moduleBegin(s.beginSeq, iid(s.name));
      });
      if (s.endSeq != kOpenSeq) {
        events.emplace(s.endSeq, [&, s, isOp] {
          auto& st = stacks[s.threadId];
          std::erase_if(st, [&](const auto& e) { return e.first == s.beginSeq; });
          if (!isOp) live.moduleEnd(s.beginSeq);
        });
      }
    }
  }
  for (const StepInterval& s : rec.steps) {
    events.emplace(s.beginSeq, [&, s] { live.stepBegin(s.step, s.beginSeq, s.beginTsNs); });
    events.emplace(s.endSeq, [&, s] { live.stepEnd(s.step, s.endSeq, s.endTsNs); });
  }
  for (auto& [seq, fn] : events) {
    if (seq > untilSeq) break;
    fn();
    if (after) after();
  }
}

// A training loop whose facts all come within the step a block is born in: weights and
// optimizer state tagged at their allocation, activations tagged at theirs and freed in the
// backward, temporaries freed within their phase, tensors in device segments, module and op
// scopes on the main thread, a recompute phase inside the backward.
class Training {
 public:
  explicit Training(uint64_t seed) : m_rng(seed) {}

  Recording make(int steps, int layers) {
    const int32_t dev = 0;
    const uint64_t segment = 0x7000000000;
    alloc(MemoryKind::kDevice, dev, segment, 64u << 20);  // the caching allocator's segment
    for (int l = 0; l < layers; ++l)
      tagged(segment + slot(), 4096 + pick(8) * 512, Category::kWeight,
             "layer" + std::to_string(l));
    for (int s = 0; s < steps; ++s) {
      StepInterval step;
      step.step = s;
      step.beginSeq = ++m_seq;
      step.beginTsNs = ts(step.beginSeq);
      std::vector<size_t> acts;
      const size_t fwd = phaseBegin(Phase::kForward);
      for (int l = 0; l < layers; ++l) {
        const size_t module = scopeBegin("model.layer" + std::to_string(l), false);
        const size_t op = scopeBegin("aten::linear", true);
        const size_t tmp = alloc(MemoryKind::kTensor, dev, segment + slot(), 1024 + pick(4) * 256);
        acts.push_back(tagged(segment + slot(), 2048 + pick(16) * 256, Category::kActivation, ""));
        free(tmp);
        scopeEnd(op);
        scopeEnd(module);
        const size_t host = alloc(MemoryKind::kHost, -1, 0x5000 + pick(64) * 64, 64);
        free(host);
      }
      phaseEnd(fwd);
      const size_t bwd = phaseBegin(Phase::kBackward);
      const size_t rec = phaseBegin(Phase::kRecompute);
      const size_t again = alloc(MemoryKind::kTensor, dev, segment + slot(), 3072);
      phaseEnd(rec);
      std::vector<size_t> grads;
      for (int l = layers - 1; l >= 0; --l) {
        free(acts[static_cast<size_t>(l)]);
        if (s == 0)
          m_grads.push_back(tagged(segment + slot(), 4096, Category::kGradient, "layer.grad"));
      }
      free(again);
      phaseEnd(bwd);
      const size_t opt = phaseBegin(Phase::kOptimizer);
      if (s == 0) {
        for (int l = 0; l < layers; ++l)
          tagged(segment + slot(), 8192, Category::kOptimizerState, "exp_avg");
      }
      const size_t tmp = alloc(MemoryKind::kTensor, dev, segment + slot(), 512);
      free(tmp);
      phaseEnd(opt);
      step.endSeq = ++m_seq;
      step.endTsNs = ts(step.endSeq);
      m_rec.steps.push_back(step);
    }
    for (size_t i = 0; i < m_rec.blocks.size(); ++i)
      m_rec.blocks[i].id = static_cast<int64_t>(i) + 1;
    return m_rec;
  }

 private:
  static int64_t ts(uint64_t seq) { return static_cast<int64_t>(seq) * 11 + 500; }
  uint64_t pick(uint64_t n) { return m_rng() % n; }
  // Slots below 3000 go first (step 0's, with every block that lives for good); then the others
  // over and over.
  uint64_t slot() {
    if (m_nextSlot == 8000) m_nextSlot = 3000;
    return m_nextSlot++ * 8192;
  }

  size_t alloc(MemoryKind kind, int32_t device, uint64_t address, uint64_t size) {
    Block b;
    b.kind = kind;
    b.device = device;
    b.address = address;
    b.sizeBytes = size;
    b.threadId = 1;
    b.allocSeq = ++m_seq;
    b.allocTsNs = ts(b.allocSeq);
    m_rec.blocks.push_back(b);
    return m_rec.blocks.size() - 1;
  }
  size_t tagged(uint64_t address, uint64_t size, Category c, const std::string& name) {
    const size_t i = alloc(MemoryKind::kTensor, 0, address, size);
    Tag t;
    t.seq = ++m_seq;
    t.tsNs = ts(t.seq);
    t.address = address;
    t.sizeBytes = size;
    t.category = c;
    t.name = name;
    m_rec.tags.push_back(t);
    return i;
  }
  void free(size_t i) {
    m_rec.blocks[i].freeSeq = ++m_seq;
    m_rec.blocks[i].freeTsNs = ts(m_seq);
  }
  size_t phaseBegin(Phase p) {
    PhaseInterval i;
    i.phase = p;
    i.threadId = 1;
    i.beginSeq = ++m_seq;
    i.beginTsNs = ts(i.beginSeq);
    m_rec.phases.push_back(i);
    return m_rec.phases.size() - 1;
  }
  void phaseEnd(size_t i) {
    m_rec.phases[i].endSeq = ++m_seq;
    m_rec.phases[i].endTsNs = ts(m_seq);
  }
  size_t scopeBegin(const std::string& name, bool isOp) {
    ScopeInterval s;
    s.name = name;
    s.threadId = 1;
    s.isOp = isOp;
    s.beginSeq = ++m_seq;
    s.beginTsNs = ts(s.beginSeq);
    auto& list = isOp ? m_rec.ops : m_rec.scopes;
    list.push_back(s);
    return (list.size() - 1) | (isOp ? size_t{1} << 40 : 0);
  }
  void scopeEnd(size_t handle) {
    auto& list = (handle >> 40) ? m_rec.ops : m_rec.scopes;
    ScopeInterval& s = list[handle & ((size_t{1} << 40) - 1)];
    s.endSeq = ++m_seq;
    s.endTsNs = ts(m_seq);
  }

  std::mt19937_64 m_rng;
  uint64_t m_seq = 0;
  uint64_t m_nextSlot = 1;
  Recording m_rec;
  std::vector<size_t> m_grads;
};

// The live answers at the end of the feed equal the whole recording's analysis.
void expectSameAsAnalysis(const Recording& rec, const LiveAnalysis& live) {
  Recording sorted = rec;
  sorted.sortBySeq();
  const Analysis want = analyze(sorted);
  const PeakReport whole = live.wholePeak();
  expectSameState(whole.state, want.peaks.front().state);
  EXPECT_EQ(whole.phase, want.peaks.front().phase);
  EXPECT_EQ(whole.scope, want.peaks.front().scope);
  expectSameItems(whole.modules, want.peaks.front().modules);
  expectSameItems(whole.ops, want.peaks.front().ops);
  expectSameItems(whole.tensors, want.peaks.front().tensors);
  const auto steps = live.steps();
  ASSERT_EQ(steps.size(), sorted.steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(steps[i].interval.endSeq, sorted.steps[i].endSeq);
    expectSameState(steps[i].peak.state, want.peaks[i + 1].state);
    EXPECT_EQ(steps[i].peak.phase, want.peaks[i + 1].phase);
    EXPECT_EQ(steps[i].peak.scope, want.peaks[i + 1].scope);
  }
  // The whole timeline at any number of buckets: the same fold of the same samples.
  const LivenessReplay replay(sorted, want.categories);
  for (int buckets : {1, 7, 300, 5000}) {
    SCOPED_TRACE("buckets " + std::to_string(buckets));
    const int64_t from = replay.firstTsNs(), to = replay.lastTsNs();
    const int level = chooseLevel(want.timeline, from, to, buckets);
    const auto expected =
        foldTimeline(samplesInRange(want.timeline.levels[static_cast<size_t>(level)], from, to),
                     from, to, buckets, level, finerSamplesOf(want.timeline));
    const auto got = live.timeline(from, to, buckets);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t b = 0; b < got.size(); ++b) {
      EXPECT_EQ(got[b].empty, expected[b].empty) << b;
      EXPECT_EQ(got[b].max, expected[b].max) << b;
      EXPECT_EQ(got[b].min, expected[b].min) << b;
    }
  }
}

TEST(LiveAnalysisTest, EqualsTheAnalysisOfTheWholeRecording) {
  for (uint64_t seed : {1, 2}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Recording rec = Training(seed).make(12, 24);
    LiveAnalysis live;
    feed(rec, live);
    expectSameAsAnalysis(rec, live);
    EXPECT_EQ(live.recategorized(), 0);
  }
}

TEST(LiveAnalysisTest, MidStepAnswersEqualTheAnalysisOfWhatCameSoFar) {
  const Recording rec = Training(3).make(6, 16);
  // Cut in the middle of step 4's backward: what a query sees while the job runs.
  const StepInterval& s4 = rec.steps[4];
  const uint64_t cut = (s4.beginSeq + s4.endSeq) / 2 + 9;
  LiveAnalysis live;
  feed(rec, live, cut);
  EXPECT_GT(live.windowEdges(), 0u) << "the step is not replayed yet: answers replay the window";
  Recording sofar;
  for (Block b : rec.blocks) {
    if (b.allocSeq > cut) continue;
    if (b.freeSeq > cut) b.freeSeq = kOpenSeq;
    sofar.blocks.push_back(b);
  }
  for (const Tag& t : rec.tags)
    if (t.seq <= cut) sofar.tags.push_back(t);
  for (PhaseInterval p : rec.phases) {
    if (p.beginSeq > cut) continue;
    if (p.endSeq > cut) p.endSeq = kOpenSeq;
    sofar.phases.push_back(p);
  }
  for (const auto* list : {&rec.scopes, &rec.ops}) {
    for (ScopeInterval s : *list) {
      if (s.beginSeq > cut) continue;
      if (s.endSeq > cut) s.endSeq = kOpenSeq;
      (list == &rec.scopes ? sofar.scopes : sofar.ops).push_back(s);
    }
  }
  for (const StepInterval& s : rec.steps)
    if (s.endSeq <= cut) sofar.steps.push_back(s);
  // The running step is an answer of its own (its peak so far); the rest must be equal.
  auto steps = live.steps();
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps.back().interval.endSeq, kOpenSeq);
  Recording sorted = sofar;
  sorted.sortBySeq();
  const Analysis want = analyze(sorted);
  expectSameState(live.wholePeak().state, want.peaks.front().state);
  for (size_t i = 0; i < 4; ++i) expectSameState(steps[i].peak.state, want.peaks[i + 1].state);
  // The running step's peak so far: the highest state since its begin.
  const LivenessReplay replay(sorted, want.categories);
  expectSameState(steps[4].peak.state, replay.peak(s4.beginSeq, kOpenSeq));
}

TEST(LiveAnalysisTest, AWindowWithoutStepsIsBoundedAndItsTrackedPeakExact) {
  // No step marks: the window is replayed whenever it is full. A million events of blocks that
  // live a little while, a few that live for good.
  Recording rec;
  std::mt19937_64 rng(9);
  uint64_t seq = 0;
  std::vector<size_t> live;
  for (int i = 0; i < 3000000; ++i) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 64)) {
      const size_t k = rng() % live.size();
      rec.blocks[live[k]].freeSeq = ++seq;
      rec.blocks[live[k]].freeTsNs = static_cast<int64_t>(seq) * 3;
      live.erase(live.begin() + static_cast<long>(k));
      continue;
    }
    Block b;
    b.id = static_cast<int64_t>(rec.blocks.size()) + 1;
    b.address = 0x1000 + (rec.blocks.size() % 100000) * 256;
    b.sizeBytes = 64 + rng() % 4096;
    b.allocSeq = ++seq;
    b.allocTsNs = static_cast<int64_t>(seq) * 3;
    if (rng() % 1000 != 0) live.push_back(rec.blocks.size());
    rec.blocks.push_back(b);
  }
  LiveAnalysis analysis;
  feed(rec, analysis);
  EXPECT_LT(analysis.windowEdges(), analysis.maxWindowEdges());
  // What it holds: the live blocks and the window's, and at most kMaxLevelSamples samples a
  // level for the levels still kept (the finest ones, filled, are let go).
  EXPECT_LT(analysis.openBlocks(), analysis.windowEdges() + 4000) << "freed blocks are let go";
  EXPECT_LT(analysis.keptSamples(), LiveAnalysis::kMaxLevelSamples * 4 / 3 + 1);
  EXPECT_GE(analysis.keptLevels(), 3);
  // Without step marks nothing goes to the store (the pass will infer the steps).
  EXPECT_TRUE(analysis.takeChunks().empty());
  EXPECT_TRUE(analysis.takeBlockCodes().empty());
  Recording sorted = rec;
  sorted.sortBySeq();
  const Analysis want = analyze(sorted);
  const PeakReport got = analysis.wholePeak();
  EXPECT_EQ(got.state.seq, want.peaks.front().state.seq);
  EXPECT_EQ(got.state.trackedBytes, want.peaks.front().state.trackedBytes);
  // The timeline's totals over the whole range: every bucket's highest total is the recording's.
  const auto buckets = analysis.timeline(0, 0, 500);
  int64_t highest = 0;
  for (const auto& b : buckets) highest = std::max(highest, b.max[0]);
  EXPECT_EQ(highest, want.peaks.front().state.trackedBytes);
  const LiveAnalysis::Final f = analysis.finish();
  EXPECT_FALSE(f.exact) << "no step marks (and allocations over live blocks): the pass runs";
  EXPECT_TRUE(analysis.takeChunks().empty());
}

TEST(LiveAnalysisTest, ALateTagMovesTheBlockFromThen) {
  // Step 0 allocates an untagged block that outlives it; step 1 tags it as optimizer state.
  Recording rec;
  auto step = [&](int64_t n, uint64_t b, uint64_t e) {
    StepInterval s;
    s.step = n;
    s.beginSeq = b;
    s.endSeq = e;
    s.beginTsNs = static_cast<int64_t>(b) * 10;
    s.endTsNs = static_cast<int64_t>(e) * 10;
    rec.steps.push_back(s);
  };
  Block b;
  b.id = 1;
  b.address = 0x9000;
  b.sizeBytes = 1000;
  b.allocSeq = 2;
  b.allocTsNs = 20;
  rec.blocks.push_back(b);
  step(0, 1, 3);
  Tag t;
  t.seq = 5;
  t.address = 0x9000;
  t.category = Category::kOptimizerState;
  rec.tags.push_back(t);
  Block c = b;
  c.id = 2;
  c.address = 0xa000;
  c.allocSeq = 6;
  c.allocTsNs = 60;
  rec.blocks.push_back(c);
  step(1, 4, 7);
  LiveAnalysis live;
  feed(rec, live);
  EXPECT_EQ(live.recategorized(), 1);
  const auto steps = live.steps();
  ASSERT_EQ(steps.size(), 2u);
  // Step 0 counted it unknown (all that was known then); step 1 as optimizer state, as now.
  EXPECT_EQ(steps[0].peak.state.bytes[categoryIndex(Category::kUnknown)], 1000);
  EXPECT_EQ(steps[1].peak.state.bytes[categoryIndex(Category::kOptimizerState)], 1000);
  EXPECT_EQ(steps[1].peak.state.bytes[categoryIndex(Category::kUnknown)], 1000);  // the second
  EXPECT_EQ(steps[1].peak.state.trackedBytes, 2000);
}

// What the analysis pass hands its sink, kept.
class KeepingSink : public AnalysisSink {
 public:
  bool blockCodes(int64_t, const std::string& c) override {
    codes += c;
    return true;
  }
  std::string codes;
  bool timelineChunk(int level, int64_t chunk, const std::vector<TimelineSample>& s) override {
    chunks.push_back({level, chunk, s});
    return true;
  }
  std::vector<TimelineChunk> chunks;
};

TEST(LiveAnalysisTest, AtTheEndItHoldsWhatTheAnalysisPassStores) {
  // Steps within the window, and steps of about 3,000 events through a window of 1,024: replayed
  // when full (all but its last quarter), tags following their blocks closely.
  struct Case {
    uint64_t seed;
    int steps, layers;
    size_t window;
  };
  for (const Case& k :
       {Case{5, 400, 60, LiveAnalysis::kDefaultWindowEdges},
        Case{6, 400, 60, LiveAnalysis::kDefaultWindowEdges}, Case{7, 60, 300, 1024}}) {
    SCOPED_TRACE("seed " + std::to_string(k.seed));
    Recording rec = Training(k.seed).make(k.steps, k.layers);  // chunks of two levels, of codes
    // Block ids in the order the ingest writes the rows (the store's ids): at their free, then
    // those live at the end by allocation.
    {
      std::vector<size_t> order(rec.blocks.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const Block &x = rec.blocks[a], &y = rec.blocks[b];
        return std::make_pair(x.freeSeq, x.allocSeq) < std::make_pair(y.freeSeq, y.allocSeq);
      });
      for (size_t rank = 0; rank < order.size(); ++rank)
        rec.blocks[order[rank]].id = static_cast<int64_t>(rank) + 1;
    }
    LiveAnalysis live(k.window);
    feed(rec, live);
    std::vector<TimelineChunk> chunks = live.takeChunks();
    EXPECT_FALSE(chunks.empty()) << "chunks are handed on while events come";
    std::string codes;
    int64_t codeChunks = 0;
    for (const auto& [index, c] : live.takeBlockCodes()) {
      EXPECT_EQ(index, codeChunks++);
      codes += c;
    }
    if (rec.blocks.size() > 2 * AnalysisSink::kBlocksPerChunk) {
      EXPECT_FALSE(codes.empty()) << "codes are handed on while events come";
    }
    const LiveAnalysis::Final got = live.finish();
    for (TimelineChunk& c : live.takeChunks()) chunks.push_back(std::move(c));
    for (const auto& [index, c] : live.takeBlockCodes()) {
      EXPECT_EQ(index, codeChunks++);
      codes += c;
    }
    ASSERT_TRUE(got.exact) << got.why;

    auto stream = streamOf(rec);
    KeepingSink sink;
    StreamingOptions options;
    options.tempDir = ::testing::TempDir();
    const StreamingResult want = analyzeStream(*stream, sink, options);
    ASSERT_EQ(want.error, "");
    EXPECT_EQ(codes.size(), rec.blocks.size());
    EXPECT_TRUE(codes == sink.codes) << "the blocks' categories, in the store's order";
    EXPECT_EQ(got.stats.tagsMatched, want.stats.tagsMatched);
    EXPECT_EQ(got.stats.tagsUnmatched, want.stats.tagsUnmatched);
    ASSERT_EQ(got.peaks.size(), want.peaks.size());
    for (size_t i = 0; i < got.peaks.size(); ++i) {
      SCOPED_TRACE("peak " + std::to_string(i));
      EXPECT_EQ(got.peaks[i].step, want.peaks[i].step);
      expectSameState(got.peaks[i].state, want.peaks[i].state);
      EXPECT_EQ(got.peaks[i].phase, want.peaks[i].phase);
      EXPECT_EQ(got.peaks[i].scope, want.peaks[i].scope);
      expectSameItems(got.peaks[i].modules, want.peaks[i].modules);
      expectSameItems(got.peaks[i].ops, want.peaks[i].ops);
      expectSameItems(got.peaks[i].tensors, want.peaks[i].tensors);
    }
    // The same chunks, level by level in the order each level completes them.
    auto byLevel = [](std::vector<TimelineChunk> v) {
      std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
        return std::make_pair(a.level, a.index) < std::make_pair(b.level, b.index);
      });
      return v;
    };
    const auto a = byLevel(chunks), b = byLevel(sink.chunks);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_GT(a.size(), 3u);
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE("chunk " + std::to_string(i));
      EXPECT_EQ(a[i].level, b[i].level);
      EXPECT_EQ(a[i].index, b[i].index);
      expectSameSamples(a[i].samples, b[i].samples);
    }
  }
}

TEST(LiveAnalysisTest, StepsHandedToTheStoreAreLetGoOfOnceStored) {
  // 300 steps of ~60 events, taken as the ingest takes rows (here every 7 events, with the
  // steps' peaks) and stored 30 takes (about 3 steps) later.
  constexpr int kSteps = 300;
  const Recording rec = Training(9).make(kSteps, 6);
  LiveAnalysis live;
  std::vector<PeakReport> handed;
  size_t maxHeld = 0;
  int events = 0;
  feed(rec, live, kOpenSeq, [&] {
    if (++events % 7 != 0) return;
    for (const SharedPeakReport& p : live.takeStepPeaks()) handed.push_back(*p);
    if (live.handoutTicket() > 30) live.storedThrough(live.handoutTicket() - 30);
    maxHeld = std::max(maxHeld, live.heldSteps());
  });
  // What it holds: the steps of the last takes, not the session's.
  EXPECT_LE(maxHeld, 6u);
  EXPECT_GE(live.storedBelow(), kSteps - 6);
  EXPECT_GT(live.heldSteps(), 1u) << "steps handed on and not stored yet at the end";
  size_t known = 0;
  const auto page = live.stepPage(std::nullopt, 1000, false, &known);
  EXPECT_EQ(known, size_t{kSteps}) << "the steps let go of still count";
  ASSERT_FALSE(page.empty());
  EXPECT_EQ(page.front().interval.step, live.storedBelow()) << "the page holds the rest";
  // What it handed on and what the end holds: every step's peak once, as the pass finds it.
  const LiveAnalysis::Final got = live.finish();
  ASSERT_TRUE(got.exact) << got.why;
  EXPECT_TRUE(live.takeStepPeaks().empty()) << "the end's own peaks are not handed on again";
  std::map<int64_t, PeakReport> all;
  for (const PeakReport& p : handed) EXPECT_TRUE(all.emplace(p.step, p).second) << p.step;
  for (size_t i = 1; i < got.peaks.size(); ++i)
    EXPECT_TRUE(all.emplace(got.peaks[i].step, got.peaks[i]).second) << got.peaks[i].step;
  Recording sorted = rec;
  sorted.sortBySeq();
  const Analysis want = analyze(sorted);
  ASSERT_EQ(all.size(), size_t{kSteps});
  for (int64_t s = 0; s < kSteps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const PeakReport& p = all.at(s);
    expectSameState(p.state, want.peaks[static_cast<size_t>(s) + 1].state);
    EXPECT_EQ(p.phase, want.peaks[static_cast<size_t>(s) + 1].phase);
    EXPECT_EQ(p.scope, want.peaks[static_cast<size_t>(s) + 1].scope);
  }
  // Every step let go of by the end: still a session with steps, its chunks handed on, exact.
  {
    LiveAnalysis early;
    size_t chunks = 0;
    feed(Training(10).make(40, 6), early, kOpenSeq, [&] {
      chunks += early.takeChunks().size();
      early.takeStepPeaks();
      early.storedThrough(early.handoutTicket());
    });
    EXPECT_EQ(early.heldSteps(), 0u);
    const LiveAnalysis::Final f = early.finish();
    EXPECT_TRUE(f.exact) << f.why;
    EXPECT_EQ(f.peaks.size(), 1u) << "the whole session's only";
    chunks += early.takeChunks().size();
    EXPECT_GT(chunks, 0u);
  }
  // One built again after a restart (answers only) hands its steps on too.
  {
    LiveAnalysis rebuilt;
    rebuilt.answerOnly("built again");
    feed(Training(11).make(5000, 1), rebuilt);
    EXPECT_TRUE(rebuilt.takeChunks().empty());
    EXPECT_EQ(rebuilt.takeStepPeaks().size(), 5000u);
    EXPECT_TRUE(rebuilt.takeStepPeaks().empty());
    rebuilt.storedThrough(rebuilt.handoutTicket());
    EXPECT_EQ(rebuilt.heldSteps(), 0u);
    EXPECT_EQ(rebuilt.storedBelow(), 5000);
  }
  // A step numbered below those let go of: the pass must run (pages would not find it).
  LiveAnalysis again;
  feed(Training(9).make(3, 2), again, kOpenSeq, [&] {
    again.takeStepPeaks();
    again.storedThrough(again.handoutTicket());
  });
  ASSERT_EQ(again.storedBelow(), 3);
  again.stepBegin(1, 1u << 30, 1 << 30);
  EXPECT_NE(again.finish().why.find("began after later ones"), std::string::npos);
}

TEST(LiveAnalysisTest, AtTheEndItSaysWhenThePassMustRun) {
  {  // a tag after the step its block was born in
    Recording rec;
    Block b;
    b.id = 1;
    b.address = 0x9000;
    b.sizeBytes = 1000;
    b.allocSeq = 2;
    b.allocTsNs = 20;
    rec.blocks.push_back(b);
    StepInterval s0;
    s0.step = 0;
    s0.beginSeq = 1;
    s0.endSeq = 3;
    rec.steps.push_back(s0);
    Tag t;
    t.seq = 4;
    t.address = 0x9000;
    t.category = Category::kWeight;
    rec.tags.push_back(t);
    LiveAnalysis live;
    feed(rec, live);
    const auto f = live.finish();
    EXPECT_FALSE(f.exact);
    EXPECT_EQ(f.why, "blocks moved to another category while live");
  }
  {  // no step marks
    Recording rec;
    Block b;
    b.id = 1;
    b.address = 0x9000;
    b.sizeBytes = 1000;
    b.allocSeq = 1;
    rec.blocks.push_back(b);
    LiveAnalysis live;
    feed(rec, live);
    const auto f = live.finish();
    EXPECT_FALSE(f.exact);
    EXPECT_NE(f.why.find("no step marks"), std::string::npos);
  }
  {  // device memory counted before its device's first tensor
    Recording rec = Training(8).make(3, 4);
    Block raw;
    raw.kind = MemoryKind::kDevice;
    raw.device = 1;
    raw.address = 0x100;
    raw.sizeBytes = 64;
    raw.allocSeq = 1000000;  // past the training, in a step of its own
    raw.allocTsNs = 1;
    StepInterval late = rec.steps.back();
    late.step = 99;
    late.beginSeq = 1000001;
    late.endSeq = 1000003;
    Block tensor = raw;
    tensor.kind = MemoryKind::kTensor;
    tensor.allocSeq = 1000004;
    raw.freeSeq = 1000002;
    rec.blocks.push_back(raw);
    rec.steps.push_back(late);
    rec.blocks.push_back(tensor);
    LiveAnalysis live;
    feed(rec, live);
    const auto f = live.finish();
    EXPECT_FALSE(f.exact);
    EXPECT_EQ(f.why, "device memory counted before the device's first tensor");
  }
}

}  // namespace
}  // namespace tidemark::core
