// The agent's buffer (agent/transport/record_log.h): records in memory up to a cap, then in an
// unnamed file, taken oldest first; and, for a handed-off exit, shown where they lie (visit) and
// then forgotten (discard) without being copied out.
#include "agent/transport/record_log.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

namespace tidemark::agent {
namespace {

class RecordLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tidemark-log-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    m_dir = dir;
  }
  void TearDown() override { std::filesystem::remove_all(m_dir); }

  static std::vector<Record> records(uint64_t from, uint64_t n) {
    std::vector<Record> out(n);
    for (uint64_t i = 0; i < n; ++i) {
      out[i].kind = RecordKind::kAlloc;
      out[i].seq = from + i;
      out[i].address = 0x1000 * (from + i);
    }
    return out;
  }
  static std::vector<uint64_t> seqsOf(const std::vector<Record>& rs) {
    std::vector<uint64_t> out;
    for (const Record& r : rs) out.push_back(r.seq);
    return out;
  }
  static std::vector<uint64_t> range(uint64_t from, uint64_t to) {
    std::vector<uint64_t> out;
    for (uint64_t s = from; s <= to; ++s) out.push_back(s);
    return out;
  }
  std::string m_dir;
};

// 30,000 records in a buffer that holds 20,000 in memory: the rest in its file. visit shows
// every one in order without taking any; discard forgets the oldest (across memory and file);
// take then gets exactly the others.
TEST_F(RecordLogTest, VisitShowsEverythingInOrderAndDiscardForgetsTheOldest) {
  RecordLog log(20000 * sizeof(Record), m_dir, 1u << 30);
  const std::vector<Record> in = records(1, 30000);
  ASSERT_EQ(log.append(in.data(), 12000), 12000u);
  ASSERT_EQ(log.append(in.data() + 12000, 18000), 18000u);
  EXPECT_EQ(log.spilledTotal(), 10000u);
  std::vector<Record> taken;
  ASSERT_EQ(log.take(taken, 5), 5u);  // a chunk begun: visit starts inside it

  std::vector<Record> seen;
  size_t runs = 0;
  ASSERT_TRUE(log.visit([&](const Record* r, size_t n) {
    seen.insert(seen.end(), r, r + n);
    ++runs;
    return true;
  }));
  EXPECT_EQ(seqsOf(seen), range(6, 30000));
  EXPECT_GE(runs, 3u);            // memory chunks, then pieces of the file
  EXPECT_EQ(log.size(), 29995u);  // nothing taken by looking

  // Stopping early: fn's false is visit's.
  size_t calls = 0;
  EXPECT_FALSE(log.visit([&](const Record*, size_t) { return ++calls < 2; }));
  EXPECT_EQ(calls, 2u);

  log.discard(25000);  // all of memory and part of the file
  EXPECT_EQ(log.size(), 4995u);
  taken.clear();
  while (log.take(taken, 4096) > 0) {
  }
  EXPECT_EQ(seqsOf(taken), range(25006, 30000));
  EXPECT_TRUE(log.empty());

  // Emptied, memory is used again (the file started over).
  ASSERT_EQ(log.append(in.data(), 10), 10u);
  EXPECT_EQ(log.spilledTotal(), 10000u);
  log.discard(100);  // more than it holds: everything
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace tidemark::agent
