#include "server/ingest/session_ingest.h"

#include <gtest/gtest.h>

namespace tidemark::server {
namespace {

v1::Event alloc(uint64_t seq, uint64_t addr, uint64_t size) {
  v1::Event e;
  e.set_seq(seq);
  e.set_ts_ns(static_cast<int64_t>(seq) * 10);
  e.set_thread_id(1);
  e.mutable_alloc()->set_address(addr);
  e.mutable_alloc()->set_size_bytes(size);
  return e;
}

v1::Event freeOf(uint64_t seq, uint64_t addr) {
  v1::Event e;
  e.set_seq(seq);
  e.set_ts_ns(static_cast<int64_t>(seq) * 10);
  e.set_thread_id(1);
  e.mutable_free()->set_address(addr);
  return e;
}

v1::EventBatch batch(uint64_t batchSeq, std::vector<v1::Event> events) {
  v1::EventBatch b;
  b.set_batch_seq(batchSeq);
  for (auto& e : events) *b.add_events() = e;
  return b;
}

int64_t stat(const SessionIngest& in, const std::string& name) {
  for (const StatRow& s : in.stats()) {
    if (s.name == name) return s.value;
  }
  return 0;
}

TEST(SessionIngestTest, SizesPastTheLimitAreRefusedAndLeaveNothingHalfApplied) {
  SessionIngest in(1);
  ASSERT_TRUE(in.addBatch(batch(1, {alloc(1, 0x40, SessionIngest::kMaxSizeBytes)})).ok());
  const absl::Status s = in.addBatch(batch(2, {alloc(2, 0x80, 16), alloc(3, 0xc0, ~0ull)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("over the limit"), std::string_view::npos);
  v1::Event tag;
  tag.set_seq(2);
  tag.mutable_tag()->set_address(0x40);
  tag.mutable_tag()->set_size_bytes(SessionIngest::kMaxSizeBytes + 1);
  EXPECT_EQ(in.addBatch(batch(2, {tag})).code(), absl::StatusCode::kInvalidArgument);
  // The refused batches left nothing: batch 2 is still the next, and only block 1 is live.
  ASSERT_TRUE(in.addBatch(batch(2, {freeOf(2, 0x40)})).ok());
  SessionRows rows = in.takeRows();
  ASSERT_EQ(rows.blocks.size(), 1u);
  EXPECT_EQ(rows.blocks[0].sizeBytes, SessionIngest::kMaxSizeBytes);
  EXPECT_TRUE(in.finish().blocks.empty());
}

TEST(SessionIngestTest, OutOfOrderBatchesArePairedInSequenceOrder) {
  SessionIngest in(1);
  // The free (seq 2) and the address's reuse (seq 3) arrive before the first alloc (seq 1).
  ASSERT_TRUE(in.addBatch(batch(1, {freeOf(2, 0x40), alloc(3, 0x40, 32)})).ok());
  EXPECT_TRUE(in.takeRows().blocks.empty());
  ASSERT_TRUE(in.addBatch(batch(2, {alloc(1, 0x40, 16)})).ok());
  SessionRows rows = in.takeRows();
  ASSERT_EQ(rows.blocks.size(), 1u);
  EXPECT_EQ(rows.blocks[0].sizeBytes, 16u);
  EXPECT_EQ(rows.blocks[0].allocSeq, 1u);
  EXPECT_EQ(rows.blocks[0].freeSeq, 2u);
  SessionRows last = in.finish();
  ASSERT_EQ(last.blocks.size(), 1u);
  EXPECT_EQ(last.blocks[0].sizeBytes, 32u);
  EXPECT_EQ(last.blocks[0].freeSeq, core::kOpenSeq);
  EXPECT_EQ(in.liveBlocksAtEnd(), 1);
  EXPECT_EQ(rows.eventsStored + last.eventsStored, 3);
  EXPECT_EQ(stat(in, "free_of_untracked"), 0);
}

TEST(SessionIngestTest, FreeOfABlockFromBeforeRecordingIsCountedNotAnError) {
  SessionIngest in(1);
  ASSERT_TRUE(in.addBatch(batch(1, {freeOf(1, 0x80), alloc(2, 0x40, 8)})).ok());
  in.finish();
  EXPECT_EQ(stat(in, "free_of_untracked"), 1);
}

TEST(SessionIngestTest, GapsAreCountedAtTheEnd) {
  SessionIngest in(1);
  ASSERT_TRUE(in.addBatch(batch(1, {alloc(1, 0x40, 8), alloc(4, 0x80, 8)})).ok());
  SessionRows rows = in.finish();
  EXPECT_EQ(rows.blocks.size(), 2u);
  EXPECT_EQ(stat(in, "seq_gap"), 2);
}

TEST(SessionIngestTest, MalformedBatchesAreRefusedWhole) {
  SessionIngest in(1);
  EXPECT_EQ(in.addBatch(batch(2, {alloc(1, 0x40, 8)})).code(), absl::StatusCode::kInvalidArgument);
  v1::EventBatch noPayload = batch(1, {alloc(1, 0x40, 8)});
  noPayload.add_events()->set_seq(2);
  EXPECT_EQ(in.addBatch(noPayload).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in.addBatch(batch(1, {alloc(0, 0x40, 8)})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in.addBatch(batch(1, {alloc(1, 0x40, 8), alloc(1, 0x80, 8)})).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing of the refused batches was kept: the next good batch is still number 1.
  ASSERT_TRUE(in.addBatch(batch(1, {alloc(1, 0x40, 8)})).ok());
  EXPECT_EQ(in.addBatch(batch(2, {alloc(1, 0x80, 8)})).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SessionIngestTest, ScopesPhasesAndStepsBecomeIntervals) {
  SessionIngest in(1);
  std::vector<v1::Event> ev(8);
  for (int i = 0; i < 8; ++i) {
    ev[i].set_seq(i + 1);
    ev[i].set_thread_id(7);
  }
  ev[0].mutable_step_begin()->set_step(1);
  ev[1].mutable_phase_begin()->set_phase(v1::PHASE_FORWARD);
  ev[2].mutable_scope_begin()->set_name_iid(1);
  ev[3].mutable_scope_begin()->set_name_iid(2);
  ev[4].mutable_scope_end()->set_name_iid(1);  // closes 2 as well
  ev[5].mutable_phase_end()->set_phase(v1::PHASE_FORWARD);
  ev[6].mutable_scope_end()->set_name_iid(9);  // never opened
  ev[7].mutable_step_end()->set_step(1);
  ASSERT_TRUE(in.addBatch(batch(1, ev)).ok());
  SessionRows rows = in.finish();
  ASSERT_EQ(rows.scopes.size(), 2u);
  EXPECT_EQ(rows.scopes[0].nameIid, 2u);
  EXPECT_EQ(rows.scopes[0].depth, 1);
  EXPECT_EQ(rows.scopes[1].nameIid, 1u);
  EXPECT_EQ(rows.scopes[1].endSeq, 5u);
  ASSERT_EQ(rows.phases.size(), 1u);
  EXPECT_EQ(rows.phases[0].beginSeq, 2u);
  EXPECT_EQ(rows.phases[0].endSeq, 6u);
  ASSERT_EQ(rows.steps.size(), 1u);
  EXPECT_EQ(rows.steps[0].endSeq, 8u);
  EXPECT_EQ(stat(in, "scope_end_unmatched"), 1);
}

}  // namespace
}  // namespace tidemark::server
