// The streaming analysis (bounded memory, sorts on disk) against the in-memory one, on random
// recordings with everything the rules look at: address reuse, tags (some matching nothing),
// tensors in device segments, workspace, nested phases, module and op scopes on two threads,
// marked steps or none (inference); with room for everything in memory and with sorts that
// spill to disk every thousand records.
#include "src/core/streaming_analysis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "src/core/analysis.h"
#include "tests/unit/analysis_expectations.h"

namespace tidemark::core {
namespace {

using testing::expectSameItems;
using testing::expectSameSamples;
using testing::expectSameState;

class RandomRecording {
 public:
  RandomRecording(uint64_t seed, bool steps, bool periodic) : m_rng(seed), m_steps(steps) {
    m_periodic = periodic;
  }

  Recording make(int stepCount, int eventsPerStep) {
    for (int step = 0; step < stepCount; ++step) {
      if (m_periodic) m_rng.seed(1234);  // every step the same events
      const uint64_t stepBegin = ++m_seq;
      phaseTo(Phase::kForward);
      for (int i = 0; i < eventsPerStep; ++i) {
        if (i == eventsPerStep / 2) phaseTo(Phase::kBackward);
        if (i == eventsPerStep * 5 / 8) openRecompute();
        if (i == eventsPerStep * 6 / 8) closeRecompute();
        if (i == eventsPerStep * 7 / 8) phaseTo(Phase::kOptimizer);
        event();
      }
      while (m_live.size() > 40) freeAt(m_live.size() - 1);
      if (m_steps) {
        StepInterval s;
        s.step = step;
        s.beginSeq = stepBegin;
        s.beginTsNs = ts(stepBegin);
        s.endSeq = ++m_seq;
        s.endTsNs = ts(s.endSeq);
        m_rec.steps.push_back(s);
      }
    }
    closePhase();
    for (auto& [thread, stack] : m_scopeStack) {  // some scopes stay open at the end
      for (size_t i = 0; i + 1 < stack.size(); ++i) closeScope(thread);
      (void)thread;
    }
    // Blocks still live stay live (live at the end); a recompute left open stays open.
    for (size_t i = 0; i < m_rec.blocks.size(); ++i) m_rec.blocks[i].id = m_ids[i];
    return m_rec;
  }

 private:
  static int64_t ts(uint64_t seq) { return static_cast<int64_t>(seq) * 7 + 1000; }
  uint64_t pick(uint64_t n) { return m_rng() % n; }

  void event() {
    const uint64_t r = pick(100);
    if (r < 30 && !m_live.empty()) {
      freeAt(pick(m_live.size()));
    } else if (r < 40) {
      tagSomething();
    } else if (r < 48) {
      scopeEvent();
    } else if (r < 52) {
      alloc(MemoryKind::kDevice, static_cast<int32_t>(pick(2)), 0x10000000 + pick(16) * 0x100000,
            0x100000);
    } else if (r < 75 && !m_segments.empty()) {
      const Block& seg = m_rec.blocks[m_segments[pick(m_segments.size())]];
      alloc(MemoryKind::kTensor, seg.device, seg.address + pick(64) * 512, 256 + pick(4) * 64);
    } else {
      alloc(MemoryKind::kHost, -1, 0x7f0000000000 + pick(256) * 64, 64 + pick(8) * 64);
    }
  }

  void alloc(MemoryKind kind, int32_t device, uint64_t address, uint64_t size) {
    for (size_t i : m_live) {  // one live block per kind, device and address
      const Block& b = m_rec.blocks[i];
      if (b.kind == kind && b.device == device && b.address == address) return;
    }
    Block b;
    b.kind = kind;
    b.device = device;
    b.address = address;
    b.sizeBytes = size;
    b.threadId = 1 + static_cast<uint32_t>(pick(2));
    b.allocSeq = ++m_seq;
    b.allocTsNs = ts(b.allocSeq);
    m_live.push_back(m_rec.blocks.size());
    if (kind == MemoryKind::kDevice) m_segments.push_back(m_rec.blocks.size());
    m_rec.blocks.push_back(b);
    // Ids in an order of their own (the store's rows are in free order).
    m_ids.push_back(static_cast<int64_t>((m_rec.blocks.size() * 7919) % 1000003) + 1);
  }

  void freeAt(size_t k) {
    const size_t i = m_live[k];
    Block& b = m_rec.blocks[i];
    b.freeSeq = ++m_seq;
    b.freeTsNs = ts(b.freeSeq);
    m_live.erase(m_live.begin() + static_cast<long>(k));
    auto s = std::find(m_segments.begin(), m_segments.end(), i);
    if (s != m_segments.end()) m_segments.erase(s);
  }

