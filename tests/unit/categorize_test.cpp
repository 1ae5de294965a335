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
                phase(Phase::kRecompute, 12, 18), phase(Phase::kBackward, 50, 60),
                phase(Phase::kBackward, 52, 56)};
  rec.blocks = {
      block(0x1000, 8, 2, 5),          // born and freed in forward: TEMPORARY
      block(0x2000, 8, 3, 20),         // forward, freed by the backward: ACTIVATION
      block(0x3000, 8, 13, 25),        // born in recompute, outlives it: RECOMPUTED
      block(0x4000, 8, 14, 16),        // born and freed in recompute: TEMPORARY
      block(0x5000, 8, 40, kOpenSeq),  // outside phases: UNKNOWN
      block(0x6000, 8, 4, 35),         // forward, past the backward: UNKNOWN
      block(0x7000, 8, 33, 45),        // outside phases, freed outside: UNKNOWN
      block(0x8000, 8, 34, 51),        // outside phases, freed by a backward: ACTIVATION
      block(0x9000, 8, 11, 17),        // born in the backward, freed in it: TEMPORARY
      block(0xa000, 8, 46, 54),        // freed in a backward nested in another: ACTIVATION
      block(0xb000, 8, 53, 58),        // born in the nested one, freed in the outer (begun
                                       // before it): UNKNOWN
  };
  rec.sortBySeq();
  auto cats = categorize(rec);
  auto at = [&](uint64_t address) {
    for (size_t i = 0; i < rec.blocks.size(); ++i)
      if (rec.blocks[i].address == address) return cats[i];
    ADD_FAILURE() << "no block at " << address;
    return BlockCategory{};
  };
  EXPECT_EQ(at(0x1000).category, Category::kTemporary);
  EXPECT_EQ(at(0x1000).rule, CategoryRule::kWithinPhase);
  EXPECT_EQ(at(0x2000).category, Category::kActivation);
  EXPECT_EQ(at(0x2000).rule, CategoryRule::kFreedByBackward);
  EXPECT_EQ(at(0x3000).category, Category::kRecomputed);
  EXPECT_EQ(at(0x3000).rule, CategoryRule::kBornInRecompute);
  EXPECT_EQ(at(0x4000).category, Category::kTemporary);
  EXPECT_EQ(at(0x5000).category, Category::kUnknown);
  EXPECT_EQ(at(0x5000).rule, CategoryRule::kUntagged);
  EXPECT_EQ(at(0x6000).category, Category::kUnknown);
  EXPECT_EQ(at(0x7000).category, Category::kUnknown);
  EXPECT_EQ(at(0x8000).category, Category::kActivation);
  EXPECT_EQ(at(0x9000).category, Category::kTemporary);
  EXPECT_EQ(at(0xa000).category, Category::kActivation);
  EXPECT_EQ(at(0xb000).category, Category::kUnknown);
  EXPECT_EQ(ruleName(CategoryRule::kFreedByBackward), "freed_by_backward");
}

Block onDevice(Block b, MemoryKind kind, int32_t device) {
  b.kind = kind;
  b.device = device;
  return b;
}

TEST(CategorizeTest, TensorsFindTheirSegmentOnTheirDevice) {
  Recording rec;
  rec.blocks = {
      onDevice(block(0x1000, 1024, 1, kOpenSeq), MemoryKind::kDevice, 0),  // segment
      onDevice(block(0x1000, 4096, 2, kOpenSeq), MemoryKind::kDevice, 1),  // other device
      onDevice(block(0x1100, 256, 3, 9), MemoryKind::kTensor, 0),          // in the segment
      onDevice(block(0x1100, 256, 4, kOpenSeq), MemoryKind::kTensor, 1),   // in device 1's
      onDevice(block(0x1400, 16, 5, kOpenSeq), MemoryKind::kTensor, 0),    // past its end
      onDevice(block(0x9000, 64, 6, 8), MemoryKind::kDevice, 0),           // raw cudaMalloc
      onDevice(block(0x9000, 32, 7, kOpenSeq), MemoryKind::kTensor, 0),    // in the raw block?
      onDevice(block(0x9000, 32, 10, kOpenSeq), MemoryKind::kTensor, 0),   // after its free
  };
  rec.tags = {tag(4, 0x1100, Category::kWeight)};  // the block allocated last at that address
  rec.sortBySeq();
  auto cats = categorize(rec);
  EXPECT_EQ(cats[2].segment, 0);
  EXPECT_EQ(cats[3].segment, 1);
  EXPECT_EQ(cats[3].category, Category::kWeight);
  EXPECT_EQ(cats[4].segment, -1);  // counts as itself
  EXPECT_EQ(cats[6].segment, 5);   // whatever holds a tensor is a segment
  EXPECT_EQ(cats[7].segment, -1);
  EXPECT_EQ(cats[0].category, Category::kAllocatorSlack);
  EXPECT_EQ(cats[0].rule, CategoryRule::kAllocatorSegment);
  EXPECT_EQ(cats[1].rule, CategoryRule::kAllocatorSegment);
  EXPECT_EQ(cats[5].rule, CategoryRule::kAllocatorSegment);
}

TEST(CategorizeTest, DeviceMemoryWithoutTensorsIsWorkspaceWhereTensorsAreSeen) {
  Recording rec;
  rec.phases = {phase(Phase::kForward, 1, 10)};
  rec.blocks = {
      onDevice(block(0x1000, 1024, 2, kOpenSeq), MemoryKind::kDevice, 0),  // segment
      onDevice(block(0x1000, 512, 3, kOpenSeq), MemoryKind::kTensor, 0),
      onDevice(block(0x8000, 64, 4, 5), MemoryKind::kDevice, 0),  // workspace, in one phase
      onDevice(block(0x8000, 64, 6, 7), MemoryKind::kDevice, 1),  // no tensors on device 1
      block(0x8000, 64, 8, 9),                                    // host memory: as ever
  };
  rec.sortBySeq();
  auto cats = categorize(rec);
  EXPECT_EQ(cats[2].category, Category::kWorkspace);
  EXPECT_EQ(cats[2].rule, CategoryRule::kOutsideFramework);
  EXPECT_EQ(cats[3].category, Category::kTemporary);
  EXPECT_EQ(cats[4].category, Category::kTemporary);
}

}  // namespace
}  // namespace tidemark::core
