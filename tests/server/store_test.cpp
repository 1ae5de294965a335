// The SQLite store: schema version, reopening, refusing what it cannot read.
#include "server/store/store.h"
#include "server/store/writer.h"

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

TEST(StoreTest, RowsWrittenAreReadBackAsARecording) {
  const auto dir = tempPath("rows");
  const std::string db = (dir / "nested" / "store.db").string();  // directories are created
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
  std::filesystem::remove_all(dir);
}

TEST(StoreTest, RawEventsGoInSlicesAndTheSessionSaysSo) {
  const auto dir = tempPath("slices");
  const std::string db = (dir / "store.db").string();
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
  std::filesystem::remove_all(dir);
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

}  // namespace
}  // namespace tidemark::server