  void tagSomething() {
    static constexpr Category kCats[] = {Category::kWeight,         Category::kGradient,
                                         Category::kOptimizerState, Category::kActivation,
                                         Category::kInput,          Category::kCheckpointInput};
    Tag t;
    t.seq = ++m_seq;
    t.tsNs = ts(t.seq);
    t.category = kCats[pick(6)];
    t.name = pick(4) == 0 ? "" : "model.layer" + std::to_string(pick(5)) + ".weight";
    if (!m_live.empty() && pick(5) != 0)
      t.address = m_rec.blocks[m_live[pick(m_live.size())]].address;
    else
      t.address = 0x7f0000000000 + pick(256) * 64;  // often nothing there
    m_rec.tags.push_back(t);
  }

  void scopeEvent() {
    const uint32_t thread = 1 + static_cast<uint32_t>(pick(2));
    auto& stack = m_scopeStack[thread];
    if (!stack.empty() && pick(2) == 0) return closeScope(thread);
    ScopeInterval s;
    s.threadId = thread;
    s.isOp = pick(3) == 0;
    s.name = (s.isOp ? "aten::op" : "model.block") + std::to_string(pick(6));
    s.beginSeq = ++m_seq;
    s.beginTsNs = ts(s.beginSeq);
    s.depth = static_cast<int>(stack.size());
    stack.push_back({s.isOp, (s.isOp ? m_rec.ops : m_rec.scopes).size()});
    (s.isOp ? m_rec.ops : m_rec.scopes).push_back(s);
  }

  void closeScope(uint32_t thread) {
    auto& stack = m_scopeStack[thread];
    if (stack.empty()) return;
    auto [isOp, index] = stack.back();
    stack.pop_back();
    ScopeInterval& s = (isOp ? m_rec.ops : m_rec.scopes)[index];
    s.endSeq = ++m_seq;
    s.endTsNs = ts(s.endSeq);
  }

  void phaseTo(Phase p) {
    closePhase();
    PhaseInterval i;
    i.phase = p;
    i.threadId = 1;
    i.beginSeq = ++m_seq;
    i.beginTsNs = ts(i.beginSeq);
    m_phase = m_rec.phases.size();
    m_rec.phases.push_back(i);
  }
  void closePhase() {
    if (m_phase == SIZE_MAX) return;
    m_rec.phases[m_phase].endSeq = ++m_seq;
    m_rec.phases[m_phase].endTsNs = ts(m_seq);
    m_phase = SIZE_MAX;
  }
  void openRecompute() {
    PhaseInterval i;
    i.phase = Phase::kRecompute;
    i.threadId = 1;
    i.beginSeq = ++m_seq;
    i.beginTsNs = ts(i.beginSeq);
    m_recompute = m_rec.phases.size();
    m_rec.phases.push_back(i);
  }
  void closeRecompute() {
    m_rec.phases[m_recompute].endSeq = ++m_seq;
    m_rec.phases[m_recompute].endTsNs = ts(m_seq);
  }

