#include "agent/recorder/seq_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace tidemark::agent {
namespace {

Record at(uint64_t seq, uint64_t tag) {
  Record r{};
  r.kind = RecordKind::kAlloc;
  r.seq = seq;
  r.address = tag;
  return r;
}

// As a drain yields them: ring after ring, each in increasing seq.
std::vector<Record> drained(const std::vector<uint64_t>& seqs, int rings, std::mt19937_64& rng) {
  std::vector<std::vector<Record>> perRing(static_cast<size_t>(rings));
  for (uint64_t s : seqs) perRing[rng() % perRing.size()].push_back(at(s, s * 7));
  std::vector<Record> out;
  for (auto& ring : perRing) out.insert(out.end(), ring.begin(), ring.end());
  return out;
}

void expectOrdered(const std::vector<Record>& records, std::vector<uint64_t> seqs) {
  std::sort(seqs.begin(), seqs.end());
  ASSERT_EQ(records.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(records[i].seq, seqs[i]) << i;
    ASSERT_EQ(records[i].address, seqs[i] * 7) << "the record moved whole";
  }
}

TEST(SeqOrderTest, DenseSparseAndEmptyDrainsComeOutInSeqOrder) {
  std::mt19937_64 rng(3);
  std::vector<Record> scratch;
  std::vector<uint64_t> dense;
  for (uint64_t s = 1000; s < 101000; ++s) {
    if (rng() % 10 != 0) dense.push_back(s);  // a tenth still in rings not drained yet
  }
  std::vector<uint64_t> sparse;
  for (int i = 0; i < 5000; ++i) sparse.push_back(1 + (rng() >> 20));
  std::sort(sparse.begin(), sparse.end());
  sparse.erase(std::unique(sparse.begin(), sparse.end()), sparse.end());
  for (const auto& seqs : {dense, sparse, std::vector<uint64_t>{42}, std::vector<uint64_t>{}}) {
    std::vector<Record> records = drained(seqs, 9, rng);
    orderBySeq(records, scratch);
    expectOrdered(records, seqs);
  }
}

TEST(SeqOrderTest, ARepeatedSeqLosesNoRecord) {
  std::vector<Record> records = {at(5, 1), at(3, 2), at(5, 3), at(4, 4)};
  std::vector<Record> scratch;
  orderBySeq(records, scratch);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].seq, 3u);
  EXPECT_EQ(records[1].seq, 4u);
  EXPECT_EQ(records[2].address, 1u);  // both kept, in the order they came
  EXPECT_EQ(records[3].address, 3u);
}

}  // namespace
}  // namespace tidemark::agent
