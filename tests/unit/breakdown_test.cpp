#include "src/core/breakdown.h"

#include <gtest/gtest.h>

#include "src/core/peak.h"
#include "tests/unit/recording_builders.h"

namespace tidemark::core {
namespace {

using testing::block;

class BreakdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rec.blocks = {block(0x1000, 100, 1, kOpenSeq), block(0x2000, 50, 2, 4), block(0x3000, 70, 3, 6),
                  block(0x2000, 10, 5, 7)};
    Tag w;
    w.seq = 1;
    w.address = 0x1000;
    w.category = Category::kWeight;
    rec.tags = {w};
    StepInterval s1;
    s1.step = 1;
    s1.beginSeq = 1;
    s1.endSeq = 4;
    StepInterval s2;
    s2.step = 2;
    s2.beginSeq = 4;
    s2.endSeq = 8;
    rec.steps = {s1, s2};
    rec.sortBySeq();
    cats = categorize(rec);
  }
  Recording rec;
  std::vector<BlockCategory> cats;
};

TEST_F(BreakdownTest, PeakIsTheHighestStateAndItsCategoriesAddUp) {
  LivenessReplay replay(rec, cats);
  MemoryState peak = replay.peak();
  EXPECT_EQ(peak.seq, 3u);
  EXPECT_EQ(peak.trackedBytes, 220);
  EXPECT_EQ(peak.bytes[categoryIndex(Category::kWeight)], 100);
  EXPECT_EQ(peak.bytes[categoryIndex(Category::kUnknown)], 120);
  EXPECT_EQ(peak.blocks[categoryIndex(Category::kUnknown)], 2);
}

TEST_F(BreakdownTest, PeakWithinAStepRangeCountsTheStateOnEntry) {
  LivenessReplay replay(rec, cats);
  // Step 2 starts at seq 4 (a free): the state just before it, 220 bytes, is its peak.
  MemoryState p2 = replay.peak(4, 8);
  EXPECT_EQ(p2.trackedBytes, 220);
  EXPECT_EQ(p2.seq, 4u);
  MemoryState p = replay.peak(5, 8);
  EXPECT_EQ(p.trackedBytes, 180);
  EXPECT_EQ(p.seq, 5u);
}

TEST_F(BreakdownTest, StateAtTimeAndEveryState) {
  LivenessReplay replay(rec, cats);
  EXPECT_EQ(replay.at(450).trackedBytes, 170);  // after seq 4
  EXPECT_EQ(replay.at(700).trackedBytes, 100);  // after seq 7
  int64_t samples = 0;
  replay.forEachState([&](const MemoryState& s) {
    int64_t sum = 0;
    for (int64_t b : s.bytes) sum += b;
    EXPECT_EQ(sum, s.trackedBytes);
    ++samples;
  });
  EXPECT_EQ(samples, 7);
}

TEST_F(BreakdownTest, LookupsOfIntervals) {
  EXPECT_EQ(rec.stepAt(2)->step, 1);
  EXPECT_EQ(rec.stepAt(4)->step, 2);
  EXPECT_EQ(rec.stepAt(9), nullptr);
  EXPECT_EQ(rec.findStep(3), nullptr);
}

// A live session read at a cut of its stream (seq 5 released, 6 not yet): what came after goes,
// what ended after is open again, and the peak and steps are those of the recording so far.
TEST_F(BreakdownTest, ARecordingClippedAtACutIsTheRecordingSoFar) {
  Recording cut = rec;
  cut.tags.push_back(testing::tag(6, 0x3000, Category::kActivation));
  cut.phases = {testing::phase(Phase::kForward, 4, 6), testing::phase(Phase::kBackward, 6, 8)};
  cut.clipBefore(6);
  ASSERT_EQ(cut.blocks.size(), 4u);      // the block allocated at 5 stays, freed later: open again
  EXPECT_TRUE(cut.blocks[2].live());     // 0x3000, freed at 6
  EXPECT_TRUE(cut.blocks[3].live());     // 0x2000 again, freed at 7
  EXPECT_EQ(cut.blocks[1].freeSeq, 4u);  // freed before the cut: as it was
  ASSERT_EQ(cut.tags.size(), 1u);
  ASSERT_EQ(cut.steps.size(), 2u);
  EXPECT_EQ(cut.steps[0].endSeq, 4u);
  EXPECT_EQ(cut.steps[1].endSeq, kOpenSeq);  // step 2 had not ended at the cut
  ASSERT_EQ(cut.phases.size(), 1u);          // the backward began at the cut: gone
  EXPECT_EQ(cut.phases[0].endSeq, kOpenSeq);
  Recording before = rec;
  before.clipBefore(5);
  ASSERT_EQ(before.blocks.size(), 3u);
  const std::vector<BlockCategory> beforeCats = categorize(before);
  EXPECT_EQ(LivenessReplay(before, beforeCats).peak().trackedBytes, 220);
  Recording whole = rec;
  whole.clipBefore(kOpenSeq);
  EXPECT_EQ(whole.blocks.size(), rec.blocks.size());
  EXPECT_EQ(whole.blocks[2].freeSeq, 6u);
}

TEST(PeakItems, ABlockOutsideModulesGoesToItsOwnerOrItsAllocatingCode) {
  PeakItemsBuilder items(false);
  const std::string mlp = "model.mlp";
  // In a module scope: that module; a parameter's state: its owner; an imported block tagged
  // "[rule] function (file:line)": that code; a rule alone, or nothing: no module.
  items.add(&mlp, nullptr, "", 0x10, 100, Category::kActivation, CategoryRule::kTag);
  items.add(nullptr, nullptr, "model.fc.weight.exp_avg", 0x20, 40, Category::kOptimizerState,
            CategoryRule::kTag);
  items.add(nullptr, nullptr, "[frames:optimizer] step (optimizer.py:76)", 0x30, 30,
            Category::kOptimizerState, CategoryRule::kTag);
  items.add(nullptr, nullptr, "[frames:optimizer] step (optimizer.py:76)", 0x40, 5,
            Category::kOptimizerState, CategoryRule::kTag);
  items.add(nullptr, nullptr, "[kept, parameter-sized]", 0x50, 20, Category::kWeight,
            CategoryRule::kTag);
  items.add(nullptr, nullptr, "", 0x60, 1, Category::kUnknown, CategoryRule::kUntagged);
  PeakReport report;
  items.finish(report, 10);
  std::map<std::string, int64_t> modules;
  for (const PeakItem& m : report.modules) modules[m.name] = m.bytes;
  EXPECT_EQ(modules, (std::map<std::string, int64_t>{{"model.mlp", 100},
                                                     {"model.fc", 40},
                                                     {"step (optimizer.py:76)", 35},
                                                     {"(no module)", 21}}));
  // Each tensor keeps its block's address.
  ASSERT_FALSE(report.tensors.empty());
  EXPECT_EQ(report.tensors.front().address, 0x10u);
}

}  // namespace
}  // namespace tidemark::core
