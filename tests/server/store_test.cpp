// The store: what it writes is read back the same on both backends (SQLite, and a real
// PostgreSQL server: tests/support/postgres_test_db.h); daemons sharing a PostgreSQL store; the
// SQLite file's schema versions, reopening, refusing what it cannot read.
#include "server/store/store.h"
#include "server/store/writer.h"
#include "tests/support/postgres_test_db.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

namespace tidemark::server {
namespace {

std::filesystem::path tempPath(const char* name) {
  auto p = std::filesystem::temp_directory_path() /
           ("tidemark-store-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(p);
  return p;
}

// A test run on each backend: freshStore() is a new, empty store of it.
class StoreBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string freshStore(const char* name) {
    if (GetParam() == "postgresql") {
      auto uri = test_support::freshPostgresDatabase();
      EXPECT_TRUE(uri.ok()) << uri.status();
      return uri.ok() ? *uri : "postgresql://no-test-server.invalid/none";
    }
    m_dir = tempPath(name);
    return (m_dir / "nested" / "store.db").string();  // directories are created
  }
  void TearDown() override {
    if (!m_dir.empty()) std::filesystem::remove_all(m_dir);
  }
  std::filesystem::path m_dir;
};

INSTANTIATE_TEST_SUITE_P(Backends, StoreBackendTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

TEST_P(StoreBackendTest, RowsWrittenAreReadBackAsARecording) {
  const std::string db = freshStore("rows");
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->begin().ok());
    SessionHeader h;
    h.pid = 1;
    auto id = (*store)->createSession(h);
    ASSERT_TRUE(id.ok());
    SessionRows rows;
    rows.sessionId = *id;
    rows.strings = {{1, "model.fc"}};
    BlockRow b;
    b.address = 0xdeadbeef000;
    b.sizeBytes = 4096;
    b.allocSeq = 1;
    b.freeSeq = 3;
    rows.blocks = {b};
    TagRow t;
    t.seq = 2;
    t.address = b.address;
    t.category = 1;
    t.nameIid = 1;
    rows.tags = {t};
    ASSERT_TRUE((*store)->writeRows(rows).ok());
    ASSERT_TRUE((*store)->commit().ok());
  }
  auto rec = Store::loadRecording(db, 1);
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->blocks.size(), 1u);
  EXPECT_EQ(rec->blocks[0].address, 0xdeadbeef000u);
  EXPECT_EQ(rec->blocks[0].freeSeq, 3u);
  ASSERT_EQ(rec->tags.size(), 1u);
  EXPECT_EQ(rec->tags[0].name, "model.fc");
  EXPECT_EQ(rec->tags[0].category, core::Category::kWeight);
  EXPECT_EQ(Store::getSession(db, 2).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreBackendTest, ASessionsStepsAreCountedAsTheyComeAndGo) {
  // Listing sessions reads each one's kept count instead of counting its step rows: it follows
  // new steps, steps written again, inferred steps added and cleared, and a session stored
  // before the count was kept.
  const std::string db = freshStore("stepcount");
  auto store = Store::open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  SessionHeader h;
  h.pid = 1;
  auto id = (*store)->createSession(h);
  ASSERT_TRUE(id.ok());
  auto write = [&](std::vector<int64_t> steps) {
    SessionRows rows;
    rows.sessionId = *id;
    for (int64_t n : steps) {
      StepRow r;
      r.step = n;
      r.beginSeq = static_cast<uint64_t>(10 * n + 1);
      r.endSeq = static_cast<uint64_t>(10 * n + 5);
      rows.steps.push_back(r);
    }
    ASSERT_TRUE((*store)->begin().ok());
    ASSERT_TRUE((*store)->writeRows(rows).ok());
    ASSERT_TRUE((*store)->commit().ok());
  };
  auto expectSteps = [&](int64_t n) {
    auto one = Store::getSession(db, *id, true);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(one->steps, n);
    auto all = Store::listSessions(db);
    ASSERT_TRUE(all.ok());
    ASSERT_EQ(all->size(), 1u);
    EXPECT_EQ(all->front().steps, n);
    EXPECT_EQ(*Store::countSteps(db, *id), n);
  };
  expectSteps(0);
  write({0, 1, 2});
  expectSteps(3);
  write({2, 3});  // step 2 again (its end written again): one more, not two
  expectSteps(4);
  ASSERT_TRUE((*store)->begin().ok());
  core::StepInterval inferred;
  inferred.step = 9;
  inferred.beginSeq = 100;
  inferred.endSeq = 110;
  ASSERT_TRUE((*store)->finishAnalysis(*id, {}, {}, {inferred}).ok());
  ASSERT_TRUE((*store)->commit().ok());
  expectSteps(5);
  ASSERT_TRUE((*store)->begin().ok());
  ASSERT_TRUE((*store)->clearAnalysis(*id).ok());
  ASSERT_TRUE((*store)->commit().ok());
  expectSteps(4);
  // Stored before the count was kept: counted; its next step starts the count right.
  ASSERT_TRUE((*store)->exec("DELETE FROM step_count").ok());
  expectSteps(4);
  write({7});
  expectSteps(5);
  // And what the listing reads is the kept count, not the rows.
  ASSERT_TRUE((*store)->exec("UPDATE step_count SET steps = 1000").ok());
  expectSteps(1000);
  // A store no daemon of this version opened (read with --db): the rows are counted.
  ASSERT_TRUE((*store)
                  ->exec(GetParam() == "postgresql"
                             ? "DROP TRIGGER step_counted ON step; DROP TABLE step_count"
                             : "DROP TRIGGER step_counted; DROP TRIGGER step_uncounted; "
                               "DROP TABLE step_count")
                  .ok());
  expectSteps(5);
}

TEST_P(StoreBackendTest, RawEventsGoInSlicesAndTheSessionSaysSo) {
  const std::string db = freshStore("slices");
  auto store = Store::open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  ASSERT_TRUE(st.begin().ok());
  SessionHeader h;
  h.pid = 1;
  auto id = st.createSession(h);
  ASSERT_TRUE(id.ok());
  SessionRows rows;
  rows.sessionId = *id;
  rows.strings = {{1, "model.fc"}};
  for (uint64_t i = 0; i < 1000; ++i) {
    BlockRow b;
    b.address = 0x1000 + i * 64;
    b.sizeBytes = 64;
    b.allocSeq = 3 * i + 1;
    b.freeSeq = 3 * i + 3;
    rows.blocks.push_back(b);
    TagRow t;
    t.seq = 3 * i + 2;
    t.address = b.address;
    t.category = 1;
    t.nameIid = 1;
    rows.tags.push_back(t);
  }
  ASSERT_TRUE(st.writeRows(rows).ok());
  ASSERT_TRUE(st.commit().ok());

  ASSERT_TRUE(st.markRawPruned(*id, 1'700'000'000'000'000'000).ok());
  EXPECT_EQ(st.markRawPruned(*id + 1, 1).code(), absl::StatusCode::kNotFound);
  // Queries say the raw events are gone from the moment the prune starts.
  auto rec = Store::loadRecording(db, *id);
  ASSERT_EQ(rec.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(rec.status().message().find("dropped by retention on 2023-11-14"), std::string::npos)
      << rec.status();
  int slices = 0;
  int64_t total = 0;
  for (;;) {
    auto n = st.deleteRawSlice(*id, 300);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_LE(*n, 300);
    if (*n == 0) break;
    total += *n;
    ++slices;
  }
  EXPECT_EQ(total, 2000);  // 1000 blocks and 1000 tags
  EXPECT_EQ(slices, 7);
  auto info = Store::getSession(db, *id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->rawPrunedWallNs, 1'700'000'000'000'000'000);
  ASSERT_TRUE(st.deleteSession(*id).ok());
  EXPECT_EQ(Store::getSession(db, *id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.deleteSession(*id).code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreBackendTest, ACounterAtAMomentIsItsNamesLatestValueThen) {
  // What each step's peak says the allocator reserved: the latest value of the counter at the
  // peak's moment, of that name only (its interned ids: a resumed session has one a stream),
  // of that session only.
  const std::string db = freshStore("counters");
  int64_t a = 0, b = 0;
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->begin().ok());
    SessionHeader h;
    h.pid = 1;
    auto first = (*store)->createSession(h);
    auto second = (*store)->createSession(h);
    ASSERT_TRUE(first.ok() && second.ok());
    a = *first;
    b = *second;
    const std::string sa = std::to_string(a), sb = std::to_string(b);
    std::string sql = "INSERT INTO string (session_id, iid, value) VALUES (" + sa +
                      ", 1, 'reserved_bytes'), (" + sa + ", 2, 'other'), (" + sa +
                      ", 7, 'reserved_bytes'), (" + sb + ", 1, 'reserved_bytes');";
    for (const auto& [session, seq, iid, value] :
         std::vector<std::tuple<std::string, int, int, int>>{{sa, 10, 1, 100},
                                                             {sa, 30, 1, 300},
                                                             {sa, 20, 2, 999},
                                                             {sa, 40, 2, 888},
                                                             {sa, 50, 7, 500},
                                                             {sb, 45, 1, 4242}})
      sql += "INSERT INTO counter (session_id, seq, ts_ns, name_id, value) VALUES (" + session +
             ", " + std::to_string(seq) + ", 0, " + std::to_string(iid) + ", " +
             std::to_string(value) + ");";
    ASSERT_TRUE((*store)->exec(sql).ok());
    ASSERT_TRUE((*store)->commit().ok());
  }
  auto values = Store::countersAt(db, a, "reserved_bytes", {5, 10, 25, 45, 50, 60});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::optional<int64_t>>{std::nullopt, 100, 100, 300, 500, 500}));
  auto none = Store::countersAt(db, a, "nothing", {10, 60});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, (std::vector<std::optional<int64_t>>{std::nullopt, std::nullopt}));
  auto other = Store::counterAt(db, a, "other", 35);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(*other, std::optional<int64_t>(999));
  auto elsewhere = Store::countersAt(db, b, "reserved_bytes", {44, 45});
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_EQ(*elsewhere, (std::vector<std::optional<int64_t>>{std::nullopt, 4242}));
}

