#include "server/ingest/live_rebuild.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/ingest/session_ingest.h"
#include "server/store/store.h"

namespace tidemark::server {
namespace {

// A training-like session from a seed: two threads, steps with a forward and a backward phase,
// nested module scopes and op scopes, weights tagged once, activations kept to the backward,
// gradients tagged, scratch freed at once, now and then an allocation over a live block (its
// free never seen), in batches of 1 to 40 events.
std::vector<v1::EventBatch> randomSession(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  std::vector<v1::Event> ev;
  uint64_t seq = 0;
  auto next = [&](uint32_t thread) -> v1::Event& {
    ev.emplace_back();
    ev.back().set_seq(++seq);
    ev.back().set_ts_ns(static_cast<int64_t>(seq) * 1000 + pick(500));
    ev.back().set_thread_id(thread);
    return ev.back();
  };
  auto alloc = [&](uint32_t thread, uint64_t address, uint64_t size) {
    v1::Event& e = next(thread);
    e.mutable_alloc()->set_address(address);
    e.mutable_alloc()->set_size_bytes(size);
  };
  auto freeOf = [&](uint32_t thread, uint64_t address) {
    next(thread).mutable_free()->set_address(address);
  };
  auto tag = [&](uint64_t address, uint64_t size, v1::Category c, uint32_t name) {
    v1::Event& e = next(1);
    e.mutable_tag()->set_address(address);
    e.mutable_tag()->set_size_bytes(size);
    e.mutable_tag()->set_category(c);
    e.mutable_tag()->set_name_iid(name);
  };
  auto scope = [&](uint32_t thread, int kind, uint32_t name, bool begin) {
    v1::Event& e = next(thread);
    if (begin) {
      e.mutable_scope_begin()->set_kind(static_cast<v1::ScopeKind>(kind));
      e.mutable_scope_begin()->set_name_iid(name);
    } else {
      e.mutable_scope_end()->set_kind(static_cast<v1::ScopeKind>(kind));
      e.mutable_scope_end()->set_name_iid(name);
    }
  };
  const int blocks = 3 + pick(3);
  for (int w = 0; w < blocks; ++w) {
    alloc(1, 0x100000 + 0x1000 * w, 256 + 64 * pick(8));
    tag(0x100000 + 0x1000 * w, 256, v1::CATEGORY_WEIGHT, 10 + w);
  }
  uint64_t scratch = 0x900000;
  for (int step = 1; step <= 4 + pick(3); ++step) {
    next(1).mutable_step_begin()->set_step(step);
    next(1).mutable_phase_begin()->set_phase(v1::PHASE_FORWARD);
    std::vector<uint64_t> kept;
    for (int b = 0; b < blocks; ++b) {
      scope(1, v1::SCOPE_KIND_MODULE, 1 + b, true);
      scope(1, v1::SCOPE_KIND_OP, 20 + pick(3), true);
      for (int k = 0; k < 1 + pick(3); ++k) {
        const uint32_t thread = 1 + pick(2);
        const uint64_t a = 0x200000 + 0x100 * (step * 64 + b * 8 + k);
        alloc(thread, a, 32 + 16 * pick(16));
        kept.push_back(a);
        if (pick(4) == 0) {
          alloc(thread, ++scratch, 8 + pick(64));
          freeOf(thread, scratch);
        }
      }
      scope(1, v1::SCOPE_KIND_OP, 0, false);  // an end naming no open op: unmatched
      if (pick(3) == 0) {
        scope(1, v1::SCOPE_KIND_MODULE, 1 + b, false);  // the op left open ends with it
      } else {
        scope(1, v1::SCOPE_KIND_MODULE, 1 + b, true);  // a child
        alloc(2, 0x700000 + step * 16 + b, 24);
        freeOf(2, 0x700000 + step * 16 + b);
        scope(1, v1::SCOPE_KIND_MODULE, 1 + b, false);
        scope(1, v1::SCOPE_KIND_MODULE, 1 + b, false);
      }
    }
    next(1).mutable_phase_end()->set_phase(v1::PHASE_FORWARD);
    next(1).mutable_phase_begin()->set_phase(v1::PHASE_BACKWARD);
    for (int b = 0; b < blocks; ++b) {
      const uint64_t g = 0x500000 + 0x1000 * b + step;
      alloc(1, g, 256);
      tag(g, 256, v1::CATEGORY_GRADIENT, 30 + b);
      if (step > 1) freeOf(1, 0x500000 + 0x1000 * b + step - 1);
    }
    while (!kept.empty()) {
      freeOf(1 + pick(2), kept.back());
      kept.pop_back();
    }
    if (pick(3) == 0) alloc(1, 0x100000, 128);  // over a live weight: its free never seen
    next(1).mutable_phase_end()->set_phase(v1::PHASE_BACKWARD);
    next(1).mutable_step_end()->set_step(step);
  }
  std::vector<v1::EventBatch> batches;
  for (size_t i = 0; i < ev.size();) {
    v1::EventBatch b;
    b.set_batch_seq(batches.size() + 1);
    if (batches.empty()) {
      for (uint32_t iid = 1; iid < 40; ++iid) {
        v1::InternedString* s = b.add_strings();
        s->set_iid(iid);
        s->set_value("name" + std::to_string(iid));
      }
    }
    const size_t n = 1 + static_cast<size_t>(pick(40));
    for (size_t k = i; k < std::min(ev.size(), i + n); ++k) *b.add_events() = ev[k];
    i += n;
    batches.push_back(b);
  }
  return batches;
}

// A rebuild's options, quiet, and the checkpoint of a session that has not begun.
LiveRebuild::Options quietOptions(const std::string& db, int64_t session, const std::string& dir) {
  LiveRebuild::Options o;
  o.dbPath = db;
  o.sessionId = session;
  o.tempDir = dir;
  o.quiet = true;
  return o;
}
v1::IngestCheckpoint checkpointAtStart() {
  v1::IngestCheckpoint state;
  state.set_next_seq(1);
  state.set_next_batch_seq(1);
  return state;
}

// An empty directory of this process's own under the temporary one.
std::filesystem::path emptyScratchDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

// A new store at `db` with one session.
struct StoreWithSession {
  std::unique_ptr<Store> store;
  int64_t session = 0;
};
StoreWithSession storeWithSession(const std::string& db) {
  StoreWithSession out;
  auto store = Store::open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return out;
  auto id = (*store)->createSession(SessionHeader{});
  EXPECT_TRUE(id.ok());
  out.store = std::move(*store);
  out.session = id.ok() ? *id : 0;
  return out;
}

// What a live analysis answers: the whole peak with its items, every step, a timeline.
std::string answers(const core::LiveAnalysis& live) {
  std::string out;
  auto state = [&](const core::PeakReport& p) {
    out += std::to_string(p.step) + " " + std::to_string(p.state.seq) + " " +
           std::to_string(p.state.trackedBytes);
    for (int64_t b : p.state.bytes) out += " " + std::to_string(b);
    out += " [" + p.phase + "] [" + p.scope + "]\n";
  };
  const core::PeakReport whole = live.wholePeak();
  state(whole);
  for (const auto* items : {&whole.modules, &whole.ops, &whole.tensors})
    for (const core::PeakItem& it : *items)
      out += "  " + it.name + " " + std::to_string(it.bytes) + " " +
             std::to_string(static_cast<int>(it.category)) + "\n";
  for (const core::LiveAnalysis::StepAnswer& s : live.steps()) {
    out += "step " + std::to_string(s.interval.beginSeq) + "-" + std::to_string(s.interval.endSeq) +
           ": ";
    state(s.peak);
  }
  for (const core::TimelineBucket& b : live.timeline(0, 0, 64)) {
    if (b.empty) continue;
    out += "t " + std::to_string(b.startTsNs);
    for (size_t k = 0; k < b.max.size(); ++k)
      out += " " + std::to_string(b.min[k]) + "/" + std::to_string(b.max[k]);
    out += "\n";
  }
  return out;
}

// Built again from the store at any cut of a session, while the rest of the session is ingested
// and written to the store, then taken on by the ingest, a live analysis answers as the one that
// saw the whole session did: the peak with its modules, ops and tensors, each step's peak, the
// timeline.
TEST(LiveRebuildTest, BuiltAgainAtAnyCutItAnswersAsTheOneThatSawItAll) {
  const std::filesystem::path dir = emptyScratchDir("tidemark-rebuild");
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const std::vector<v1::EventBatch> batches = randomSession(seed);
    SessionIngest whole(1, 1024);
    for (const auto& b : batches) ASSERT_TRUE(whole.addBatch(b).ok());
    ASSERT_NE(whole.live(), nullptr);
    const std::string expected = answers(*whole.live());
    ASSERT_NE(expected.find("step "), std::string::npos);

    for (size_t cut = 1; cut < batches.size(); cut += 1 + batches.size() / 8) {
      std::filesystem::remove_all(dir);
      const std::string db = (dir / "store.db").string();
      StoreWithSession made = storeWithSession(db);
      ASSERT_NE(made.session, 0);
      Store* store = made.store.get();
      const int64_t id = made.session;
      auto commit = [&](SessionIngest& in, uint64_t batch) {
        SessionRows rows = in.takeRows();
        SessionIngest::Checkpoint c = in.takeCheckpoint(true);
        ASSERT_TRUE(store->begin().ok());
        ASSERT_TRUE(store->writeRows(rows).ok());
        ASSERT_TRUE(
            store->saveCheckpoint(id, batch, c.state.SerializeAsString(), true, c.opened, c.closed)
                .ok());
        ASSERT_TRUE(store->commit().ok());
      };
      SessionIngest first(id, 1024);
      for (size_t i = 0; i < cut; ++i) {
        ASSERT_TRUE(first.addBatch(batches[i]).ok());
        commit(first, i + 1);
      }
      // The daemon restarts: the session continues from its checkpoint, its analysis is built
      // again while the rest comes (committed batch by batch, as the stream does).
      auto stored = Store::loadCheckpoint(db, id);
      ASSERT_TRUE(stored.ok() && *stored);
      v1::IngestCheckpoint state;
      ASSERT_TRUE(state.ParseFromString((*stored)->state));
      SessionIngest resumed(id, 1024);
      ASSERT_TRUE(resumed.restore(state, (*stored)->openBlocks).ok());
      ASSERT_EQ(resumed.live(), nullptr);
      LiveRebuild::Options o = quietOptions(db, id, dir.string());
      o.windowEdges = 1024;
      o.sortBytes = 4096;    // the blocks' sort spills to disk
      o.memoryLogCalls = 2;  // and so does the log, while it waits
      resumed.rebuildLive(o, state, (*stored)->openBlocks);
      for (size_t i = cut; i < batches.size(); ++i) {
        ASSERT_TRUE(resumed.addBatch(batches[i]).ok());
        commit(resumed, i + 1);
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (resumed.live() == nullptr && resumed.rebuildingLive() &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ASSERT_NE(resumed.live(), nullptr) << "seed " << seed << ", cut after batch " << cut;
      EXPECT_EQ(answers(*resumed.live()), expected) << "seed " << seed << ", cut " << cut;
      // It answers only: nothing for the store, and its end says why the pass must run.
      EXPECT_TRUE(resumed.takeRows().timelineChunks.empty());
      resumed.finish();
      auto final = resumed.takeLiveFinal();
      ASSERT_TRUE(final.has_value());
      EXPECT_FALSE(final->exact);
    }
  }
  std::filesystem::remove_all(dir);
}

// What comes after the thread handed over, until the ingest takes the analysis on, waits in the
// log too, in memory and in its file: applied in order, the analysis is the one fed directly.
TEST(LiveRebuildTest, CallsLoggedInMemoryAndOnDiskAreAppliedInOrder) {
  const std::filesystem::path dir = emptyScratchDir("tidemark-rebuild-spill");
  const std::string db = (dir / "store.db").string();
  StoreWithSession made = storeWithSession(db);
  ASSERT_NE(made.session, 0);
  LiveRebuild::Options o = quietOptions(db, made.session, dir.string());
  o.memoryLogCalls = 3;
  LiveRebuild r(o, checkpointAtStart(), {});
  // An empty store: the thread hands over at once; everything below is logged after.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  core::LiveAnalysis direct(1024);
  std::vector<core::LiveCall> calls;
  uint64_t seq = 0;
  auto call = [&](core::LiveCall::Kind kind) {
    core::LiveCall c;
    c.kind = kind;
    c.seq = ++seq;
    c.tsNs = static_cast<int64_t>(seq) * 100;
    return c;
  };
  for (int64_t step = 1; step <= 5; ++step) {
    core::LiveCall begin = call(core::LiveCall::Kind::kStepBegin);
    begin.step = step;
    calls.push_back(begin);
    for (uint64_t k = 1; k <= 4; ++k) {
      core::LiveCall a = call(core::LiveCall::Kind::kAlloc);
      a.address = 0x1000 * k;
      a.sizeBytes = static_cast<uint64_t>(step) * 100 * k;
      calls.push_back(a);
    }
    for (uint64_t k = 4; k >= 2; --k) {
      core::LiveCall f = call(core::LiveCall::Kind::kFree);
      f.address = 0x1000 * k;
      calls.push_back(f);
    }
    core::LiveCall f = call(core::LiveCall::Kind::kFree);
    f.address = 0x1000;
    calls.push_back(f);
    core::LiveCall end = call(core::LiveCall::Kind::kStepEnd);
    end.step = step;
    calls.push_back(end);
  }
  for (const core::LiveCall& c : calls) {
    ASSERT_TRUE(r.log(c));
    c.applyTo(direct);
  }
  std::unique_ptr<core::LiveAnalysis> built;
  while (!(built = r.takeIfCaughtUp()) && !r.failed() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_NE(built, nullptr) << r.error();
  EXPECT_EQ(answers(*built), answers(direct));
  EXPECT_NE(answers(direct).find("step 41-50: 5 45 5000"), std::string::npos) << answers(direct);
  std::filesystem::remove_all(dir);
}

// Sessions resumed together are read a few at a time: every one of them is built, in turn, and
// one given up (cancelled) frees its turn.
TEST(LiveRebuildTest, RebuildsResumedTogetherAreEachBuiltInTurn) {
  const std::filesystem::path dir = emptyScratchDir("tidemark-rebuild-turns");
  const std::string db = (dir / "store.db").string();
  StoreWithSession made = storeWithSession(db);
  ASSERT_NE(made.session, 0);
  { LiveRebuild cancelled(quietOptions(db, made.session, dir.string()), checkpointAtStart(), {}); }
  std::vector<std::unique_ptr<LiveRebuild>> rebuilds;
  for (int i = 0; i < 6; ++i)
    rebuilds.push_back(std::make_unique<LiveRebuild>(quietOptions(db, made.session, dir.string()),
                                                     checkpointAtStart(), std::vector<BlockRow>{}));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  size_t built = 0;
  std::vector<bool> done(rebuilds.size(), false);
  while (built < rebuilds.size() && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < rebuilds.size(); ++i) {
      if (!done[i] && rebuilds[i]->takeIfCaughtUp()) {
        done[i] = true;
        ++built;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(built, rebuilds.size());
  rebuilds.clear();
  std::filesystem::remove_all(dir);
}

// What comes while the store is read waits in a bounded log: past it the rebuild is given up
// (said), and the session goes on without a live analysis.
TEST(LiveRebuildTest, ALogPastItsBoundGivesTheRebuildUp) {
  const std::filesystem::path dir = emptyScratchDir("tidemark-rebuild-log");
  // Never readable: the thread fails.
  LiveRebuild::Options o = quietOptions((dir / "missing" / "store.db").string(), 1, dir.string());
  o.maxLogCalls = 8;
  {
    LiveRebuild r(o, checkpointAtStart(), {});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!r.failed() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_TRUE(r.failed());
    EXPECT_NE(r.error().find("store"), std::string::npos) << r.error();
    EXPECT_EQ(r.takeIfCaughtUp(), nullptr);
  }
  // A store that reads, and a log that overflows before the thread can catch up with it.
  const std::string db = (dir / "store.db").string();
  StoreWithSession made = storeWithSession(db);
  ASSERT_NE(made.session, 0);
  o.dbPath = db;
  o.sessionId = made.session;
  LiveRebuild r(o, checkpointAtStart(), {});
  core::LiveCall c;
  c.kind = core::LiveCall::Kind::kOpScopeSeen;
  bool taken = true;
  for (int i = 0; i < 100000 && taken && !r.failed(); ++i) taken = r.log(c);
  // Either the thread caught up with a log it kept under 8 calls, or the log went past them.
  if (!taken) {
    EXPECT_TRUE(r.failed());
    EXPECT_NE(r.error().find("8 events waited"), std::string::npos) << r.error();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark::server
