#include "server/ingest/session_ingest.h"
#include "server/rpc/kept_live_analyses.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

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

TEST(SessionIngestTest, PendingRowsCountWhatTheyHoldAllocatedAndTheirStrings) {
  // The ingest reads no more of a stream once its rows pass their share (pendingRowBytes): the
  // count must cover the strings' text and what the vectors allocated, not only their elements.
  SessionIngest in(1);
  v1::EventBatch b = batch(1, {});
  for (uint32_t i = 1; i <= 16; ++i) {
    v1::InternedString* s = b.add_strings();
    s->set_iid(i);
    s->set_value(std::string(60000, 'a'));
  }
  ASSERT_TRUE(in.addBatch(b).ok());
  EXPECT_GE(in.pendingRowBytes(), 16u * 60000u);
  // 1,025 blocks: a vector grown by doubling holds room for 2,048.
  std::vector<v1::Event> events;
  for (uint64_t i = 0; i < 1025; ++i) {
    events.push_back(alloc(2 * i + 1, 0x1000 * (i + 1), 64));
    events.push_back(freeOf(2 * i + 2, 0x1000 * (i + 1)));
  }
  ASSERT_TRUE(in.addBatch(batch(2, events)).ok());
  EXPECT_GE(in.pendingRowBytes(), 16u * 60000u + 2048u * sizeof(BlockRow));
  // Taken: nothing held any more.
  SessionRows rows = in.takeRows();
  EXPECT_EQ(rows.blocks.size(), 1025u);
  EXPECT_EQ(rows.strings.size(), 16u);
  EXPECT_LT(in.pendingRowBytes(), 4096u);
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

// A session of blocks, nested scopes, phases and steps over several threads and batches, with
// a batch that arrives out of order.
std::vector<v1::EventBatch> mixedSession() {
  std::vector<v1::Event> ev;
  uint64_t seq = 0;
  auto next = [&](uint32_t thread) -> v1::Event& {
    ev.emplace_back();
    ev.back().set_seq(++seq);
    ev.back().set_ts_ns(static_cast<int64_t>(seq) * 10);
    ev.back().set_thread_id(thread);
    return ev.back();
  };
  for (int step = 1; step <= 3; ++step) {
    next(1).mutable_step_begin()->set_step(step);
    // An address reused step after step (freed, allocated again), and one allocated again
    // without its free (alloc_over_live): the open blocks change at the same key.
    if (step > 1) next(1).mutable_free()->set_address(0x9000);
    for (uint64_t address : {0x9000u, 0x7000u}) {
      v1::Event& a = next(1);
      a.mutable_alloc()->set_address(address);
      a.mutable_alloc()->set_size_bytes(static_cast<uint64_t>(step) * 8);
    }
    next(1).mutable_phase_begin()->set_phase(v1::PHASE_FORWARD);
    for (uint32_t m = 1; m <= 3; ++m) {
      next(1).mutable_scope_begin()->set_name_iid(m);
      v1::Event& a = next(m % 2 + 1);
      a.mutable_alloc()->set_address(0x1000 * m + static_cast<uint64_t>(step));
      a.mutable_alloc()->set_size_bytes(64 * m);
    }
    for (uint32_t m = 3; m >= 1; --m) next(1).mutable_scope_end()->set_name_iid(m);
    next(1).mutable_phase_end()->set_phase(v1::PHASE_FORWARD);
    for (uint32_t m = 1; m <= 2; ++m) {
      next(m % 2 + 1).mutable_free()->set_address(0x1000 * m + static_cast<uint64_t>(step));
    }
    next(1).mutable_step_end()->set_step(step);
  }
  std::vector<v1::EventBatch> batches;
  for (size_t i = 0; i < ev.size(); i += 5) {
    std::vector<v1::Event> part(ev.begin() + static_cast<long>(i),
                                ev.begin() + static_cast<long>(std::min(ev.size(), i + 5)));
    batches.push_back(batch(batches.size() + 1, part));
  }
  // Two batches' events swapped (the batch numbers stay in order): the reorder buffer holds
  // events across a batch boundary.
  std::swap(*batches[3].mutable_events(), *batches[4].mutable_events());
  return batches;
}

void appendRows(SessionRows& to, SessionRows from) {
  to.blocks.insert(to.blocks.end(), from.blocks.begin(), from.blocks.end());
  to.scopes.insert(to.scopes.end(), from.scopes.begin(), from.scopes.end());
  to.phases.insert(to.phases.end(), from.phases.begin(), from.phases.end());
  to.steps.insert(to.steps.end(), from.steps.begin(), from.steps.end());
  to.eventsReceived += from.eventsReceived;
  to.eventsStored += from.eventsStored;
}

std::string describe(const SessionRows& r) {
  std::string out;
  for (const BlockRow& b : r.blocks) {
    out += "block " + std::to_string(b.address) + " " + std::to_string(b.sizeBytes) + " " +
           std::to_string(b.threadId) + " " + std::to_string(b.allocSeq) + " " +
           std::to_string(b.freeSeq) + "\n";
  }
  for (const auto* list : {&r.scopes, &r.phases}) {
    for (const IntervalRow& i : *list) {
      out += "interval " + std::to_string(i.threadId) + " " + std::to_string(i.nameIid) + " " +
             std::to_string(i.phase) + " " + std::to_string(i.depth) + " " +
             std::to_string(i.beginSeq) + " " + std::to_string(i.endSeq) + "\n";
    }
  }
  for (const StepRow& s : r.steps) {
    out += "step " + std::to_string(s.step) + " " + std::to_string(s.beginSeq) + " " +
           std::to_string(s.endSeq) + "\n";
  }
  out += "events " + std::to_string(r.eventsReceived) + " " + std::to_string(r.eventsStored);
  return out;
}

TEST(SessionIngestTest, ACheckpointContinuesTheSessionAsIfNothingHappened) {
  const std::vector<v1::EventBatch> batches = mixedSession();
  SessionIngest whole(1);
  for (const auto& b : batches) ASSERT_TRUE(whole.addBatch(b).ok());
  const SessionRows expected = whole.finish();
  ASSERT_GT(expected.blocks.size(), 3u);

  // Cut after every batch in turn. Before the cut a checkpoint follows every batch, applied to
  // a stand-in for the store (the state replaced, the open blocks changed); at the cut the
  // state goes through its serialized form into a new ingest with the stored open blocks (what
  // a restarted daemon does), which takes the rest; the batch before the cut is resent too
  // (skipped, counted).
  for (size_t cut = 1; cut < batches.size(); ++cut) {
    SessionIngest first(1);
    SessionRows rows;
    std::string state;
    std::map<std::tuple<int, int32_t, uint64_t>, BlockRow> stored;
    for (size_t i = 0; i < cut; ++i) {
      ASSERT_TRUE(first.addBatch(batches[i]).ok());
      appendRows(rows, first.takeRows());
      // Full lists now and then, changes between them.
      SessionIngest::Checkpoint c = first.takeCheckpoint(i % 3 == 0);
      state = c.state.SerializeAsString();
      if (c.full) stored.clear();
      for (const BlockRow& b : c.closed) stored.erase({b.memoryKind, b.device, b.address});
      for (const BlockRow& b : c.opened) stored[{b.memoryKind, b.device, b.address}] = b;
    }
    v1::IngestCheckpoint parsed;
    ASSERT_TRUE(parsed.ParseFromString(state));
    std::vector<BlockRow> open;
    for (const auto& [key, b] : stored) open.push_back(b);
    SessionIngest resumed(1);
    ASSERT_TRUE(resumed.restore(parsed, open).ok());
    EXPECT_EQ(resumed.nextBatchSeq(), cut + 1);
    ASSERT_TRUE(resumed.addBatch(batches[cut - 1]).ok());  // a resent batch
    for (size_t i = cut; i < batches.size(); ++i) ASSERT_TRUE(resumed.addBatch(batches[i]).ok());
    appendRows(rows, resumed.finish());
    EXPECT_EQ(describe(rows), describe(expected)) << "cut after batch " << cut;
    EXPECT_EQ(stat(resumed, "batches_resent"), 1);
    EXPECT_EQ(resumed.liveBlocksAtEnd(), whole.liveBlocksAtEnd());
  }
}

// What the live analysis hands the store with the rows, and its answer at the end.
std::string describeLive(const std::vector<SessionRows>& taken,
                         const std::optional<core::LiveAnalysis::Final>& final) {
  std::string out;
  for (const SessionRows& r : taken) {
    for (const core::TimelineChunk& c : r.timelineChunks) {
      out += "chunk " + std::to_string(c.level) + " " + std::to_string(c.index);
      for (const core::TimelineSample& t : c.samples)
        out += " " + std::to_string(t.lastSeq) + ":" + std::to_string(t.max[0]);
      out += "\n";
    }
    for (const auto& [chunk, codes] : r.blockCodes)
      out += "codes " + std::to_string(chunk) + " " + codes + "\n";
  }
  if (!final) return out + "no final";
  out += "final " + std::to_string(final->exact) + " " + final->why + "\n";
  for (const core::PeakReport& p : final->peaks) {
    out += "peak " + std::to_string(p.step) + " " + std::to_string(p.state.seq) + " " +
           std::to_string(p.state.trackedBytes);
    for (int64_t b : p.state.bytes) out += " " + std::to_string(b);
    out += " " + p.phase + " " + p.scope + "\n";
  }
  return out;
}

// A live analysis kept from a broken stream is taken on by the ingest that resumes the session
// when the checkpoint stands where it does: the session ends with what an uninterrupted one
// hands the store and answers. One kept at another cut (a later commit failed, another daemon
// of a shared store went on) is not: the session continues without one.
TEST(SessionIngestTest, AKeptLiveAnalysisIsTakenOnAtItsOwnCutOnly) {
  const std::vector<v1::EventBatch> batches = mixedSession();
  SessionIngest whole(1);
  std::vector<SessionRows> wholeRows;
  for (const auto& b : batches) {
    ASSERT_TRUE(whole.addBatch(b).ok());
    wholeRows.push_back(whole.takeRows());
  }
  wholeRows.push_back(whole.finish());
  const std::string expected = describeLive(wholeRows, whole.takeLiveFinal());
  ASSERT_NE(expected.find("final"), std::string::npos);
  ASSERT_NE(expected.find("chunk"), std::string::npos);

  for (size_t cut = 2; cut < batches.size(); ++cut) {
    SessionIngest first(1);
    std::vector<SessionRows> taken;
    std::vector<BlockRow> open, openBefore;
    std::string state, stateBefore;
    for (size_t i = 0; i < cut; ++i) {
      ASSERT_TRUE(first.addBatch(batches[i]).ok());
      taken.push_back(first.takeRows());
      SessionIngest::Checkpoint c = first.takeCheckpoint(true);
      stateBefore = std::exchange(state, c.state.SerializeAsString());
      openBefore = std::exchange(open, c.opened);
    }
    SessionIngest::KeptLive kept = first.keepLive();
    EXPECT_EQ(first.live(), nullptr);
    v1::IngestCheckpoint parsed;
    ASSERT_TRUE(parsed.ParseFromString(state));
    SessionIngest resumed(1);
    ASSERT_TRUE(resumed.restore(parsed, open, std::move(kept)).ok());
    ASSERT_NE(resumed.live(), nullptr) << "cut after batch " << cut;
    for (size_t i = cut; i < batches.size(); ++i) {
      ASSERT_TRUE(resumed.addBatch(batches[i]).ok());
      taken.push_back(resumed.takeRows());
    }
    taken.push_back(resumed.finish());
    EXPECT_EQ(describeLive(taken, resumed.takeLiveFinal()), expected) << "cut after batch " << cut;

    // The checkpoint before: the kept analysis is one batch ahead of it.
    SessionIngest again(1);
    for (size_t i = 0; i < cut; ++i) ASSERT_TRUE(again.addBatch(batches[i]).ok());
    ASSERT_TRUE(parsed.ParseFromString(stateBefore));
    SessionIngest behind(1);
    ASSERT_TRUE(behind.restore(parsed, openBefore, again.keepLive()).ok());
    EXPECT_EQ(behind.live(), nullptr) << "cut after batch " << cut;
  }
}

// Kept analyses are bounded in bytes: past the bound the oldest goes (its session continues
// without one); one larger than the bound is not kept at all.
TEST(SessionIngestTest, KeptLiveAnalysesStayWithinTheirBound) {
  auto keptWith = [](int blocks) {
    SessionIngest in(1);
    std::vector<v1::Event> events;
    for (int i = 0; i < blocks; ++i)
      events.push_back(alloc(static_cast<uint64_t>(i) + 1, 0x1000 * (i + 1), 8));
    EXPECT_TRUE(in.addBatch(batch(1, events)).ok());
    return in.keepLive();
  };
  const size_t one = keptWith(100).analysis->heldBytes();
  ASSERT_GE(one, 100 * core::LiveAnalysis::kBytesPerWindowEdge);
  KeptLiveAnalyses kept(2 * one + one / 2);
  kept.keep(1, keptWith(100));
  kept.keep(2, keptWith(100));
  EXPECT_EQ(kept.count(), 2u);
  kept.keep(3, keptWith(100));  // session 1's goes
  EXPECT_EQ(kept.count(), 2u);
  EXPECT_LE(kept.heldBytes(), 2 * one + one / 2);
  EXPECT_EQ(kept.take(1).analysis, nullptr);
  EXPECT_NE(kept.take(2).analysis, nullptr);
  EXPECT_EQ(kept.take(2).analysis, nullptr);  // taken once
  kept.keep(4, keptWith(1000));               // past the bound alone
  EXPECT_EQ(kept.take(4).analysis, nullptr);
  kept.drop(3);
  EXPECT_EQ(kept.count(), 0u);
  EXPECT_EQ(kept.heldBytes(), 0u);
}

TEST(SessionIngestTest, AnEventTheReorderBufferGaveUpOnIsLateNotADuplicate) {
  // Event 1 is missing (a lossy agent dropped... or delayed it): the reorder buffer waits until
  // it is full, then releases past the hole.
  SessionIngest in(1);
  std::vector<v1::Event> events;
  const uint64_t n = SessionIngest::kMaxPendingEvents + 1;
  for (uint64_t seq = 2; seq <= n + 1; ++seq) events.push_back(alloc(seq, 0x1000 * seq, 8));
  ASSERT_TRUE(in.addBatch(batch(1, events)).ok());
  EXPECT_EQ(stat(in, "reorder_overflow"), 1);
  EXPECT_EQ(stat(in, "seq_gap"), 1);
  // It comes after all: released late, no longer lost.
  ASSERT_TRUE(in.addBatch(batch(2, {alloc(1, 0x10, 8)})).ok());
  EXPECT_EQ(stat(in, "released_late"), 1);
  EXPECT_EQ(stat(in, "seq_gap"), 0);
  // A number that was released already is a duplicate: refused.
  EXPECT_EQ(in.addBatch(batch(3, {alloc(1, 0x20, 8)})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in.addBatch(batch(3, {alloc(2, 0x20, 8)})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in.finish().blocks.size(), n + 1);
}

TEST(SessionIngestTest, ADamagedCheckpointIsRefused) {
  SessionIngest in(1);
  EXPECT_EQ(in.restore(v1::IngestCheckpoint(), {}).code(), absl::StatusCode::kDataLoss);
}

v1::Event summarized(uint64_t seq, uint64_t last, bool unused = false) {
  v1::Event e;
  e.set_seq(seq);
  e.set_ts_ns(static_cast<int64_t>(seq) * 10);
  e.mutable_summarized()->set_last_seq(last);
  e.mutable_summarized()->set_unused(unused);
  return e;
}

// A capture schedule's Summarized ranges stand for the sequence numbers they cover: nothing is
// waited for or counted lost there, in order or not; unused numbers are not events; an event
// inside a range said summarized is counted, and a range that is not one is refused.
TEST(SessionIngestTest, SummarizedRangesCoverTheirNumbers) {
  SessionIngest in(1);
  ASSERT_TRUE(in.addBatch(batch(1, {alloc(1, 0x10, 8), summarized(2, 9)})).ok());
  // Out of order: the range 12..19 comes after what follows it.
  ASSERT_TRUE(in.addBatch(batch(2, {freeOf(20, 0x10), summarized(10, 11, true)})).ok());
  ASSERT_TRUE(in.addBatch(batch(3, {summarized(12, 19)})).ok());
  SessionRows rows = in.takeRows();
  ASSERT_EQ(rows.blocks.size(), 1u);  // the free at 20 was released: nothing is waited for
  EXPECT_EQ(rows.blocks[0].freeSeq, 20u);
  EXPECT_EQ(stat(in, "events_summarized"), 8 + 8);  // 2..9 and 12..19, not the unused 10..11
  // An event the agent said it summarized: counted, released as it comes (in the same batch,
  // or while the range waits); once the range is released, it is a number received twice.
  ASSERT_TRUE(in.addBatch(batch(4, {summarized(21, 30), alloc(22, 0x20, 4)})).ok());
  ASSERT_TRUE(in.addBatch(batch(5, {summarized(32, 40), alloc(35, 0x30, 4)})).ok());
  ASSERT_TRUE(in.addBatch(batch(6, {alloc(31, 0x50, 4)})).ok());
  EXPECT_FALSE(in.addBatch(batch(7, {alloc(36, 0x40, 4)})).ok());
  in.finish();
  EXPECT_EQ(stat(in, "seq_gap"), 0);
  EXPECT_EQ(stat(in, "summarized_overlap"), 2);
  // Ranges that are not ranges.
  SessionIngest bad(2);
  EXPECT_FALSE(bad.addBatch(batch(1, {summarized(5, 4)})).ok());
  EXPECT_FALSE(bad.addBatch(batch(1, {summarized(5, 5 + (1ull << 40))})).ok());
  EXPECT_TRUE(bad.addBatch(batch(1, {summarized(1, 1)})).ok());
}

}  // namespace
}  // namespace tidemark::server