TEST(StoreTest, AStoreFromANewerTidemarkIsRefused) {
  const auto dir = tempPath("newer");
  const std::string db = (dir / "store.db").string();
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->exec("UPDATE meta SET value = '99' WHERE key = 'schema_version'").ok());
  }
  auto again = Store::open(db);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

TEST(StoreTest, AVersion3StoreIsReadAndMigrated) {
  // Version 3's peak_item had no address column: read without a daemon (--db), its tensors have
  // none; opened by a tidemarkd, it is migrated to version 4.
  const auto dir = tempPath("v3");
  const std::string db = (dir / "store.db").string();
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)
                    ->exec("DROP TABLE peak_item; CREATE TABLE peak_item (session_id INTEGER NOT "
                           "NULL, step INTEGER NOT NULL, kind TEXT NOT NULL, rank INTEGER NOT "
                           "NULL, name TEXT NOT NULL, category INTEGER NOT NULL, rule INTEGER NOT "
                           "NULL, bytes INTEGER NOT NULL, blocks INTEGER NOT NULL, PRIMARY KEY "
                           "(session_id, step, kind, rank)) WITHOUT ROWID; "
                           "INSERT INTO peak(session_id, step, seq, ts_ns, tracked_bytes, phase, "
                           "scope) VALUES (1, -1, 5, 50, 100, '', ''); "
                           "INSERT INTO peak_item VALUES (1, -1, 'tensor', 0, 'w', 1, 1, 100, 1); "
                           "UPDATE meta SET value = '3' WHERE key = 'schema_version'")
                    .ok());
  }
  auto old = Store::readPeak(db, 1, -1);
  ASSERT_TRUE(old.ok()) << old.status();
  ASSERT_EQ(old->tensors.size(), 1u);
  EXPECT_EQ(old->tensors[0].address, 0u);
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->exec("UPDATE peak_item SET address = 4096").ok());
  }
  auto migrated = Store::readPeak(db, 1, -1);
  ASSERT_TRUE(migrated.ok()) << migrated.status();
  EXPECT_EQ(migrated->tensors[0].address, 4096u);
  std::filesystem::remove_all(dir);
}