  std::mt19937_64 m_rng;
  bool m_steps;
  bool m_periodic = false;
  uint64_t m_seq = 0;
  Recording m_rec;
  std::vector<int64_t> m_ids;
  std::vector<size_t> m_live;
  std::vector<size_t> m_segments;
  std::map<uint32_t, std::vector<std::pair<bool, size_t>>> m_scopeStack;
  size_t m_phase = SIZE_MAX;
  size_t m_recompute = 0;
};

class MemorySink : public AnalysisSink {
 public:
  bool blockCodes(int64_t chunk, const std::string& c) override {
    EXPECT_EQ(chunk, static_cast<int64_t>(codes.size() / kBlocksPerChunk));
    codes += c;
    return true;
  }
  bool timelineChunk(int level, int64_t chunk, const std::vector<TimelineSample>& s) override {
    auto& samples = levels[level];
    EXPECT_EQ(static_cast<size_t>(chunk) * kSamplesPerChunk, samples.size());
    samples.insert(samples.end(), s.begin(), s.end());
    return true;
  }
  std::string codes;
  std::map<int, std::vector<TimelineSample>> levels;
};

// Both analyses of rec; returns the streaming one's spilled-or-not result for further checks.
void expectSameAnalysis(Recording rec, size_t memoryBytes) {
  Recording sorted = rec;
  sorted.sortBySeq();
  const Analysis expected = analyze(sorted);
  auto stream = streamOf(rec);
  MemorySink sink;
  StreamingOptions options;
  options.tempDir = ::testing::TempDir();
  options.memoryBytes = memoryBytes;
  const StreamingResult got = analyzeStream(*stream, sink, options);
  ASSERT_EQ(got.error, "");
  EXPECT_EQ(got.blocks, static_cast<int64_t>(sorted.blocks.size()));

  // Categories, in block id order as the store keeps them.
  std::vector<std::pair<int64_t, char>> byId;
  for (size_t i = 0; i < sorted.blocks.size(); ++i) {
    const BlockCategory& c = expected.categories[i];
    byId.emplace_back(sorted.blocks[i].id, static_cast<char>(static_cast<int>(c.category) |
                                                             (static_cast<int>(c.rule) << 4)));
  }
  std::sort(byId.begin(), byId.end());
  std::string codes;
  for (const auto& [id, code] : byId) codes.push_back(code);
  EXPECT_EQ(sink.codes, codes);
  EXPECT_EQ(got.stats.tagsMatched, expected.stats.tagsMatched);
  EXPECT_EQ(got.stats.tagsUnmatched, expected.stats.tagsUnmatched);

  // The timeline, level by level, sample by sample.
  ASSERT_EQ(got.timelineLevels, static_cast<int>(expected.timeline.levels.size()));
  for (size_t l = 0; l < expected.timeline.levels.size(); ++l) {
    const auto& want = expected.timeline.levels[l].samples;
    const auto& have = sink.levels[static_cast<int>(l)];
    SCOPED_TRACE("level " + std::to_string(l));
    expectSameSamples(have, want);
  }

  // Steps found, peaks with their phase, scope and items.
  ASSERT_EQ(got.inferredSteps.size(), expected.inferredSteps.size());
  for (size_t i = 0; i < got.inferredSteps.size(); ++i) {
    EXPECT_EQ(got.inferredSteps[i].beginSeq, expected.inferredSteps[i].beginSeq);
    EXPECT_EQ(got.inferredSteps[i].endSeq, expected.inferredSteps[i].endSeq);
  }
  ASSERT_EQ(got.peaks.size(), expected.peaks.size());
  for (size_t i = 0; i < got.peaks.size(); ++i) {
    SCOPED_TRACE("peak " + std::to_string(i));
    EXPECT_EQ(got.peaks[i].step, expected.peaks[i].step);
    expectSameState(got.peaks[i].state, expected.peaks[i].state);
    EXPECT_EQ(got.peaks[i].phase, expected.peaks[i].phase);
    EXPECT_EQ(got.peaks[i].scope, expected.peaks[i].scope);
    expectSameItems(got.peaks[i].modules, expected.peaks[i].modules);
    expectSameItems(got.peaks[i].ops, expected.peaks[i].ops);
    expectSameItems(got.peaks[i].tensors, expected.peaks[i].tensors);
  }
}

constexpr size_t kRoomy = 64u << 20;
constexpr size_t kSpilling = 3 * 1024 * 72;  // about a thousand records a run

TEST(StreamingAnalysisTest, EqualsTheInMemoryAnalysisWithStepMarks) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Recording rec = RandomRecording(seed, true, false).make(6, 2500);
    ASSERT_GT(rec.blocks.size(), 3000u);
    expectSameAnalysis(rec, kRoomy);
    expectSameAnalysis(rec, kSpilling);
  }
}

TEST(StreamingAnalysisTest, EqualsTheInMemoryAnalysisWhenStepsAreInferred) {
  Recording rec = RandomRecording(7, false, true).make(8, 1500);
  rec.phases.clear();  // no adapter: no marks of any kind
  Recording sorted = rec;
  sorted.sortBySeq();
  ASSERT_FALSE(analyze(sorted).inferredSteps.empty()) << "the recording should repeat";
  expectSameAnalysis(rec, kSpilling);
}

// An adapter marks every step it sees begin: a recording with its phase marks and no step mark
// saw no step begin, whatever repeats in it (a session attached and detached within one step
// inferred a step of each of 2,000 parameters' identical terms).
TEST(StreamingAnalysisTest, NoStepsAreInferredWhereAnAdapterMarkedPhasesButNoStep) {
  const Recording rec = RandomRecording(7, false, true).make(8, 1500);
  ASSERT_FALSE(rec.phases.empty());
  ASSERT_TRUE(rec.steps.empty());
  Recording sorted = rec;
  sorted.sortBySeq();
  const Analysis a = analyze(sorted);
  EXPECT_TRUE(a.inferredSteps.empty());
  ASSERT_EQ(a.peaks.size(), 1u);  // the whole recording's only
  auto stream = streamOf(rec);
  MemorySink sink;
  StreamingOptions options;
  options.memoryBytes = kSpilling;
  const StreamingResult got = analyzeStream(*stream, sink, options);
  ASSERT_EQ(got.error, "");
  EXPECT_TRUE(got.inferredSteps.empty());
  EXPECT_EQ(got.peaks.size(), 1u);
  expectSameAnalysis(rec, kSpilling);
}

TEST(StreamingAnalysisTest, AnEmptyRecordingHasOneEmptyLevelAndAnEmptyPeak) {
  expectSameAnalysis(Recording{}, kRoomy);
}

TEST(StreamingAnalysisTest, AnUnwritableTempDirIsAnErrorNotACrash) {
  const Recording rec = RandomRecording(4, true, false).make(2, 3000);
  auto stream = streamOf(rec);
  MemorySink sink;
  StreamingOptions options;
  options.tempDir = "/nonexistent/tidemark";
  options.memoryBytes = kSpilling;
  const StreamingResult got = analyzeStream(*stream, sink, options);
  EXPECT_NE(got.error.find("temporary file in /nonexistent/tidemark"), std::string::npos)
      << got.error;
}

}  // namespace
}  // namespace tidemark::core
