#include "agent/recorder/block_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

namespace tidemark::agent {
namespace {

TEST(BlockTableTest, InsertLookupErase) {
  BlockTable t;
  ASSERT_TRUE(t.init(64));
  EXPECT_TRUE(t.insert(0x1000, 64));
  uint64_t size = 0;
  EXPECT_TRUE(t.lookup(0x1000, &size));
  EXPECT_EQ(size, 64u);
  EXPECT_FALSE(t.lookup(0x2000, &size));
  EXPECT_TRUE(t.erase(0x1000, &size));
  EXPECT_EQ(size, 64u);
  EXPECT_FALSE(t.erase(0x1000, &size));  // a second free of the same block is not ours
  EXPECT_FALSE(t.insert(0, 1));          // 0 is never a key
}

TEST(BlockTableTest, ReinsertOfAStaleAddressKeepsOneEntry) {
  BlockTable t;
  ASSERT_TRUE(t.init(64));
  EXPECT_TRUE(t.insert(0x1000, 64));
  EXPECT_TRUE(t.insert(0x1000, 128));  // its free was never seen
  uint64_t size = 0;
  EXPECT_TRUE(t.erase(0x1000, &size));
  EXPECT_EQ(size, 128u);
  EXPECT_FALSE(t.lookup(0x1000, &size));
}

TEST(BlockTableTest, ReportsFullInsteadOfGrowing) {
  BlockTable t;
  ASSERT_TRUE(t.init(1));  // one bucket: 8 slots
  int inserted = 0;
  for (uint64_t a = 1; a <= 100; ++a) inserted += t.insert(a * 64, 1) ? 1 : 0;
  EXPECT_EQ(inserted, static_cast<int>(t.capacity()));
  EXPECT_EQ(t.capacity(), 8u);
}

TEST(BlockTableTest, HoldsBlocksUpToSeventyPercentOfItsSlots) {
  // Addresses as an allocator hands out a burst of small blocks: 64-aligned, close together.
  BlockTable t;
  ASSERT_TRUE(t.init(1 << 14));              // 131,072 slots
  const uint64_t n = t.capacity() * 7 / 10;  // first fit failed 533 of these
  uint64_t failed = 0;
  for (uint64_t i = 0; i < n; ++i) failed += t.insert(0x7f0000000000ull + i * 576, 1) ? 0 : 1;
  EXPECT_EQ(failed, 0u);
  for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(t.lookup(0x7f0000000000ull + i * 576, nullptr));
}

TEST(BlockTableTest, HoldsRandomAndArenaLikeAddressesUpToSeventyPercent) {
  // Addresses with no locality at all, and eight 64 MiB-aligned regions laid out alike (malloc's
  // per-thread arenas serving the same burst): neither may crowd the home buckets into failing.
  std::mt19937_64 random(7);
  for (int layout = 0; layout < 2; ++layout) {
    BlockTable t;
    ASSERT_TRUE(t.init(1 << 14));
    const uint64_t n = t.capacity() * 7 / 10;
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < n; ++i) {
      keys.push_back(layout == 0 ? (random() & 0x7ffffffffff0ull) | 0x10
                                 : 0x7f0000000000ull + (i % 8) * (64ull << 20) + (i / 8) * 96);
    }
    uint64_t failed = 0;
    for (uint64_t k : keys) failed += t.insert(k, k) ? 0 : 1;
    EXPECT_EQ(failed, 0u) << "layout " << layout;
    for (uint64_t k : keys) {
      uint64_t size = 0;
      ASSERT_TRUE(t.erase(k, &size));
      ASSERT_EQ(size, k);
    }
    // Everything erased: no slot and no spill count is left behind, so the table fills again.
    for (uint64_t k : keys) failed += t.insert(k + 16, 1) ? 0 : 1;
    EXPECT_EQ(failed, 0u) << "layout " << layout << ", refilled";
    for (uint64_t k : keys) ASSERT_FALSE(t.lookup(k, nullptr));
  }
}

TEST(BlockTableTest, ConcurrentThreadsNeverLoseOrDuplicateBlocks) {
  BlockTable t;
  ASSERT_TRUE(t.init(1 << 12));
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 20000;
  std::atomic<uint64_t> erased{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (uint64_t i = 0; i < kPerThread; ++i) {
        const uint64_t addr = (static_cast<uint64_t>(th) << 40) | ((i % 512 + 1) << 6);
        ASSERT_TRUE(t.insert(addr, i));
        uint64_t size = 0;
        ASSERT_TRUE(t.erase(addr, &size));
        ASSERT_EQ(size, i);
        erased.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(erased.load(), kThreads * kPerThread);
}

}  // namespace
}  // namespace tidemark::agent