SessionHeader rankHeader(const std::string& key, int32_t rank, int64_t owner, int64_t startWallNs) {
  SessionHeader h;
  h.pid = 1000 + rank;
  h.hostname = "node";
  h.commandLine = "train.py";
  h.protocolVersion = 1;
  h.agentVersion = "test";
  h.startWallNs = startWallNs;
  h.ownerUid = owner;
  h.jobKey = key;
  h.rank = rank;
  h.localRank = rank;
  h.worldSize = key.empty() ? 0 : 4;
  return h;
}

TEST_P(StoreBackendTest, TheRanksOfAJobAreGroupedByOwnerKeyAndRun) {
  const std::string db = freshStore("jobs");
  constexpr int64_t kStart = 1'700'000'000'000'000'000;
  constexpr int64_t kSecond = 1'000'000'000;
  auto store = Store::open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<int64_t> ranks;
  for (int32_t r : {2, 0, 3, 1}) {  // ranks connect in any order
    auto id = (*store)->createSession(rankHeader("run-a", r, 1000, kStart + r * kSecond));
    ASSERT_TRUE(id.ok()) << id.status();
    ranks.push_back(*id);
  }
  // Another user with the same key: a job of its own, never mixed into the first one's.
  auto other = (*store)->createSession(rankHeader("run-a", 1, 2000, kStart));
  // The same ranks again (a rerun of the same launch line): a new job.
  auto rerun = (*store)->createSession(rankHeader("run-a", 0, 1000, kStart + 60 * kSecond));
  // A rank that starts long after the job did: a new job, not a hole filled in an old one.
  auto late = (*store)->createSession(rankHeader("run-b", 0, 1000, kStart));
  auto later = (*store)->createSession(
      rankHeader("run-b", 1, 1000, kStart + Store::kJobJoinWindowNs + kSecond));
  auto alone = (*store)->createSession(rankHeader("", -1, 1000, kStart));  // not a rank
  for (auto* id : {&other, &rerun, &late, &later, &alone}) ASSERT_TRUE(id->ok()) << id->status();

  auto all = Store::listJobs(db, std::nullopt, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 5u);  // run-a ×2 of user 1000, run-a of 2000, run-b ×2
  auto mine = Store::listJobs(db, 1000, 0);
  ASSERT_TRUE(mine.ok());
  ASSERT_EQ(mine->size(), 4u);
  const JobRecord& first = mine->front();
  EXPECT_EQ(first.key, "run-a");
  EXPECT_EQ(first.worldSize, 4);
  EXPECT_EQ(first.startWallNs, kStart + 2 * kSecond);  // its first rank's
  EXPECT_EQ(first.ranksRecorded, 4);
  EXPECT_EQ(first.ranksLive, 4);  // created, none ended
  auto sessions = Store::jobSessions(db, first.id);
  ASSERT_TRUE(sessions.ok());
  ASSERT_EQ(sessions->size(), 4u);
  for (const SessionRecord& s : *sessions) {
    EXPECT_EQ(s.jobId, first.id);
    EXPECT_EQ(s.header.jobKey, "run-a");
    EXPECT_EQ(s.header.worldSize, 4);
    EXPECT_EQ(s.header.pid, 1000 + s.header.rank);
  }
  auto theirs = Store::listJobs(db, 2000, 0);
  ASSERT_TRUE(theirs.ok());
  ASSERT_EQ(theirs->size(), 1u);
  EXPECT_NE(theirs->front().id, first.id);
  auto lone = Store::getSession(db, *alone);
  ASSERT_TRUE(lone.ok());
  EXPECT_EQ(lone->jobId, 0);
  EXPECT_EQ(lone->header.rank, -1);
  auto rerunRow = Store::getSession(db, *rerun);
  ASSERT_TRUE(rerunRow.ok());
  EXPECT_NE(rerunRow->jobId, first.id);
  auto lateRow = Store::getSession(db, *late), laterRow = Store::getSession(db, *later);
  ASSERT_TRUE(lateRow.ok() && laterRow.ok());
  EXPECT_NE(lateRow->jobId, laterRow->jobId);
}

