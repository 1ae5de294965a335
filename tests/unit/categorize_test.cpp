#include "src/core/categorize.h"

#include <gtest/gtest.h>

#include "tests/unit/recording_builders.h"

namespace tidemark::core {
namespace {

using testing::block;
using testing::phase;
using testing::tag;

TEST(CategorizeTest, TagJoinsTheBlockLiveAtItsAddressAtThatMoment) {
  Recording rec;
  // The same address is used twice; each tag must land on the block live at its moment.
  rec.blocks = {block(0x1000, 64, 1, 5), block(0x1000, 128, 6, kOpenSeq)};
  rec.tags = {tag(3, 0x1000, Category::kActivation), tag(7, 0x1000, Category::kWeight)};
  rec.sortBySeq();
  CategorizeStats stats;
  auto cats = categorize(rec, &stats);
  EXPECT_EQ(cats[0].category, Category::kActivation);
  EXPECT_EQ(cats[1].category, Category::kWeight);
  EXPECT_EQ(cats[1].rule, CategoryRule::kTag);
  EXPECT_EQ(stats.tagsMatched, 2);
  EXPECT_EQ(stats.tagsUnmatched, 0);
}

TEST(CategorizeTest, TagOutsideAnyLifetimeIsCountedNotApplied) {
  Recording rec;
  rec.blocks = {block(0x1000, 64, 2, 4)};
  rec.tags = {tag(1, 0x1000, Category::kWeight),   // before the block
              tag(4, 0x1000, Category::kWeight),   // at its free: already gone
              tag(3, 0x2000, Category::kWeight)};  // another address
  rec.sortBySeq();
  CategorizeStats stats;
  auto cats = categorize(rec, &stats);
  EXPECT_EQ(cats[0].category, Category::kUnknown);
  EXPECT_EQ(stats.tagsUnmatched, 3);
}

TEST(CategorizeTest, HighestPriorityTagWins) {
  Recording rec;
  rec.blocks = {block(0x1000, 64, 1, kOpenSeq)};
  rec.tags = {tag(2, 0x1000, Category::kActivation), tag(3, 0x1000, Category::kWeight),
              tag(4, 0x1000, Category::kActivation)};
  rec.sortBySeq();
  auto cats = categorize(rec);
  EXPECT_EQ(cats[0].category, Category::kWeight);
  EXPECT_EQ(cats[0].tagCount, 3);
}

TEST(CategorizeTest, RulesDecideUntaggedBlocks) {
  Recording rec;
  rec.phases = {phase(Phase::kForward, 1, 10), phase(Phase::kBackward, 10, 30),
                phase(Phase::kRecompute, 12, 18)};
  rec.blocks = {
      block(0x1000, 8, 2, 5),          // born and freed in forward: TEMPORARY
      block(0x2000, 8, 3, 20),         // forward to backward: UNKNOWN
      block(0x3000, 8, 13, 25),        // born in recompute, outlives it: RECOMPUTED
      block(0x4000, 8, 14, 16),        // born and freed in recompute: TEMPORARY
      block(0x5000, 8, 40, kOpenSeq),  // outside phases: UNKNOWN
  };
  rec.sortBySeq();
  auto cats = categorize(rec);
  EXPECT_EQ(cats[0].category, Category::kTemporary);
  EXPECT_EQ(cats[0].rule, CategoryRule::kWithinPhase);
  EXPECT_EQ(cats[1].category, Category::kUnknown);
  EXPECT_EQ(cats[1].rule, CategoryRule::kUntagged);
  EXPECT_EQ(cats[2].category, Category::kRecomputed);
  EXPECT_EQ(cats[2].rule, CategoryRule::kBornInRecompute);
  EXPECT_EQ(cats[3].category, Category::kTemporary);
  EXPECT_EQ(cats[4].category, Category::kUnknown);
}

}  // namespace
}  // namespace tidemark::core
