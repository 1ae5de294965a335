// The agent's buffer (agent/transport/record_log.h): records in memory up to a cap, then in an
// unnamed file, taken oldest first; and, for a handed-off exit, shown where they lie (visit) and
// then forgotten (discard) without being copied out. Past both caps, records are refused and
// counted (lossy) or kept in memory after the file's (lossless: full() tells the collector to
// hold back), also when the file cannot be written.
#include "agent/transport/record_log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
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
  // The body of AFileThatCannotGrowCountsForNothing, in its child: true if all went as said.
  static bool fileThatCannotGrow(const std::string& dir) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100 * sizeof(Record), 100 * sizeof(Record)};
    setrlimit(RLIMIT_FSIZE, &limit);
    RecordLog log(1000 * sizeof(Record), dir, 1000000 * sizeof(Record));
    const std::vector<Record> in = records(1, 3000);
    bool ok = log.append(in.data(), 1050) == 1050 && !log.full();  // 50 in the file
    // Past the limit: the write fails whole (a part written is not counted as kept).
    ok = ok && log.append(in.data() + 1050, 500, RecordLog::Overflow::kRefuse) == 0;
    ok = ok && log.full() && log.refused() == 500;
    ok = ok && log.append(in.data() + 1550, 1450, RecordLog::Overflow::kKeep) == 1450;
    std::vector<Record> out;
    while (log.take(out, 333) > 0) {
    }
    std::vector<uint64_t> want = range(1, 1050);
    const std::vector<uint64_t> after = range(1551, 3000);
    want.insert(want.end(), after.begin(), after.end());
    ok = ok && seqsOf(out) == want && !log.full();
    return ok;
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

// 1,000 in memory and 1,000 in the file: full at 2,000. Refused past it (counted), or kept after
// the file's records: taken, shown and discarded in order all the same.
TEST_F(RecordLogTest, PastBothCapsRecordsAreRefusedAndCountedOrKeptInOrder) {
  RecordLog log(1000 * sizeof(Record), m_dir, 1000 * sizeof(Record));
  const std::vector<Record> in = records(1, 5000);
  EXPECT_EQ(log.append(in.data(), 1500), 1500u);
  EXPECT_FALSE(log.full());
  EXPECT_EQ(log.append(in.data() + 1500, 1000, RecordLog::Overflow::kRefuse), 500u);
  EXPECT_EQ(log.refused(), 500u);
  EXPECT_TRUE(log.full());
  // Lossless: a whole pass kept past the caps, behind the file's records.
  EXPECT_EQ(log.append(in.data() + 2000, 3000, RecordLog::Overflow::kKeep), 3000u);
  EXPECT_EQ(log.refused(), 500u);
  EXPECT_EQ(log.size(), 5000u);
  std::vector<Record> seen;
  ASSERT_TRUE(log.visit([&](const Record* r, size_t n) {
    seen.insert(seen.end(), r, r + n);
    return true;
  }));
  EXPECT_EQ(seqsOf(seen), range(1, 5000));

  // Taken out, room is made, and anyone waiting for it hears so.
  const uint64_t takes = log.takes();
  std::thread taker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<Record> first;
    log.take(first, 1200);  // memory, and the file begun
  });
  const auto began = std::chrono::steady_clock::now();
  log.awaitTake(takes, 60000);
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(30));
  taker.join();
  EXPECT_NE(log.takes(), takes);
  EXPECT_TRUE(log.full());  // 3,800 still held
  log.discard(1000);        // the file's last 800 and 200 of what came after it
  EXPECT_EQ(log.size(), 2800u);
  EXPECT_TRUE(log.full());
  std::vector<Record> rest;
  log.take(rest, 801);  // below both caps again
  EXPECT_FALSE(log.full());
  while (log.take(rest, 700) > 0) {
  }
  EXPECT_EQ(seqsOf(rest), range(2201, 5000));
  EXPECT_TRUE(log.empty());
  // wake() ends a wait too.
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log.wake();
  });
  const auto woken = std::chrono::steady_clock::now();
  log.awaitTake(log.takes(), 60000);
  EXPECT_LT(std::chrono::steady_clock::now() - woken, std::chrono::seconds(30));
  waker.join();
}

// A file that cannot grow (a file size limit on the job; SIGXFSZ ignored, as the agent's threads
// block it): the buffer is full at its memory cap once a write failed, and what comes past it is
// kept in memory, after the file's records. (In a child process: the limit is the process's.)
TEST_F(RecordLogTest, AFileThatCannotGrowCountsForNothing) {
  EXPECT_EXIT(std::exit(fileThatCannotGrow(m_dir) ? 0 : 1), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tidemark::agent