TEST(StoreTest, AVersion4StoreIsReadWithoutJobsAndMigrated) {
  // Version 4 had no jobs: read without a daemon (--db) its sessions are nobody's ranks; opened
  // by a tidemarkd, it is migrated to version 5 and new ranks form jobs.
  const auto dir = tempPath("v4");
  const std::string db = (dir / "store.db").string();
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->createSession(rankHeader("", -1, 1000, 1)).ok());
    // The session table as version 4 made it (without the job columns), its rows kept.
    const absl::Status dropped = (*store)->exec(
        "DROP TABLE job; ALTER TABLE session RENAME TO session_v5; "
        "CREATE TABLE session (id INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT '', pid "
        "INTEGER NOT NULL, hostname TEXT NOT NULL, command_line TEXT NOT NULL, protocol_version "
        "INTEGER NOT NULL, agent_version TEXT NOT NULL, start_ts_ns INTEGER NOT NULL, "
        "start_wall_ns INTEGER NOT NULL, end_ts_ns INTEGER, state INTEGER NOT NULL, "
        "events_received INTEGER NOT NULL DEFAULT 0, events_stored INTEGER NOT NULL DEFAULT 0, "
        "events_sent INTEGER, events_dropped INTEGER, live_blocks_at_end INTEGER, block_count "
        "INTEGER NOT NULL DEFAULT 0, first_block_id INTEGER, last_block_id INTEGER, analyzed "
        "INTEGER NOT NULL DEFAULT 0, owner_uid INTEGER, raw_pruned_wall_ns INTEGER, end_wall_ns "
        "INTEGER); "
        "INSERT INTO session SELECT id, name, pid, hostname, command_line, protocol_version, "
        "agent_version, start_ts_ns, start_wall_ns, end_ts_ns, state, events_received, "
        "events_stored, events_sent, events_dropped, live_blocks_at_end, block_count, "
        "first_block_id, last_block_id, analyzed, owner_uid, raw_pruned_wall_ns, end_wall_ns "
        "FROM session_v5; DROP TABLE session_v5; "
        "UPDATE meta SET value = '4' WHERE key = 'schema_version'");
    ASSERT_TRUE(dropped.ok()) << dropped;
  }
  auto old = Store::listSessions(db);
  ASSERT_TRUE(old.ok()) << old.status();
  ASSERT_EQ(old->size(), 1u);
  EXPECT_EQ(old->front().jobId, 0);
  auto noJobs = Store::listJobs(db, std::nullopt, 0);
  ASSERT_TRUE(noJobs.ok()) << noJobs.status();
  EXPECT_TRUE(noJobs->empty());
  {
    auto store = Store::open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->createSession(rankHeader("k", 0, 1000, 1)).ok());
  }
  auto jobs = Store::listJobs(db, std::nullopt, 0);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  auto ranks = Store::jobSessions(db, jobs->front().id);
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ(ranks->front().id, 2);
  std::filesystem::remove_all(dir);
}

TEST(StoreTest, AFileThatIsNotADatabaseIsRefused) {
  const auto dir = tempPath("junk");
  std::filesystem::create_directories(dir);
  const std::string db = (dir / "junk.db").string();
  std::ofstream(db) << std::string(4096, 'x');
  EXPECT_FALSE(Store::open(db).ok());
  std::filesystem::remove_all(dir);
}

TEST(StoreWriterTest, AnUrgentWriteGoesBeforeTheQueuedOnesAndNeverWaitsForThemAll) {
  const auto dir = tempPath("urgent");
  auto store = Store::open((dir / "store.db").string());
  ASSERT_TRUE(store.ok()) << store.status();
  StoreWriter writer(std::move(*store));
  // Ten slow writes queued (other sessions' rows), then an urgent one (a handshake's row).
  std::atomic<int> normalDone{0};
  std::vector<std::future<absl::Status>> normal;
  for (int i = 0; i < 10; ++i) {
    normal.push_back(writer.submit([&normalDone](Store&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ++normalDone;
      return absl::OkStatus();
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the first one is under way
  int doneWhenUrgentRan = -1;
  auto urgent = writer.submit(
      [&](Store& s) {
        doneWhenUrgentRan = normalDone.load();
        return s.exec("CREATE TABLE IF NOT EXISTS urgent_probe (x INTEGER)");
      },
      StoreWriter::Priority::kUrgent);
  ASSERT_TRUE(urgent.get().ok());
  // At most the write under way (and one more starting) came first; the rest waited for it.
  EXPECT_GE(doneWhenUrgentRan, 0);
  EXPECT_LE(doneWhenUrgentRan, 2);
  for (auto& f : normal) EXPECT_TRUE(f.get().ok());  // and they were all committed after
  EXPECT_EQ(normalDone.load(), 10);
  writer.stop();
  std::filesystem::remove_all(dir);
}

// Two daemons (two write connections, each its own name) on one PostgreSQL store.
class SharedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto uri = test_support::freshPostgresDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    m_uri = *uri;
  }
  std::string m_uri;
};

TEST_F(SharedStoreTest, EachDaemonLooksAfterItsOwnSessionsAndReadsEveryOne) {
  auto a = Store::open(m_uri, int64_t{8} << 20, "node-a");
  auto b = Store::open(m_uri, int64_t{8} << 20, "node-b");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  // Both write a session's blocks in transactions open at the same time: the block ids
  // interleave, each session's rows stay its own and in order.
  ASSERT_TRUE((*a)->begin().ok());
  ASSERT_TRUE((*b)->begin().ok());
  SessionHeader h;
  h.pid = 7;
  auto sa = (*a)->createSession(h);
  auto sb = (*b)->createSession(h);
  ASSERT_TRUE(sa.ok() && sb.ok());
  for (int batch = 0; batch < 3; ++batch) {
    for (auto [store, sid] : {std::pair{a->get(), *sa}, std::pair{b->get(), *sb}}) {
      SessionRows rows;
      rows.sessionId = sid;
      for (uint64_t i = 0; i < 100; ++i) {
        BlockRow blk;
        blk.address = (static_cast<uint64_t>(sid) << 32) + batch * 100 + i;
        blk.sizeBytes = 64 * (i + 1);
        blk.allocSeq = batch * 100 + i;
        rows.blocks.push_back(blk);
      }
      ASSERT_TRUE(store->writeRows(rows).ok());
    }
  }
  ASSERT_TRUE((*a)->commit().ok());
  ASSERT_TRUE((*b)->commit().ok());
  for (int64_t sid : {*sa, *sb}) {
    auto rec = Store::loadRecording(m_uri, sid);
    ASSERT_TRUE(rec.ok()) << rec.status();
    ASSERT_EQ(rec->blocks.size(), 300u);
    for (size_t i = 0; i < rec->blocks.size(); ++i) {
      EXPECT_EQ(rec->blocks[i].address, (static_cast<uint64_t>(sid) << 32) + i);
      EXPECT_EQ(rec->blocks[i].allocSeq, i);
    }
  }
  // Live sessions to resume, sessions to analyse: each daemon its own; queries: every one.
  auto liveA = Store::liveSessions(m_uri, "node-a");
  auto liveB = Store::liveSessions(m_uri, "node-b");
  ASSERT_TRUE(liveA.ok() && liveB.ok());
  ASSERT_EQ(liveA->size(), 1u);
  EXPECT_EQ(liveA->front().id, *sa);
  EXPECT_EQ(liveA->front().daemon, "node-a");
  ASSERT_EQ(liveB->size(), 1u);
  EXPECT_EQ(liveB->front().id, *sb);
  SessionEnd end;
  end.sessionId = *sb;
  end.endTsNs = 5;
  ASSERT_TRUE((*b)->endSession(end).ok());
  auto toAnalyzeA = Store::sessionsToAnalyze(m_uri, "node-a");
  auto toAnalyzeB = Store::sessionsToAnalyze(m_uri, "node-b");
  ASSERT_TRUE(toAnalyzeA.ok() && toAnalyzeB.ok());
  EXPECT_TRUE(toAnalyzeA->empty());
  EXPECT_EQ(*toAnalyzeB, std::vector<int64_t>{*sb});
  auto all = Store::listSessions(m_uri);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
}

TEST_F(SharedStoreTest, RanksTakenByTwoDaemonsAtOnceJoinOneJob) {
  auto a = Store::open(m_uri, int64_t{8} << 20, "node-a");
  auto b = Store::open(m_uri, int64_t{8} << 20, "node-b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto rank = [](int32_t r) {
    SessionHeader h;
    h.pid = 100 + r;
    h.ownerUid = 1000;
    h.jobKey = "10.0.0.1:29500";
    h.rank = r;
    h.worldSize = 2;
    h.startWallNs = 1'700'000'000'000'000'000;
    return h;
  };
  // Daemon a takes rank 0 in a transaction it keeps open a while; daemon b takes rank 1 in the
  // meantime. Without the database's lock b would not see a's job yet and make another.
  ASSERT_TRUE((*a)->begin().ok());
  auto r0 = (*a)->createSession(rank(0));
  ASSERT_TRUE(r0.ok()) << r0.status();
  auto second = std::async(std::launch::async, [&] {
    EXPECT_TRUE((*b)->begin().ok());
    auto id = (*b)->createSession(rank(1));
    EXPECT_TRUE((*b)->commit().ok());
    return id;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE((*a)->commit().ok());
  auto r1 = second.get();
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto jobs = Store::listJobs(m_uri, std::nullopt, 0);
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().ranksRecorded, 2);
}

// Ends every other connection to the store's database (as a server restart does).
void endOtherConnections(const std::string& uri) {
  Database admin;
  ASSERT_TRUE(Database::open(uri, false, &admin).ok());
  ASSERT_TRUE(admin
                  .exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid()")
                  .ok());
}

TEST_F(SharedStoreTest, ADaemonConnectsAgainWhenTheServerEndsItsConnections) {
  auto store = Store::open(m_uri, int64_t{8} << 20, "node-a");
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  SessionHeader h;
  h.pid = 1;
  ASSERT_TRUE(st.begin().ok());
  ASSERT_TRUE(st.createSession(h).ok());
  ASSERT_TRUE(st.commit().ok());
  ASSERT_TRUE(Store::getSession(m_uri, 1).ok());  // a reader's connection, kept for the next
  endOtherConnections(m_uri);
  // Between transactions: the next one connects again; its statements, prepared on the lost
  // connection, are prepared again.
  ASSERT_TRUE(st.begin().ok());
  auto second = st.createSession(h);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(st.commit().ok());
  // Readers: the kept connections the server ended are not handed out.
  auto all = Store::listSessions(m_uri);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 2u);
  // Inside a transaction: it fails (its writes are gone with the connection), the rollback says
  // so, and the next transaction connects again and commits.
  ASSERT_TRUE(st.begin().ok());
  ASSERT_TRUE(st.createSession(h).ok());
  endOtherConnections(m_uri);
  EXPECT_FALSE(st.createSession(h).ok());
  EXPECT_FALSE(st.commit().ok());
  (void)st.rollback();
  ASSERT_TRUE(st.begin().ok());
  ASSERT_TRUE(st.createSession(h).ok());
  ASSERT_TRUE(st.commit().ok());
  all = Store::listSessions(m_uri);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 3u);  // the lost transaction's session is not there
}

TEST_F(SharedStoreTest, EveryColumnTypeReadsBackFromPostgresqlBinaryResults) {
  for (bool readOnly : {true, false}) {  // a reader's statement (unnamed), the writer's
    Database db;
    ASSERT_TRUE(Database::open(m_uri, readOnly, &db).ok());
    Statement st = db.prepare(
        "SELECT CAST(-2 AS SMALLINT), CAST(-70000 AS INTEGER), CAST(?1 AS BIGINT), TRUE, FALSE, "
        "CAST(12345678901234 AS NUMERIC), CAST(-20000 AS NUMERIC), CAST(0 AS NUMERIC), "
        "CAST(42 AS OID), 'text ü', CAST(?2 AS BYTEA), NULL, SUM(x) FROM (VALUES (CAST(?1 AS "
        "BIGINT)), (CAST(1 AS BIGINT))) AS t(x)");
    ASSERT_TRUE(st.ok()) << db.error();
    for (int run = 0; run < 2; ++run) {  // the second run prepared on the server
      st.bind(1, int64_t{-9'000'000'000'000'000'000}).bindBlob(2, std::string("\0\x01\xff", 3));
      ASSERT_TRUE(st.step()) << st.error();
      EXPECT_EQ(st.columnInt(0), -2);
      EXPECT_EQ(st.columnInt(1), -70000);
      EXPECT_EQ(st.columnInt(2), -9'000'000'000'000'000'000);
      EXPECT_EQ(st.columnInt(3), 1);
      EXPECT_EQ(st.columnInt(4), 0);
      EXPECT_EQ(st.columnInt(5), 12345678901234);
      EXPECT_EQ(st.columnInt(6), -20000);
      EXPECT_EQ(st.columnInt(7), 0);
      EXPECT_EQ(st.columnInt(8), 42);
      EXPECT_EQ(st.columnText(9), "text ü");
      EXPECT_EQ(st.columnBlob(10), std::string_view("\0\x01\xff", 3));
      EXPECT_TRUE(st.columnNull(11));
      EXPECT_FALSE(st.columnNull(10));
      EXPECT_EQ(st.columnInt(12), -8'999'999'999'999'999'999);  // SUM of BIGINT is a NUMERIC
      EXPECT_FALSE(st.step());
      EXPECT_FALSE(st.failed());
      st.reset();
    }
  }
}

TEST(StoreTest, APostgresqlServerThatIsNotThereIsRefusedClearly) {
  // A socket directory with no server in it: refused at once, saying where it looked.
  auto store = Store::open("postgresql://nobody@/none?host=/nonexistent-tidemark&port=1");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find("cannot connect to postgresql://"), std::string::npos)
      << store.status();
}

}  // namespace
}  // namespace tidemark::server
