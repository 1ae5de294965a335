#include "server/store/store.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>

#include "server/store/recording_stream.h"
#include "src/core/category.h"
#include "src/core/streaming_analysis.h"
#include "src/core/timeline_codec.h"

namespace tidemark::server {

extern const char* const kSchemaSql;

namespace {
// The step_count table (schema.sql) kept as step rows come and go: a row inserted (not one an
// upsert updated) adds one, and the first for a session without a count counts the rows it
// already has (only then: counting every time would cost every step the session's steps); a row
// deleted takes one off.
constexpr const char* kStepCountTriggersSqlite =
    "CREATE TRIGGER IF NOT EXISTS step_counted AFTER INSERT ON step BEGIN "
    "UPDATE step_count SET steps = steps + 1 WHERE session_id = NEW.session_id; "
    "INSERT INTO step_count(session_id, steps) SELECT NEW.session_id, (SELECT COUNT(*) FROM step "
    "WHERE session_id = NEW.session_id) WHERE NOT EXISTS (SELECT 1 FROM step_count WHERE "
    "session_id = NEW.session_id); END;"
    "CREATE TRIGGER IF NOT EXISTS step_uncounted AFTER DELETE ON step BEGIN "
    "UPDATE step_count SET steps = steps - 1 WHERE session_id = OLD.session_id; END;";
constexpr const char* kStepCountTriggersPostgres =
    "CREATE OR REPLACE FUNCTION tidemark_step_count() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN IF TG_OP = 'INSERT' THEN "
    "UPDATE step_count SET steps = steps + 1 WHERE session_id = NEW.session_id; "
    "IF NOT FOUND THEN INSERT INTO step_count(session_id, steps) VALUES (NEW.session_id, "
    "(SELECT COUNT(*) FROM step WHERE session_id = NEW.session_id)); END IF; RETURN NEW; "
    "ELSE UPDATE step_count SET steps = steps - 1 WHERE session_id = OLD.session_id; RETURN OLD; "
    "END IF; END $$;"
    "CREATE OR REPLACE TRIGGER step_counted AFTER INSERT OR DELETE ON step FOR EACH ROW "
    "EXECUTE FUNCTION tidemark_step_count();";

// SQLite integers are signed 64-bit; sequence numbers and addresses are stored bit for bit.
inline int64_t s64(uint64_t v) { return static_cast<int64_t>(v); }
inline uint64_t u64(int64_t v) { return static_cast<uint64_t>(v); }

void bindEnd(Statement& st, int index, uint64_t endSeq, int64_t endTs) {
  if (endSeq == core::kOpenSeq) {
    st.bindNull(index).bindNull(index + 1);
  } else {
    st.bind(index, s64(endSeq)).bind(index + 1, endTs);
  }
}

bool isPostgres(const Database& db) { return db.dialect() == Dialect::kPostgres; }

// SQLite is told which index serves a range read; PostgreSQL's planner chooses.
std::string indexedBy(const Database& db, const char* index) {
  return isPostgres(db) ? std::string() : std::string("INDEXED BY ") + index + " ";
}

// The id of the row just inserted by `st`, an INSERT ... RETURNING id.
absl::StatusOr<int64_t> runReturningId(Statement& st) {
  if (!st.ok()) return absl::InternalError("statement failed to prepare");
  if (!st.step()) {
    const std::string why = st.failed() ? st.error() : "no id returned";
    st.reset();
    return absl::InternalError(why);
  }
  const int64_t id = st.columnInt(0);
  st.reset();
  return id;
}

// A read of the store that ended in an error (a PostgreSQL server gone, a SQLite file locked
// too long): said as such, never as a shorter answer.
absl::Status readFailed(const Statement& st) {
  return absl::UnavailableError("reading the store failed: " + st.error());
}

absl::Status checkPrepared(const Statement& st, const Database& db) {
  if (!st.ok()) return absl::InternalError("cannot prepare statement: " + db.error());
  return absl::OkStatus();
}

absl::Status readSteps(Database& db, int64_t id, core::Recording* rec) {
  auto steps = readStepRows(db, id, /*markedOnly=*/false);
  if (!steps.ok()) return steps.status();
  rec->steps = std::move(*steps);
  return absl::OkStatus();
}

// Whether the store keeps its sessions' step counts (not one read with --db that no daemon of
// this version opened).
bool hasStepCounts(Database& db) {
  Statement has = db.prepare(
      isPostgres(db)
          ? "SELECT count(*) FROM information_schema.tables WHERE table_name = 'step_count'"
          : "SELECT count(*) FROM sqlite_master WHERE name = 'step_count'");
  return has.step() && has.columnInt(0) > 0;
}

// Reads `session` rows with their counts; `where` selects them. countSteps false: steps left 0
// (the kept count is a row read; a session stored before it was kept, or a store read with --db
// that no daemon of this version opened, counts its step rows: 30 ms at a million steps).
absl::StatusOr<std::vector<SessionRecord>> readSessions(const std::string& path,
                                                        const std::string& where, int64_t id,
                                                        int64_t limit = -1,
                                                        bool countSteps = true) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  // A store older than schema 5 read without a daemon (--db) has no jobs (a PostgreSQL store
  // began at 5).
  bool jobs = true;
  bool daemons = true;  // (schema 6)
  if (!isPostgres(db)) {
    Statement has = db.prepare(
        "SELECT count(*) FILTER (WHERE name = 'job_id'), count(*) FILTER (WHERE name = 'daemon') "
        "FROM pragma_table_info('session')");
    jobs = has.step() && has.columnInt(0) > 0;
    daemons = has.columnInt(1) > 0;
  }
  // Asked only when the steps are wanted (most reads of a session are not).
  const bool stepCounts = countSteps && hasStepCounts(db);
  Statement st = db.prepare(
      "SELECT id, name, pid, hostname, command_line, protocol_version, agent_version, "
      "start_ts_ns, start_wall_ns, end_ts_ns, state, events_received, events_stored, "
      "events_sent, events_dropped, live_blocks_at_end, "
      "block_count, " +
      std::string(!countSteps ? "0, "
                  : stepCounts
                      ? "COALESCE((SELECT c.steps FROM step_count c WHERE c.session_id = s.id), "
                        "(SELECT COUNT(*) FROM step t WHERE t.session_id = s.id)), "
                      : "(SELECT COUNT(*) FROM step t WHERE t.session_id = s.id), ") +
      "analyzed, owner_uid, "
      "raw_pruned_wall_ns, end_wall_ns, " +
      std::string(jobs ? "job_id, rank, local_rank, world_size, "
                         "(SELECT key FROM job j WHERE j.id = s.job_id) "
                       : "0, NULL, NULL, 0, '' ") +
      (daemons ? ", daemon " : ", NULL ") + "FROM session s " + where + " ORDER BY id" +
      (limit >= 0 ? " LIMIT " + std::to_string(limit) : std::string()));
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  if (where.find("?1") != std::string::npos) st.bind(1, id);
  std::vector<SessionRecord> out;
  while (st.step()) {
    SessionRecord r;
    r.id = st.columnInt(0);
    r.header.name = st.columnText(1);
    r.header.pid = static_cast<int32_t>(st.columnInt(2));
    r.header.hostname = st.columnText(3);
    r.header.commandLine = st.columnText(4);
    r.header.protocolVersion = static_cast<uint32_t>(st.columnInt(5));
    r.header.agentVersion = st.columnText(6);
    r.header.startTsNs = st.columnInt(7);
    r.header.startWallNs = st.columnInt(8);
    r.endTsNs = st.columnInt(9);
    r.state = static_cast<int>(st.columnInt(10));
    r.eventsReceived = st.columnInt(11);
    r.eventsStored = st.columnInt(12);
    if (!st.columnNull(13)) r.eventsSent = st.columnInt(13);
    if (!st.columnNull(14)) r.eventsDropped = st.columnInt(14);
    r.liveBlocksAtEnd = st.columnInt(15);
    r.blocks = st.columnInt(16);
    r.steps = st.columnInt(17);
    r.analyzed = st.columnInt(18) != 0;
    if (!st.columnNull(19)) r.header.ownerUid = st.columnInt(19);
    if (!st.columnNull(20)) r.rawPrunedWallNs = st.columnInt(20);
    if (!st.columnNull(21)) r.endWallNs = st.columnInt(21);
    r.jobId = st.columnInt(22);
    r.header.rank = st.columnNull(23) ? -1 : static_cast<int32_t>(st.columnInt(23));
    r.header.localRank = st.columnNull(24) ? -1 : static_cast<int32_t>(st.columnInt(24));
    r.header.worldSize = static_cast<int32_t>(st.columnInt(25));
    r.header.jobKey = st.columnText(26);
    r.daemon = st.columnText(27);
    out.push_back(std::move(r));
  }
  if (st.failed()) return readFailed(st);
  Statement stats = db.prepare(
      "SELECT name, severity, value, description FROM stat WHERE session_id = ?1 ORDER BY name");
  for (SessionRecord& r : out) {
    stats.bind(1, r.id);
    while (stats.step()) {
      r.stats.push_back(
          {stats.columnText(0), stats.columnText(1), stats.columnInt(2), stats.columnText(3)});
    }
    if (stats.failed()) return readFailed(stats);
    stats.reset();
  }
  return out;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::open(const std::string& path, int64_t cacheBytes,
                                                   std::string daemonName) {
  if (isPostgresLocator(path)) {
    auto store = openPostgres(path);
    if (store.ok()) (*store)->m_daemonName = std::move(daemonName);
    return store;
  }
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::unique_ptr<Store> store(new Store(path));
  store->m_daemonName = std::move(daemonName);
  if (auto s = Database::open(path, false, &store->m_db); !s.ok()) return s;
  // auto_vacuum before the first table: a new store gives the pages of deleted sessions back to
  // the file system (releaseFreePages). On an existing store it changes nothing.
  if (auto s = store->m_db.exec(
          "PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
          "PRAGMA cache_size=-" +
          std::to_string(std::max<int64_t>(1024, cacheBytes / 1024)) + ";");
      !s.ok()) {
    return absl::UnavailableError(path + " is not a usable SQLite database: " + s.ToString());
  }
  if (auto s = store->m_db.exec(std::string(kSchemaSql) + kStepCountTriggersSqlite); !s.ok()) {
    return absl::FailedPreconditionError("cannot apply the schema to " + path + ": " +
                                         std::string(s.message()));
  }
  // Forward-only migrations: a store written by a newer tidemark is refused, not rewritten.
  Statement version = store->m_db.prepare("SELECT value FROM meta WHERE key = 'schema_version'");
  if (version.step()) {
    const int found = std::stoi(version.columnText(0));
    version = Statement();
    if (found > kSchemaVersion) {
      return absl::FailedPreconditionError(path + " has schema version " + std::to_string(found) +
                                           ", newer than this tidemarkd's " +
                                           std::to_string(kSchemaVersion));
    }
    if (found < 2) {
      // 2: sessions record their owner; older ones are the store owner's (left NULL).
      if (auto s =
              store->m_db.exec("BEGIN IMMEDIATE; ALTER TABLE session ADD COLUMN owner_uid INTEGER; "
                               "UPDATE meta SET value = '2' WHERE key = 'schema_version'; COMMIT;");
          !s.ok()) {
        return absl::FailedPreconditionError("cannot migrate " + path +
                                             " to schema version 2: " + std::string(s.message()));
      }
    }
    if (found < 3) {
      // 3: sessions whose raw events retention dropped say so; the daemon's clock at the end.
      if (auto s = store->m_db.exec(
              "BEGIN IMMEDIATE; ALTER TABLE session ADD COLUMN raw_pruned_wall_ns INTEGER; "
              "ALTER TABLE session ADD COLUMN end_wall_ns INTEGER; "
              "UPDATE meta SET value = '3' WHERE key = 'schema_version'; COMMIT;");
          !s.ok()) {
        return absl::FailedPreconditionError("cannot migrate " + path +
                                             " to schema version 3: " + std::string(s.message()));
      }
    }
    if (found < 4) {
      // 4: the peak's tensors keep their block's address.
      if (auto s =
              store->m_db.exec("BEGIN IMMEDIATE; ALTER TABLE peak_item ADD COLUMN address INTEGER; "
                               "UPDATE meta SET value = '4' WHERE key = 'schema_version'; COMMIT;");
          !s.ok()) {
        return absl::FailedPreconditionError("cannot migrate " + path +
                                             " to schema version 4: " + std::string(s.message()));
      }
    }
    Statement hasJobs = store->m_db.prepare(
        "SELECT count(*) FROM pragma_table_info('session') WHERE name = 'job_id'");
    const bool jobColumns = hasJobs.step() && hasJobs.columnInt(0) > 0;
    hasJobs = Statement();
    Statement hasDaemon = store->m_db.prepare(
        "SELECT count(*) FROM pragma_table_info('session') WHERE name = 'daemon'");
    const bool daemonColumn = hasDaemon.step() && hasDaemon.columnInt(0) > 0;
    hasDaemon = Statement();
    if (found < 6 && !daemonColumn) {
      // 6: the daemon that ingests each session (stores shared by several daemons).
      if (auto s = store->m_db.exec("ALTER TABLE session ADD COLUMN daemon TEXT"); !s.ok()) {
        return absl::FailedPreconditionError("cannot migrate " + path +
                                             " to schema version 6: " + std::string(s.message()));
      }
    }
    if (found < 5) {
      // 5: sessions that are ranks of a training job (the job table is new: made by the schema).
      if (auto s = store->m_db.exec(std::string("BEGIN IMMEDIATE; ") +
                                    (jobColumns
                                         ? ""
                                         : "ALTER TABLE session ADD COLUMN job_id INTEGER; "
                                           "ALTER TABLE session ADD COLUMN rank INTEGER; "
                                           "ALTER TABLE session ADD COLUMN local_rank INTEGER; "
                                           "ALTER TABLE session ADD COLUMN world_size INTEGER; ") +
                                    "COMMIT;");
          !s.ok()) {
        return absl::FailedPreconditionError("cannot migrate " + path +
                                             " to schema version 5: " + std::string(s.message()));
      }
    }
  } else {
    if (auto s = store->m_db.exec("INSERT INTO meta(key, value) VALUES ('schema_version', '" +
                                  std::to_string(kSchemaVersion) + "')");
        !s.ok()) {
      return s;
    }
  }
  if (auto s = store->m_db.exec("UPDATE meta SET value = '" + std::to_string(kSchemaVersion) +
                                "' WHERE key = 'schema_version'");
      !s.ok()) {
    return s;
  }
  // After the migrations: a store older than schema 5 has no job_id column before them.
  if (auto s = store->m_db.exec("CREATE INDEX IF NOT EXISTS session_by_job ON session(job_id)");
      !s.ok()) {
    return s;
  }
  if (auto s = store->prepareStatements(); !s.ok()) return s;
  return store;
}

absl::StatusOr<std::unique_ptr<Store>> Store::openPostgres(const std::string& uri) {
  std::unique_ptr<Store> store(new Store(uri));
  if (auto s = Database::open(uri, false, &store->m_db); !s.ok()) return s;
  // The schema (the same tables as SQLite's, in PostgreSQL's types), made once: daemons that
  // start together wait for each other's transaction (a lock of the transaction, released at
  // its commit), and then find the tables there.
  const std::string where = displayLocator(uri);
  if (auto s = store->m_db.exec("BEGIN; SELECT pg_advisory_xact_lock(7205759403792793600); " +
                                postgresDdl(kSchemaSql) +
                                "CREATE INDEX IF NOT EXISTS session_by_job ON session(job_id);" +
                                "CREATE SEQUENCE IF NOT EXISTS allocation_id_ranges INCREMENT BY " +
                                std::to_string(kBlockIdRange) + ";" + kStepCountTriggersPostgres);
      !s.ok()) {
    store->m_db.exec("ROLLBACK").IgnoreError();
    return absl::FailedPreconditionError("cannot apply the schema to " + where + ": " +
                                         std::string(s.message()));
  }
  Statement version = store->m_db.prepare("SELECT value FROM meta WHERE key = 'schema_version'");
  if (version.step()) {
    const int found = std::stoi(version.columnText(0));
    version = Statement();
    if (found != kSchemaVersion) {
      store->m_db.exec("ROLLBACK").IgnoreError();
      return absl::FailedPreconditionError(
          where + " has schema version " + std::to_string(found) + ", this tidemarkd's is " +
          std::to_string(kSchemaVersion) +
          (found > kSchemaVersion ? " (a newer tidemark made it)"
                                  : " (PostgreSQL stores are not migrated yet)"));
    }
  } else {
    version = Statement();
    if (auto s = store->m_db.exec("INSERT INTO meta(key, value) VALUES ('schema_version', '" +
                                  std::to_string(kSchemaVersion) + "')");
        !s.ok()) {
      store->m_db.exec("ROLLBACK").IgnoreError();
      return s;
    }
  }
  if (auto s = store->m_db.exec("COMMIT"); !s.ok()) return s;
  if (auto s = store->prepareStatements(); !s.ok()) return s;
  return store;
}

absl::Status Store::prepareStatements() {
  m_insertSession = m_db.prepare(
      "INSERT INTO session(name, pid, hostname, command_line, protocol_version, agent_version, "
      "start_ts_ns, start_wall_ns, state, owner_uid, job_id, rank, local_rank, world_size, "
      "daemon) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?9, ?10, ?11, ?12, ?13, ?14) "
      "RETURNING id");
  m_insertString = m_db.prepare(
      "INSERT INTO string(session_id, iid, value) VALUES (?1, ?2, ?3) "
      "ON CONFLICT (session_id, iid) DO UPDATE SET value = excluded.value");
  m_insertBlock = m_db.prepare(
      "INSERT INTO allocation(session_id, address, size_bytes, memory_kind, device, stream, "
      "thread_id, alloc_seq, alloc_ts_ns, free_seq, free_ts_ns) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
  m_insertTag = m_db.prepare(
      "INSERT INTO tag(session_id, seq, ts_ns, address, size_bytes, category, name_id) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  m_insertScope = m_db.prepare(
      "INSERT INTO scope(session_id, thread_id, name_id, depth, begin_seq, begin_ts_ns, end_seq, "
      "end_ts_ns, kind) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  m_insertPhase = m_db.prepare(
      "INSERT INTO phase(session_id, thread_id, phase, begin_seq, begin_ts_ns, end_seq, "
      "end_ts_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  m_insertStep = m_db.prepare(
      "INSERT INTO step(session_id, step, begin_seq, begin_ts_ns, end_seq, end_ts_ns) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (session_id, step) DO UPDATE SET "
      "begin_seq = excluded.begin_seq, begin_ts_ns = excluded.begin_ts_ns, "
      "end_seq = excluded.end_seq, end_ts_ns = excluded.end_ts_ns, inferred = 0");
  m_insertStepFigure = m_db.prepare(
      "INSERT INTO step_figure(session_id, step, device, figure, category, ts_ns, "
      "value) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (session_id, step, device, figure, "
      "category) DO UPDATE SET ts_ns = excluded.ts_ns, value = excluded.value");
  m_addCounts = m_db.prepare(
      "UPDATE session SET events_received = events_received + ?2, "
      "events_stored = events_stored + ?3, block_count = block_count + ?6, "
      "first_block_id = COALESCE(first_block_id, ?4), "
      "last_block_id = COALESCE(?5, last_block_id) WHERE id = ?1");
  m_endSession = m_db.prepare(
      "UPDATE session SET state = ?2, end_ts_ns = ?3, events_sent = ?4, events_dropped = ?5, "
      "live_blocks_at_end = ?6, end_wall_ns = ?7 WHERE id = ?1");
  m_upsertStat = m_db.prepare(
      "INSERT INTO stat(session_id, name, severity, value, description) "
      "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(session_id, name) DO UPDATE SET "
      "value = stat.value + excluded.value");
  if (isPostgres(m_db)) {
    m_reserveBlockIds = m_db.prepare("SELECT nextval('allocation_id_ranges')");
    if (auto s = checkPrepared(m_reserveBlockIds, m_db); !s.ok()) return s;
  }
  for (const Statement* st : {&m_insertSession, &m_insertString, &m_insertBlock, &m_insertTag,
                              &m_insertScope, &m_insertPhase, &m_insertStep, &m_insertStepFigure,
                              &m_addCounts, &m_endSession, &m_upsertStat}) {
    if (auto s = checkPrepared(*st, m_db); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Store::begin() { return m_db.exec(isPostgres(m_db) ? "BEGIN" : "BEGIN IMMEDIATE"); }
absl::Status Store::commit() { return m_db.exec("COMMIT"); }
absl::Status Store::rollback() { return m_db.exec("ROLLBACK"); }

absl::StatusOr<int64_t> Store::createSession(const SessionHeader& h) {
  m_insertSession.bind(1, h.name).bind(2, h.pid).bind(3, h.hostname).bind(4, h.commandLine);
  m_insertSession.bind(5, h.protocolVersion).bind(6, h.agentVersion).bind(7, h.startTsNs);
  m_insertSession.bind(8, h.startWallNs);
  if (h.ownerUid) {
    m_insertSession.bind(9, *h.ownerUid);
  } else {
    m_insertSession.bindNull(9);
  }
  if (h.jobKey.empty()) {
    m_insertSession.bindNull(10).bindNull(11).bindNull(12).bindNull(13);
  } else {
    auto job = jobFor(h);
    if (!job.ok()) return job.status();
    m_insertSession.bind(10, *job);
    if (h.rank >= 0) {
      m_insertSession.bind(11, h.rank);
    } else {
      m_insertSession.bindNull(11);
    }
    if (h.localRank >= 0) {
      m_insertSession.bind(12, h.localRank);
    } else {
      m_insertSession.bindNull(12);
    }
    if (h.worldSize > 0) {
      m_insertSession.bind(13, h.worldSize);
    } else {
      m_insertSession.bindNull(13);
    }
  }
  m_insertSession.bind(14, m_daemonName);
  return runReturningId(m_insertSession);
}

absl::Status Store::addStat(int64_t session, const StatRow& st) {
  m_upsertStat.bind(1, session).bind(2, st.name).bind(3, st.severity).bind(4, st.value);
  m_upsertStat.bind(5, st.description);
  return m_upsertStat.run();
}

absl::StatusOr<int64_t> Store::jobFor(const SessionHeader& h) {
  if (isPostgres(m_db)) {
    // Daemons sharing the store take ranks of one job at the same moment: each waits for the
    // other's transaction (a lock of the database on this key, held to its commit), then finds
    // the job the other made rather than making a second.
    Statement lock = m_db.prepare("SELECT pg_advisory_xact_lock(hashtext(?1), ?2)");
    lock.bind(1, h.jobKey).bind(2, static_cast<int>(h.ownerUid.value_or(-1)));
    if (auto s = lock.run(); !s.ok()) return s;
  }
  // The owner's newest job of this key, if this rank could be one of it: begun within the
  // window and without this rank yet (a rerun of the job, which repeats its ranks, is a new one).
  Statement newest = m_db.prepare(
      "SELECT id, start_wall_ns FROM job WHERE key = ?1 AND owner_uid IS NOT DISTINCT FROM ?2 "
      "ORDER BY id DESC LIMIT 1");
  if (auto s = checkPrepared(newest, m_db); !s.ok()) return s;
  newest.bind(1, h.jobKey);
  if (h.ownerUid) {
    newest.bind(2, *h.ownerUid);
  } else {
    newest.bindNull(2);
  }
  if (newest.step() && std::llabs(h.startWallNs - newest.columnInt(1)) <= kJobJoinWindowNs) {
    const int64_t job = newest.columnInt(0);
    bool taken = false;
    if (h.rank >= 0) {
      Statement same = m_db.prepare("SELECT 1 FROM session WHERE job_id = ?1 AND rank = ?2");
      if (auto s = checkPrepared(same, m_db); !s.ok()) return s;
      same.bind(1, job).bind(2, h.rank);
      taken = same.step();
    }
    if (!taken) {
      if (h.worldSize > 0) {
        Statement world = m_db.prepare(
            "UPDATE job SET world_size = CASE WHEN world_size > ?2 THEN world_size "
            "ELSE ?2 END WHERE id = ?1");
        if (auto s = checkPrepared(world, m_db); !s.ok()) return s;
        world.bind(1, job).bind(2, h.worldSize);
        if (auto s = world.run(); !s.ok()) return s;
      }
      return job;
    }
  }
  newest = Statement();
  Statement insert = m_db.prepare(
      "INSERT INTO job(key, owner_uid, world_size, start_wall_ns) VALUES (?1, ?2, ?3, ?4) "
      "RETURNING id");
  if (auto s = checkPrepared(insert, m_db); !s.ok()) return s;
  insert.bind(1, h.jobKey).bind(3, std::max(0, h.worldSize)).bind(4, h.startWallNs);
  if (h.ownerUid) {
    insert.bind(2, *h.ownerUid);
  } else {
    insert.bindNull(2);
  }
  return runReturningId(insert);
}

namespace {
// Rows in COPY's text format: tab-separated, \N for NULL, a line each (numbers only).
class CopyText {
 public:
  CopyText& num(int64_t v) {
    sep();
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    m_text.append(buf, r.ptr);
    return *this;
  }
  CopyText& null() {
    sep();
    m_text += "\\N";
    return *this;
  }
  // An interval's end: NULL while open.
  CopyText& end(uint64_t endSeq, int64_t endTs) {
    if (endSeq == core::kOpenSeq) return null().null();
    return num(s64(endSeq)).num(endTs);
  }
  void row() {
    m_text += '\n';
    m_first = true;
  }
  const std::string& text() const { return m_text; }
  bool empty() const { return m_text.empty(); }

 private:
  void sep() {
    if (!m_first) m_text += '\t';
    m_first = false;
  }
  std::string m_text;
  bool m_first = true;
};
}  // namespace

absl::StatusOr<std::pair<int64_t, int64_t>> Store::copyBulkRows(const SessionRows& r) {
  const int64_t sid = r.sessionId;
  std::pair<int64_t, int64_t> range{0, 0};
  if (!r.blocks.empty()) {
    // The blocks' ids: from a range of kBlockIdRange this daemon took from the store's sequence
    // (other daemons take theirs from it at the same time), in increasing order, so that the
    // session's rows lie in [first, last] as with SQLite (with other daemons' between them).
    CopyText rows;
    for (size_t i = 0; i < r.blocks.size(); ++i) {
      if (m_nextBlockId == m_blockIdsEnd) {
        if (!m_reserveBlockIds.step()) {
          const std::string why = m_reserveBlockIds.error();
          m_reserveBlockIds.reset();
          return absl::InternalError("cannot reserve block ids: " + why);
        }
        m_nextBlockId = m_reserveBlockIds.columnInt(0);
        m_blockIdsEnd = m_nextBlockId + kBlockIdRange;
        m_reserveBlockIds.reset();
      }
      const int64_t id = m_nextBlockId++;
      if (i == 0) range.first = id;
      range.second = id;
      const BlockRow& b = r.blocks[i];
      rows.num(id).num(sid).num(s64(b.address)).num(s64(b.sizeBytes)).num(b.memoryKind);
      rows.num(b.device).num(s64(b.stream)).num(b.threadId).num(s64(b.allocSeq));
      rows.num(b.allocTsNs).end(b.freeSeq, b.freeTsNs).row();
    }
    if (auto s = m_db.copyIn("allocation",
                             "id, session_id, address, size_bytes, memory_kind, device, stream, "
                             "thread_id, alloc_seq, alloc_ts_ns, free_seq, free_ts_ns",
                             rows.text());
        !s.ok()) {
      return s;
    }
  }
  if (!r.tags.empty()) {
    CopyText rows;
    for (const TagRow& t : r.tags) {
      rows.num(sid).num(s64(t.seq)).num(t.tsNs).num(s64(t.address)).num(s64(t.sizeBytes));
      rows.num(t.category).num(t.nameIid).row();
    }
    if (auto s = m_db.copyIn(
            "tag", "session_id, seq, ts_ns, address, size_bytes, category, name_id", rows.text());
        !s.ok()) {
      return s;
    }
  }
  CopyText scopes, launches, phases;
  for (const IntervalRow& i : r.scopes) {
    scopes.num(sid).num(i.threadId).num(i.nameIid).num(i.depth).num(s64(i.beginSeq));
    scopes.num(i.beginTsNs).end(i.endSeq, i.endTsNs).num(i.kind).row();
    if (i.correlationId != 0) launches.num(sid).num(s64(i.beginSeq)).num(i.correlationId).row();
  }
  for (const IntervalRow& i : r.phases) {
    phases.num(sid).num(i.threadId).num(i.phase).num(s64(i.beginSeq)).num(i.beginTsNs);
    phases.end(i.endSeq, i.endTsNs).row();
  }
  const std::tuple<const char*, const char*, const CopyText*> tables[] = {
      {"scope",
       "session_id, thread_id, name_id, depth, begin_seq, begin_ts_ns, end_seq, end_ts_ns, kind",
       &scopes},
      {"kernel_launch", "session_id, kernel_begin_seq, correlation_id", &launches},
      {"phase", "session_id, thread_id, phase, begin_seq, begin_ts_ns, end_seq, end_ts_ns",
       &phases}};
  for (const auto& [table, columns, rows] : tables) {
    if (rows->empty()) continue;
    if (auto s = m_db.copyIn(table, columns, rows->text()); !s.ok()) return s;
  }
  return range;
}

absl::Status Store::writeRows(const SessionRows& r) {
  const int64_t sid = r.sessionId;
  for (const auto& [iid, value] : r.strings) {
    m_insertString.bind(1, sid).bind(2, iid).bind(3, value);
    if (auto s = m_insertString.run(); !s.ok()) return s;
  }
  int64_t firstBlock = 0;
  int64_t lastBlock = 0;
  if (isPostgres(m_db)) {
    auto range = copyBulkRows(r);
    if (!range.ok()) return range.status();
    std::tie(firstBlock, lastBlock) = *range;
  } else {
    for (const BlockRow& b : r.blocks) {
      m_insertBlock.bind(1, sid).bind(2, s64(b.address)).bind(3, s64(b.sizeBytes));
      m_insertBlock.bind(4, b.memoryKind).bind(5, b.device).bind(6, s64(b.stream));
      m_insertBlock.bind(7, b.threadId).bind(8, s64(b.allocSeq)).bind(9, b.allocTsNs);
      bindEnd(m_insertBlock, 10, b.freeSeq, b.freeTsNs);
      if (auto s = m_insertBlock.run(); !s.ok()) return s;
      if (firstBlock == 0) firstBlock = m_db.lastInsertId();
    }
    if (!r.blocks.empty()) lastBlock = m_db.lastInsertId();
    for (const TagRow& t : r.tags) {
      m_insertTag.bind(1, sid).bind(2, s64(t.seq)).bind(3, t.tsNs).bind(4, s64(t.address));
      m_insertTag.bind(5, s64(t.sizeBytes)).bind(6, t.category).bind(7, t.nameIid);
      if (auto s = m_insertTag.run(); !s.ok()) return s;
    }
  }
  if (!r.stacks.empty()) {
    // Imported recordings only: prepared per batch rather than kept.
    Statement ins = m_db.prepare(
        "INSERT INTO stack(session_id, seq, ts_ns, address, frames_id) VALUES (?1, ?2, ?3, ?4, "
        "?5)");
    for (const StackRow& st : r.stacks) {
      ins.bind(1, sid).bind(2, s64(st.seq)).bind(3, st.tsNs).bind(4, s64(st.address));
      ins.bind(5, st.framesIid);
      if (auto s = ins.run(); !s.ok()) return s;
    }
  }
  if (!r.counters.empty()) {
    // Rare (imported recordings): prepared per batch rather than kept.
    Statement ins = m_db.prepare(
        "INSERT INTO counter(session_id, seq, ts_ns, name_id, value) VALUES (?1, ?2, ?3, ?4, ?5)");
    for (const CounterRow& c : r.counters) {
      ins.bind(1, sid).bind(2, s64(c.seq)).bind(3, c.tsNs).bind(4, c.nameIid).bind(5, c.value);
      if (auto s = ins.run(); !s.ok()) return s;
    }
  }
  if (!r.launches.empty()) {
    Statement ins = m_db.prepare(
        "INSERT INTO launch(session_id, correlation_id, thread_id, seq, ts_ns) "
        "VALUES (?1, ?2, ?3, ?4, ?5)");
    for (const LaunchRow& l : r.launches) {
      ins.bind(1, sid).bind(2, l.correlationId).bind(3, l.threadId).bind(4, s64(l.seq));
      ins.bind(5, l.tsNs);
      if (auto s = ins.run(); !s.ok()) return s;
    }
  }
  if (!isPostgres(m_db)) {
    std::optional<Statement> kernelLaunch;
    for (const IntervalRow& i : r.scopes) {
      m_insertScope.bind(1, sid).bind(2, i.threadId).bind(3, i.nameIid).bind(4, i.depth);
      m_insertScope.bind(5, s64(i.beginSeq)).bind(6, i.beginTsNs);
      bindEnd(m_insertScope, 7, i.endSeq, i.endTsNs);
      m_insertScope.bind(9, i.kind);
      if (auto s = m_insertScope.run(); !s.ok()) return s;
      if (i.correlationId != 0) {
        if (!kernelLaunch)
          kernelLaunch = m_db.prepare(
              "INSERT INTO kernel_launch(session_id, kernel_begin_seq, correlation_id) "
              "VALUES (?1, ?2, ?3)");
        kernelLaunch->bind(1, sid).bind(2, s64(i.beginSeq)).bind(3, i.correlationId);
        if (auto s = kernelLaunch->run(); !s.ok()) return s;
      }
    }
    for (const IntervalRow& i : r.phases) {
      m_insertPhase.bind(1, sid).bind(2, i.threadId).bind(3, i.phase);
      m_insertPhase.bind(4, s64(i.beginSeq)).bind(5, i.beginTsNs);
      bindEnd(m_insertPhase, 6, i.endSeq, i.endTsNs);
      if (auto s = m_insertPhase.run(); !s.ok()) return s;
    }
  }
  for (const StepRow& st : r.steps) {
    m_insertStep.bind(1, sid).bind(2, st.step).bind(3, s64(st.beginSeq)).bind(4, st.beginTsNs);
    bindEnd(m_insertStep, 5, st.endSeq, st.endTsNs);
    if (auto s = m_insertStep.run(); !s.ok()) return s;
  }
  for (const StepFigureRow& f : r.stepFigures) {
    m_insertStepFigure.bind(1, sid).bind(2, f.step).bind(3, f.device).bind(4, f.figure);
    m_insertStepFigure.bind(5, f.category).bind(6, f.tsNs).bind(7, f.value);
    if (auto s = m_insertStepFigure.run(); !s.ok()) return s;
  }
  for (const core::TimelineChunk& c : r.timelineChunks) {
    if (auto s = writeTimelineChunk(sid, c.level, c.index, c.samples); !s.ok()) return s;
  }
  for (const auto& [chunk, codes] : r.blockCodes) {
    if (auto s = writeBlockCodes(sid, chunk, codes); !s.ok()) return s;
  }
  std::vector<const core::PeakReport*> stepPeaks;
  stepPeaks.reserve(r.stepPeaks.size());
  for (const core::SharedPeakReport& p : r.stepPeaks) stepPeaks.push_back(p.get());
  if (auto s = writePeaks(sid, stepPeaks); !s.ok()) return s;
  if (r.eventsReceived != 0 || r.eventsStored != 0 || firstBlock != 0) {
    m_addCounts.bind(1, sid).bind(2, r.eventsReceived).bind(3, r.eventsStored);
    m_addCounts.bind(6, static_cast<int64_t>(r.blocks.size()));
    if (firstBlock != 0) {
      m_addCounts.bind(4, firstBlock).bind(5, lastBlock);
    } else {
      m_addCounts.bindNull(4).bindNull(5);
    }
    if (auto s = m_addCounts.run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Store::endSession(const SessionEnd& e) {
  m_endSession.bind(1, e.sessionId).bind(2, e.state).bind(3, e.endTsNs);
  if (e.eventsSent) {
    m_endSession.bind(4, *e.eventsSent);
  } else {
    m_endSession.bindNull(4);
  }
  if (e.eventsDropped) {
    m_endSession.bind(5, *e.eventsDropped);
  } else {
    m_endSession.bindNull(5);
  }
  m_endSession.bind(6, e.liveBlocksAtEnd);
  m_endSession.bind(7, std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  if (auto s = m_endSession.run(); !s.ok()) return s;
  {
    for (const char* table : {"ingest_checkpoint", "ingest_block_delta"}) {
      Statement del = m_db.prepare(std::string("DELETE FROM ") + table + " WHERE session_id = ?1");
      del.bind(1, e.sessionId);
      if (auto s = del.run(); !s.ok()) return s;
    }
  }
  for (const StatRow& st : e.stats) {
    if (auto s = addStat(e.sessionId, st); !s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {
// Blocks packed as eight little-endian 64-bit fields each (a layout of its own, not the struct's,
// so that a daemon of another build reads it).
constexpr size_t kPackedBlockBytes = 64;

std::string packBlocks(const std::vector<BlockRow>& blocks) {
  std::string out(blocks.size() * kPackedBlockBytes, '\0');
  char* p = out.data();
  auto put = [&p](uint64_t v) {
    for (int k = 0; k < 8; ++k) *p++ = static_cast<char>((v >> (8 * k)) & 0xff);
  };
  for (const BlockRow& b : blocks) {
    put(static_cast<uint64_t>(static_cast<int64_t>(b.memoryKind)));
    put(static_cast<uint64_t>(static_cast<int64_t>(b.device)));
    put(b.address);
    put(b.sizeBytes);
    put(b.stream);
    put(b.threadId);
    put(b.allocSeq);
    put(static_cast<uint64_t>(b.allocTsNs));
  }
  return out;
}

bool unpackBlocks(std::string_view data, std::vector<BlockRow>* out) {
  if (data.size() % kPackedBlockBytes != 0) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  auto get = [&p] {
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= static_cast<uint64_t>(*p++) << (8 * k);
    return v;
  };
  for (size_t i = 0; i < data.size() / kPackedBlockBytes; ++i) {
    BlockRow b;
    b.memoryKind = static_cast<int>(static_cast<int64_t>(get()));
    b.device = static_cast<int32_t>(static_cast<int64_t>(get()));
    b.address = get();
    b.sizeBytes = get();
    b.stream = get();
    b.threadId = static_cast<uint32_t>(get());
    b.allocSeq = get();
    b.allocTsNs = static_cast<int64_t>(get());
    out->push_back(b);
  }
  return true;
}
}  // namespace

absl::Status Store::saveCheckpoint(int64_t sessionId, uint64_t batchSeq, const std::string& state,
                                   bool full, const std::vector<BlockRow>& opened,
                                   const std::vector<BlockRow>& closed) {
  if (full) {
    Statement st = m_db.prepare(
        "INSERT INTO ingest_checkpoint(session_id, batch_seq, state, open_blocks) "
        "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (session_id) DO UPDATE SET "
        "batch_seq = excluded.batch_seq, state = excluded.state, "
        "open_blocks = excluded.open_blocks");
    if (auto s = checkPrepared(st, m_db); !s.ok()) return s;
    st.bind(1, sessionId).bind(2, s64(batchSeq)).bindBlob(3, state).bindBlob(4, packBlocks(opened));
    if (auto s = st.run(); !s.ok()) return s;
    Statement del = m_db.prepare("DELETE FROM ingest_block_delta WHERE session_id = ?1");
    del.bind(1, sessionId);
    return del.run();
  }
  Statement st = m_db.prepare(
      "INSERT INTO ingest_checkpoint(session_id, batch_seq, state, open_blocks) "
      "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(session_id) DO UPDATE SET "
      "batch_seq = excluded.batch_seq, state = excluded.state");
  if (auto s = checkPrepared(st, m_db); !s.ok()) return s;
  st.bind(1, sessionId).bind(2, s64(batchSeq)).bindBlob(3, state).bindBlob(4, "");
  if (auto s = st.run(); !s.ok()) return s;
  if (opened.empty() && closed.empty()) return absl::OkStatus();
  Statement delta = m_db.prepare(
      "INSERT INTO ingest_block_delta(session_id, closed, opened) VALUES (?1, ?2, ?3)");
  if (auto s = checkPrepared(delta, m_db); !s.ok()) return s;
  delta.bind(1, sessionId).bindBlob(2, packBlocks(closed)).bindBlob(3, packBlocks(opened));
  return delta.run();
}

bool Store::isOwnSession(const std::string& path, const SessionRecord& record,
                         const std::string& daemon) {
  return !isPostgresLocator(path) || record.daemon.empty() || record.daemon == daemon;
}

namespace {
// The condition on `session` rows (alias s) that keeps a daemon's own (Store::isOwnSession);
// its name is parameter ?1.
std::string ownSessions(const std::string& path) {
  return isPostgresLocator(path) ? "(s.daemon IS NULL OR s.daemon = ?1)" : "?1 = ?1";
}
}  // namespace

absl::StatusOr<std::vector<SessionRecord>> Store::liveSessions(const std::string& path,
                                                               const std::string& daemon) {
  auto live = readSessions(path, "WHERE state = 1", 0, -1, false);
  if (!live.ok()) return live;
  std::erase_if(*live, [&](const SessionRecord& r) { return !isOwnSession(path, r, daemon); });
  return live;
}

absl::StatusOr<std::vector<HandoffRow>> Store::pendingHandoffs(const std::string& path,
                                                               const std::string& daemon) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT h.session_id, h.path, h.owner_uid, h.device, h.inode FROM handoff h JOIN session s "
      "ON s.id = h.session_id WHERE " +
      ownSessions(path) + " ORDER BY h.session_id");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  st.bind(1, daemon);
  std::vector<HandoffRow> out;
  while (st.step()) {
    out.push_back(
        {st.columnInt(0), st.columnText(1), st.columnInt(2), st.columnInt(3), st.columnInt(4)});
  }
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<std::optional<Store::StoredCheckpoint>> Store::loadCheckpoint(
    const std::string& path, int64_t id) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st =
      db.prepare("SELECT state, open_blocks FROM ingest_checkpoint WHERE session_id = ?1");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  st.bind(1, id);
  if (!st.step()) {
    if (st.failed()) return readFailed(st);
    return std::optional<StoredCheckpoint>();
  }
  const auto damaged = [] { return absl::DataLossError("the checkpoint's blocks are damaged"); };
  StoredCheckpoint out;
  out.state = std::string(st.columnBlob(0));
  std::vector<BlockRow> blocks;
  if (!unpackBlocks(st.columnBlob(1), &blocks)) return damaged();
  // The full list, then the changes after it in order.
  using Key = std::tuple<int, int32_t, uint64_t>;
  std::map<Key, BlockRow> open;
  for (const BlockRow& b : blocks) open[Key{b.memoryKind, b.device, b.address}] = b;
  Statement deltas =
      db.prepare("SELECT closed, opened FROM ingest_block_delta WHERE session_id = ?1 ORDER BY id");
  if (!deltas.ok()) return absl::InternalError("query failed: " + db.error());
  deltas.bind(1, id);
  while (deltas.step()) {
    std::vector<BlockRow> closed, opened;
    if (!unpackBlocks(deltas.columnBlob(0), &closed) ||
        !unpackBlocks(deltas.columnBlob(1), &opened)) {
      return damaged();
    }
    for (const BlockRow& b : closed) open.erase(Key{b.memoryKind, b.device, b.address});
    for (const BlockRow& b : opened) open[Key{b.memoryKind, b.device, b.address}] = b;
  }
  if (deltas.failed()) return readFailed(deltas);
  out.openBlocks.reserve(open.size());
  for (const auto& [key, b] : open) out.openBlocks.push_back(b);
  return std::optional<StoredCheckpoint>(std::move(out));
}

absl::StatusOr<std::map<int64_t, std::string>> Store::loadCheckpointStates(
    const std::string& path, const std::vector<int64_t>& ids) {
  std::map<int64_t, std::string> out;
  if (ids.empty()) return out;
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare("SELECT state FROM ingest_checkpoint WHERE session_id = ?1");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  for (int64_t id : ids) {
    st.reset();
    st.bind(1, id);
    if (st.step()) {
      out[id] = std::string(st.columnBlob(0));
    } else if (st.failed()) {
      return readFailed(st);
    }
  }
  return out;
}

absl::Status Store::clearAnalysis(int64_t sid) {
  {
    Statement del = m_db.prepare("DELETE FROM step WHERE session_id = ?1 AND inferred = 1");
    del.bind(1, sid);
    if (auto s = del.run(); !s.ok()) return s;
  }
  for (const char* table :
       {"block_category", "timeline_chunk", "peak", "peak_category", "peak_item"}) {
    Statement del = m_db.prepare(std::string("DELETE FROM ") + table + " WHERE session_id = ?1");
    del.bind(1, sid);
    if (auto s = del.run(); !s.ok()) return s;
  }
  Statement mark = m_db.prepare("UPDATE session SET analyzed = 0 WHERE id = ?1");
  mark.bind(1, sid);
  return mark.run();
}

absl::Status Store::writeBlockCodes(int64_t sid, int64_t chunk, const std::string& codes) {
  Statement st =
      m_db.prepare("INSERT INTO block_category(session_id, chunk, codes) VALUES (?1, ?2, ?3)");
  st.bind(1, sid).bind(2, chunk).bindBlob(3, codes);
  return st.run();
}

absl::Status Store::writeTimelineChunk(int64_t sid, int level, int64_t chunk,
                                       const std::vector<core::TimelineSample>& samples) {
  if (samples.empty()) return absl::OkStatus();
  Statement st = m_db.prepare(
      "INSERT INTO timeline_chunk(session_id, level, chunk, first_ts_ns, last_ts_ns, "
      "sample_count, samples) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  st.bind(1, sid).bind(2, level).bind(3, chunk);
  st.bind(4, samples.front().firstTsNs).bind(5, samples.back().lastTsNs);
  st.bind(6, static_cast<int64_t>(samples.size()));
  st.bindBlob(7, core::encodeSamples(samples.data(), samples.size()));
  return st.run();
}

absl::Status Store::writePeaks(int64_t sid, const std::vector<const core::PeakReport*>& peaks) {
  if (peaks.empty()) return absl::OkStatus();
  Statement peak = m_db.prepare(
      "INSERT INTO peak(session_id, step, seq, ts_ns, tracked_bytes, phase, scope) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (session_id, step) DO UPDATE SET "
      "seq = excluded.seq, ts_ns = excluded.ts_ns, tracked_bytes = excluded.tracked_bytes, "
      "phase = excluded.phase, scope = excluded.scope");
  Statement peakCat = m_db.prepare(
      "INSERT INTO peak_category(session_id, step, category, bytes, blocks) "
      "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (session_id, step, category) DO UPDATE SET "
      "bytes = excluded.bytes, blocks = excluded.blocks");
  Statement dropItems = m_db.prepare("DELETE FROM peak_item WHERE session_id = ?1 AND step = ?2");
  Statement item = m_db.prepare(
      "INSERT INTO peak_item(session_id, step, kind, rank, name, category, bytes, blocks, rule, "
      "address) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)");
  for (const core::PeakReport* peakReport : peaks) {
    const core::PeakReport& p = *peakReport;
    if (!p.modules.empty() || !p.ops.empty() || !p.tensors.empty()) {
      dropItems.bind(1, sid).bind(2, p.step);
      if (auto s = dropItems.run(); !s.ok()) return s;
    }
    peak.bind(1, sid).bind(2, p.step).bind(3, s64(p.state.seq)).bind(4, p.state.tsNs);
    peak.bind(5, p.state.trackedBytes).bind(6, p.phase).bind(7, p.scope);
    if (auto s = peak.run(); !s.ok()) return s;
    // The categories it holds (a missing one reads as zero). A step's peak written again only
    // comes from a live analysis that is not exact, whose results the pass replaces whole.
    for (core::Category c : core::kAllCategories) {
      const int ci = core::categoryIndex(c);
      if (p.state.bytes[ci] == 0 && p.state.blocks[ci] == 0) continue;
      peakCat.bind(1, sid).bind(2, p.step).bind(3, static_cast<int>(c));
      peakCat.bind(4, p.state.bytes[ci]).bind(5, p.state.blocks[ci]);
      if (auto s = peakCat.run(); !s.ok()) return s;
    }
    for (const auto* list : {&p.modules, &p.ops, &p.tensors}) {
      const char* kind = list == &p.modules ? "module" : list == &p.ops ? "op" : "tensor";
      for (size_t r = 0; r < list->size(); ++r) {
        const core::PeakItem& it = (*list)[r];
        item.bind(1, sid).bind(2, p.step).bind(3, kind).bind(4, static_cast<int64_t>(r));
        item.bind(5, it.name).bind(6, static_cast<int>(it.category)).bind(7, it.bytes);
        item.bind(8, it.blocks).bind(9, static_cast<int>(it.rule)).bind(10, s64(it.address));
        if (auto s = item.run(); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Store::finishAnalysis(int64_t sid, const std::vector<core::PeakReport>& peaks,
                                   const core::CategorizeStats& stats,
                                   const std::vector<core::StepInterval>& inferredSteps) {
  std::vector<const core::PeakReport*> all;
  all.reserve(peaks.size());
  for (const core::PeakReport& p : peaks) all.push_back(&p);
  if (auto s = writePeaks(sid, all); !s.ok()) return s;
  if (stats.tagsUnmatched > 0) {
    m_upsertStat.bind(1, sid).bind(2, "tag_unmatched").bind(3, "info");
    m_upsertStat.bind(4, stats.tagsUnmatched);
    m_upsertStat.bind(5, "framework tags naming no tracked block (memory from another allocator)");
    if (auto s = m_upsertStat.run(); !s.ok()) return s;
  }
  if (!inferredSteps.empty()) {
    Statement step = m_db.prepare(
        "INSERT INTO step(session_id, step, begin_seq, begin_ts_ns, end_seq, "
        "end_ts_ns, inferred) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1) ON CONFLICT (session_id, step) "
        "DO UPDATE SET begin_seq = excluded.begin_seq, begin_ts_ns = excluded.begin_ts_ns, "
        "end_seq = excluded.end_seq, end_ts_ns = excluded.end_ts_ns, inferred = 1");
    for (const core::StepInterval& st : inferredSteps) {
      step.bind(1, sid).bind(2, st.step).bind(3, s64(st.beginSeq)).bind(4, st.beginTsNs);
      step.bind(5, s64(st.endSeq)).bind(6, st.endTsNs);
      if (auto s = step.run(); !s.ok()) return s;
    }
  }
  Statement mark = m_db.prepare("UPDATE session SET analyzed = 1 WHERE id = ?1");
  mark.bind(1, sid);
  return mark.run();
}

absl::Status rawEventsPruned(int64_t id, int64_t wallNs) {
  char when[64] = "";
  const time_t t = static_cast<time_t>(wallNs / 1000000000);
  struct tm tm {};
  if (gmtime_r(&t, &tm) != nullptr) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return absl::FailedPreconditionError(
      "the raw events of session " + std::to_string(id) + " were dropped by retention on " + when +
      " (tidemarkd --retain / --max-store); its summaries remain: tidemark sessions, steps, "
      "peak, timeline");
}

namespace {
// The tables holding a session's raw events besides its blocks (what retention drops first):
// large ones, deleted a slice at a time by rowid, and small ones.
constexpr const char* kRawRowTables[] = {
    "tag", "stack", "scope", "phase", "counter", "launch", "kernel_launch", "ingest_block_delta"};
constexpr const char* kRawSmallTables[] = {"string", "block_category", "ingest_checkpoint"};
// What remains of a pruned session, dropped with it.
constexpr const char* kSummaryTables[] = {
    "step",          "step_count", "step_figure",  "stat",    "timeline_chunk", "peak",
    "peak_category", "peak_item",  "applied_plan", "handoff", "plan_outbox"};
}  // namespace

absl::Status Store::markRawPruned(int64_t sid, int64_t wallNs) {
  Statement mark = m_db.prepare("UPDATE session SET raw_pruned_wall_ns = ?2 WHERE id = ?1");
  mark.bind(1, sid).bind(2, wallNs);
  if (auto s = mark.run(); !s.ok()) return s;
  if (m_db.changes() == 0) return absl::NotFoundError("no session " + std::to_string(sid));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Store::deleteRawSlice(int64_t sid, int64_t maxRows) {
  int64_t deleted = 0;
  auto run = [&](Statement& del) -> absl::Status {
    del.bind(1, sid).bind(2, maxRows - deleted);
    if (auto s = del.run(); !s.ok()) return s;
    deleted += m_db.changes();
    return absl::OkStatus();
  };
  {
    // The session's blocks lie in its id range (the table has no index on session_id).
    Statement del = m_db.prepare(
        "DELETE FROM allocation WHERE id IN (SELECT id FROM allocation WHERE id BETWEEN "
        "(SELECT first_block_id FROM session WHERE id = ?1) AND (SELECT last_block_id FROM "
        "session WHERE id = ?1) AND session_id = ?1 LIMIT ?2)");
    if (auto s = run(del); !s.ok()) return s;
  }
  for (const char* table : kRawRowTables) {
    if (deleted >= maxRows) break;
    // (PostgreSQL has no rowid: a row's place, ctid, serves.)
    const std::string row = isPostgres(m_db) ? "ctid" : "rowid";
    Statement del =
        m_db.prepare(std::string("DELETE FROM ") + table + " WHERE " + row + " IN (SELECT " + row +
                     " FROM " + table + " WHERE session_id = ?1 LIMIT ?2)");
    if (auto s = run(del); !s.ok()) return s;
  }
  if (deleted < maxRows) {
    // What is left is small: names, categories (a byte a block), the ingest state, and the
    // timeline's fine levels (as large as the raw events were, a sample per 64 events: the levels
    // of up to 64 chunks remain, enough for a whole-session view).
    for (const char* table : kRawSmallTables) {
      Statement del = m_db.prepare(std::string("DELETE FROM ") + table + " WHERE session_id = ?1");
      del.bind(1, sid);
      if (auto s = del.run(); !s.ok()) return s;
    }
    Statement del = m_db.prepare(
        "DELETE FROM timeline_chunk WHERE session_id = ?1 AND level IN (SELECT level FROM "
        "timeline_chunk WHERE session_id = ?1 GROUP BY level HAVING COUNT(*) > 64)");
    del.bind(1, sid);
    if (auto s = del.run(); !s.ok()) return s;
  }
  return deleted;
}

absl::Status Store::addHandoff(const HandoffRow& row) {
  Statement st = m_db.prepare(
      "INSERT INTO handoff(session_id, path, owner_uid, device, inode) "
      "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (session_id) DO UPDATE SET path = excluded.path, "
      "owner_uid = excluded.owner_uid, device = excluded.device, inode = excluded.inode");
  st.bind(1, row.sessionId).bind(2, row.path).bind(3, row.ownerUid).bind(4, row.device);
  st.bind(5, row.inode);
  return st.run();
}

absl::Status Store::removeHandoff(int64_t sessionId) {
  Statement st = m_db.prepare("DELETE FROM handoff WHERE session_id = ?1");
  st.bind(1, sessionId);
  return st.run();
}

absl::Status Store::deleteSession(int64_t sid) {
  {
    Statement find = m_db.prepare("SELECT 1 FROM session WHERE id = ?1");
    find.bind(1, sid);
    if (!find.step()) {
      if (find.failed()) return readFailed(find);
      return absl::NotFoundError("no session " + std::to_string(sid));
    }
  }
  // Whatever raw events are left (none when deleteRawSlice ran to the end before).
  if (auto s = deleteRawSlice(sid, std::numeric_limits<int64_t>::max()); !s.ok()) return s.status();
  for (const char* table : kSummaryTables) {
    Statement del = m_db.prepare(std::string("DELETE FROM ") + table + " WHERE session_id = ?1");
    del.bind(1, sid);
    if (auto s = del.run(); !s.ok()) return s;
  }
  Statement del = m_db.prepare("DELETE FROM session WHERE id = ?1");
  del.bind(1, sid);
  return del.run();
}

absl::StatusOr<int64_t> Store::bytesInUse() {
  if (isPostgres(m_db)) {
    Statement st = m_db.prepare("SELECT pg_database_size(current_database())");
    if (!st.step()) return absl::InternalError("pg_database_size failed: " + st.error());
    return st.columnInt(0);
  }
  int64_t v[3] = {0, 0, 0};
  const char* pragmas[] = {"PRAGMA page_count", "PRAGMA freelist_count", "PRAGMA page_size"};
  for (int i = 0; i < 3; ++i) {
    Statement st = m_db.prepare(pragmas[i]);
    if (!st.step()) return absl::InternalError(std::string(pragmas[i]) + " failed");
    v[i] = st.columnInt(0);
  }
  return (v[0] - v[1]) * v[2];
}

absl::StatusOr<int64_t> Store::freePageCount() {
  if (isPostgres(m_db)) return 0;  // the server's autovacuum reclaims dead rows
  Statement st = m_db.prepare("PRAGMA freelist_count");
  if (!st.step()) return absl::InternalError("PRAGMA freelist_count failed");
  return st.columnInt(0);
}

absl::Status Store::releaseFreePages(int64_t maxPages) {
  if (isPostgres(m_db)) return absl::OkStatus();
  return m_db.exec("PRAGMA incremental_vacuum(" + std::to_string(maxPages) + ")");
}

absl::StatusOr<std::vector<core::StepInterval>> Store::loadStepPage(const std::string& path,
                                                                    int64_t id,
                                                                    std::optional<int64_t> from,
                                                                    int64_t limit, bool last,
                                                                    int64_t below) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  // The primary key (session_id, step) walks the page straight to its rows.
  Statement st = db.prepare(
      std::string("SELECT step, begin_seq, begin_ts_ns, end_seq, end_ts_ns, inferred FROM step "
                  "WHERE session_id = ?1 AND step >= ?2 AND step < ?4 ORDER BY step") +
      (last ? " DESC" : "") + " LIMIT ?3");
  st.bind(1, id)
      .bind(2, from && !last ? *from : std::numeric_limits<int64_t>::min())
      .bind(3, std::max<int64_t>(0, limit))
      .bind(4, below);
  std::vector<core::StepInterval> out;
  while (st.step()) {
    out.push_back(stepRow(st));
    out.back().inferred = st.columnInt(5) != 0;
  }
  if (st.failed()) return readFailed(st);
  if (last) std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<int64_t> Store::countSteps(const std::string& path, int64_t id) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  if (hasStepCounts(db)) {  // kept by the triggers on `step`
    Statement kept = db.prepare("SELECT steps FROM step_count WHERE session_id = ?1");
    kept.bind(1, id);
    if (kept.step()) return kept.columnInt(0);
    if (kept.failed()) return readFailed(kept);
  }
  Statement st = db.prepare("SELECT COUNT(*) FROM step WHERE session_id = ?1");
  st.bind(1, id);
  if (!st.step()) return readFailed(st);
  return st.columnInt(0);
}

absl::StatusOr<std::optional<core::StepInterval>> Store::stepAt(const std::string& path, int64_t id,
                                                                uint64_t seq) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  // Steps do not overlap (a nested one is flagged by the analysis): the few begun last before
  // seq hold the answer, as core::innermost walks them.
  Statement st = db.prepare(
      "SELECT step, begin_seq, begin_ts_ns, end_seq, end_ts_ns FROM step WHERE session_id = ?1 "
      "AND begin_seq <= ?2 ORDER BY begin_seq DESC LIMIT 4");
  st.bind(1, id).bind(2, static_cast<int64_t>(seq));
  while (st.step()) {
    const core::StepInterval s = stepRow(st);
    if (s.contains(seq)) return std::optional<core::StepInterval>(s);
  }
  if (st.failed()) return readFailed(st);
  return std::optional<core::StepInterval>();
}

absl::StatusOr<std::vector<StepFigureRow>> Store::loadStepFigures(
    const std::string& path, int64_t id, std::optional<StepNumbers> steps) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT step, device, figure, category, ts_ns, value FROM step_figure WHERE session_id = ?1 "
      "AND step BETWEEN ?2 AND ?3 ORDER BY step, device, figure, category");
  st.bind(1, id)
      .bind(2, steps ? steps->first : std::numeric_limits<int64_t>::min())
      .bind(3, steps ? steps->last : std::numeric_limits<int64_t>::max());
  std::vector<StepFigureRow> out;
  while (st.step()) {
    StepFigureRow f;
    f.step = st.columnInt(0);
    f.device = static_cast<int32_t>(st.columnInt(1));
    f.figure = static_cast<int>(st.columnInt(2));
    f.category = static_cast<int>(st.columnInt(3));
    f.tsNs = st.columnInt(4);
    f.value = st.columnInt(5);
    out.push_back(f);
  }
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<core::Recording> Store::loadSteps(const std::string& path, int64_t id) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  core::Recording rec;
  if (auto s = readSteps(db, id, &rec); !s.ok()) return s;
  rec.sortBySeq();
  return rec;
}

absl::StatusOr<std::vector<int64_t>> Store::sessionsToAnalyze(const std::string& path,
                                                              const std::string& daemon) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare("SELECT id FROM session s WHERE state != 1 AND analyzed = 0 AND " +
                            ownSessions(path) + " ORDER BY id");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  st.bind(1, daemon);
  std::vector<int64_t> ids;
  while (st.step()) ids.push_back(st.columnInt(0));
  if (st.failed()) return readFailed(st);
  return ids;
}

absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> Store::loadStacks(
    const std::string& path, int64_t id, uint64_t address) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT k.seq, s.value FROM stack k JOIN string s ON s.session_id = k.session_id AND "
      "s.iid = k.frames_id WHERE k.session_id = ?1 AND k.address = ?2 ORDER BY k.seq");
  st.bind(1, id).bind(2, s64(address));
  std::vector<std::pair<uint64_t, std::string>> out;
  while (st.step()) out.emplace_back(static_cast<uint64_t>(st.columnInt(0)), st.columnText(1));
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<std::optional<int64_t>> Store::counterAt(const std::string& path, int64_t id,
                                                        const std::string& name, uint64_t seq) {
  auto values = countersAt(path, id, name, {seq});
  if (!values.ok()) return values.status();
  return values->front();
}

absl::StatusOr<std::vector<std::optional<int64_t>>> Store::countersAt(
    const std::string& path, int64_t id, const std::string& name,
    const std::vector<uint64_t>& seqs) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  // The name's interned ids first (one a stream; a session resumed on new streams may have
  // several), then one descent of the counters' index (session, name, seq) per moment: a join
  // on the name scanned every counter of the session for each moment (a GPU job's allocator
  // counters, for each of a page's 4,096 steps).
  std::vector<int64_t> iids;
  {
    Statement names = db.prepare("SELECT iid FROM string WHERE session_id = ?1 AND value = ?2");
    names.bind(1, id).bind(2, name);
    while (names.step()) iids.push_back(names.columnInt(0));
    if (names.failed()) return readFailed(names);
  }
  std::vector<std::optional<int64_t>> out(seqs.size());
  if (iids.empty()) return out;
  Statement st = db.prepare(
      "SELECT seq, value FROM counter WHERE session_id = ?1 AND name_id = ?2 AND seq <= ?3 "
      "ORDER BY seq DESC LIMIT 1");
  for (size_t k = 0; k < seqs.size(); ++k) {
    int64_t latest = -1;
    for (int64_t iid : iids) {
      st.bind(1, id).bind(2, iid).bind(3, s64(seqs[k]));
      if (st.step() && st.columnInt(0) > latest) {
        latest = st.columnInt(0);
        out[k] = st.columnInt(1);
      }
      if (st.failed()) return readFailed(st);
      st.reset();
    }
  }
  return out;
}

absl::StatusOr<int64_t> Store::createAppliedPlan(const AppliedPlanRow& r) {
  Statement st = m_db.prepare(
      "INSERT INTO applied_plan (session_id, plan_json, strategy, budget_bytes, "
      "predicted_peak_bytes, predicted_extra_ns, predicted_step_ns, sent_wall_ns) VALUES "
      "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id");
  st.bind(1, r.sessionId).bind(2, r.planJson).bind(3, r.strategy).bind(4, r.budgetBytes);
  st.bind(5, r.predictedPeakBytes).bind(6, r.predictedExtraNs).bind(7, r.predictedStepNs);
  st.bind(8, r.sentWallNs);
  return runReturningId(st);
}

absl::Status Store::recordJobsOwnPlan(const AppliedPlanRow& r) {
  Statement find = m_db.prepare(
      "SELECT id FROM applied_plan WHERE session_id = ?1 AND from_step = ?2 AND plan_json = ?3 "
      "ORDER BY id DESC LIMIT 1");
  find.bind(1, r.sessionId).bind(2, r.fromStep).bind(3, r.planJson);
  int64_t id = 0;
  const bool known = find.step();
  if (known) id = find.columnInt(0);
  find = Statement();  // done with before the writes
  if (!known) {
    absl::StatusOr<int64_t> created = createAppliedPlan(r);
    if (!created.ok()) return created.status();
    id = *created;
  }
  return setPlanResult(r.sessionId, id, r.state, r.message, r.fromStep);
}

absl::Status Store::setPlanResult(int64_t sessionId, int64_t planId, int state,
                                  const std::string& message, int64_t fromStep) {
  Statement st = m_db.prepare(
      "UPDATE applied_plan SET state = ?3, message = ?4, from_step = ?5 WHERE session_id = ?1 "
      "AND id = ?2");
  st.bind(1, sessionId).bind(2, planId).bind(3, state).bind(4, message).bind(5, fromStep);
  return st.run();
}

absl::Status Store::queuePlanDelivery(int64_t planId, int64_t sessionId) {
  Statement st = m_db.prepare("INSERT INTO plan_outbox (plan_id, session_id) VALUES (?1, ?2)");
  st.bind(1, planId).bind(2, sessionId);
  return st.run();
}

absl::Status Store::removePlanDelivery(int64_t planId) {
  Statement st = m_db.prepare("DELETE FROM plan_outbox WHERE plan_id = ?1");
  st.bind(1, planId);
  return st.run();
}

absl::StatusOr<std::vector<PlanDelivery>> Store::plansToDeliver(const std::string& path,
                                                                const std::string& daemon) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT o.plan_id, o.session_id, p.plan_json, p.sent_wall_ns, s.state FROM plan_outbox o "
      "JOIN applied_plan p ON p.id = o.plan_id JOIN session s ON s.id = o.session_id WHERE " +
      ownSessions(path) + " ORDER BY o.plan_id");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  st.bind(1, daemon);
  std::vector<PlanDelivery> out;
  while (st.step()) {
    PlanDelivery d;
    d.planId = st.columnInt(0);
    d.sessionId = st.columnInt(1);
    d.planJson = st.columnText(2);
    d.sentWallNs = st.columnInt(3);
    d.sessionLive = st.columnInt(4) == 1;
    out.push_back(std::move(d));
  }
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<std::vector<AppliedPlanRow>> Store::appliedPlans(const std::string& path,
                                                                int64_t id) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT id, plan_json, strategy, budget_bytes, predicted_peak_bytes, predicted_extra_ns, "
      "predicted_step_ns, sent_wall_ns, state, message, from_step FROM applied_plan WHERE "
      "session_id = ?1 ORDER BY id");
  st.bind(1, id);
  std::vector<AppliedPlanRow> out;
  while (st.step()) {
    AppliedPlanRow r;
    r.id = st.columnInt(0);
    r.sessionId = id;
    r.planJson = st.columnText(1);
    r.strategy = st.columnText(2);
    r.budgetBytes = st.columnInt(3);
    r.predictedPeakBytes = st.columnInt(4);
    r.predictedExtraNs = st.columnInt(5);
    r.predictedStepNs = st.columnInt(6);
    r.sentWallNs = st.columnInt(7);
    r.state = static_cast<int>(st.columnInt(8));
    r.message = st.columnText(9);
    r.fromStep = st.columnInt(10);
    out.push_back(std::move(r));
  }
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<bool> Store::isAnalyzed(const std::string& path, int64_t id) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare("SELECT analyzed FROM session WHERE id = ?1");
  st.bind(1, id);
  if (!st.step()) {
    if (st.failed()) return readFailed(st);
    return absl::NotFoundError("no session " + std::to_string(id));
  }
  return st.columnInt(0) != 0;
}

absl::StatusOr<core::PeakReport> Store::readPeak(const std::string& path, int64_t id,
                                                 int64_t step) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT seq, ts_ns, tracked_bytes, phase, scope FROM peak WHERE session_id = ?1 AND "
      "step = ?2");
  st.bind(1, id).bind(2, step);
  if (!st.step()) {
    if (st.failed()) return readFailed(st);
    return absl::NotFoundError("no stored peak");
  }
  core::PeakReport p;
  p.step = step;
  p.state.seq = u64(st.columnInt(0));
  p.state.tsNs = st.columnInt(1);
  p.state.trackedBytes = st.columnInt(2);
  p.phase = st.columnText(3);
  p.scope = st.columnText(4);
  Statement cats = db.prepare(
      "SELECT category, bytes, blocks FROM peak_category WHERE session_id = ?1 AND step = ?2");
  cats.bind(1, id).bind(2, step);
  while (cats.step()) {
    auto c = core::categoryFromWire(static_cast<int>(cats.columnInt(0)));
    if (!c) continue;
    p.state.bytes[core::categoryIndex(*c)] = cats.columnInt(1);
    p.state.blocks[core::categoryIndex(*c)] = cats.columnInt(2);
  }
  if (cats.failed()) return readFailed(cats);
  // A store of schema version 3 read without a daemon (--db) has no addresses.
  bool addresses = true;
  if (!isPostgres(db)) {
    Statement hasAddress =
        db.prepare("SELECT count(*) FROM pragma_table_info('peak_item') WHERE name = 'address'");
    addresses = hasAddress.step() && hasAddress.columnInt(0) > 0;
  }
  Statement items =
      db.prepare(std::string("SELECT kind, name, category, bytes, blocks, rule, ") +
                 (addresses ? "address" : "0") +
                 " FROM peak_item WHERE session_id = ?1 AND step = ?2 ORDER BY kind, rank");
  items.bind(1, id).bind(2, step);
  while (items.step()) {
    core::PeakItem it;
    it.name = items.columnText(1);
    it.category = core::categoryFromWire(static_cast<int>(items.columnInt(2)))
                      .value_or(core::Category::kUnknown);
    it.bytes = items.columnInt(3);
    it.blocks = items.columnInt(4);
    it.rule = static_cast<core::CategoryRule>(items.columnInt(5));
    it.address = u64(items.columnInt(6));
    const std::string kind = items.columnText(0);
    (kind == "module" ? p.modules : kind == "op" ? p.ops : p.tensors).push_back(std::move(it));
  }
  if (items.failed()) return readFailed(items);
  return p;
}

absl::StatusOr<std::vector<core::PeakReport>> Store::readPeaks(const std::string& path, int64_t id,
                                                               std::optional<StepNumbers> steps) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  std::vector<core::PeakReport> out;
  std::map<int64_t, size_t> index;
  const int64_t first = steps ? steps->first : std::numeric_limits<int64_t>::min();
  const int64_t last = steps ? steps->last : std::numeric_limits<int64_t>::max();
  Statement st = db.prepare(
      "SELECT step, seq, ts_ns, tracked_bytes, phase, scope FROM peak WHERE session_id = ?1 "
      "AND step BETWEEN ?2 AND ?3 ORDER BY step");
  st.bind(1, id).bind(2, first).bind(3, last);
  while (st.step()) {
    core::PeakReport p;
    p.step = st.columnInt(0);
    p.state.seq = u64(st.columnInt(1));
    p.state.tsNs = st.columnInt(2);
    p.state.trackedBytes = st.columnInt(3);
    p.phase = st.columnText(4);
    p.scope = st.columnText(5);
    index[p.step] = out.size();
    out.push_back(std::move(p));
  }
  if (st.failed()) return readFailed(st);
  Statement cats = db.prepare(
      "SELECT step, category, bytes, blocks FROM peak_category WHERE session_id = ?1 AND step "
      "BETWEEN ?2 AND ?3");
  cats.bind(1, id).bind(2, first).bind(3, last);
  while (cats.step()) {
    auto it = index.find(cats.columnInt(0));
    auto c = core::categoryFromWire(static_cast<int>(cats.columnInt(1)));
    if (it == index.end() || !c) continue;
    out[it->second].state.bytes[core::categoryIndex(*c)] = cats.columnInt(2);
    out[it->second].state.blocks[core::categoryIndex(*c)] = cats.columnInt(3);
  }
  if (cats.failed()) return readFailed(cats);
  return out;
}

absl::StatusOr<std::vector<core::TimelineBucket>> Store::readTimeline(const std::string& path,
                                                                      int64_t id, int64_t fromTs,
                                                                      int64_t toTs, int buckets) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  // Choose the level from the chunks' extents: the coarsest with at least `buckets` samples in
  // the range, counting a partly covered chunk in proportion. Per level, the first and the last
  // chunk of the range come from the indexes on their extents (the chunks between hold
  // kSamplesPerChunk samples each), so the choice reads two rows a level, not the session's.
  int64_t maxLevel = -1;
  {
    Statement top = db.prepare("SELECT MAX(level) FROM timeline_chunk WHERE session_id = ?1");
    top.bind(1, id);
    if (top.step() && !top.columnNull(0)) maxLevel = top.columnInt(0);
    if (top.failed()) return readFailed(top);
  }
  Statement firstChunk = db.prepare(
      "SELECT chunk, first_ts_ns, last_ts_ns, sample_count FROM timeline_chunk " +
      indexedBy(db, "timeline_chunk_by_last") +
      "WHERE session_id = ?1 AND level = ?2 AND last_ts_ns >= ?3 ORDER BY last_ts_ns LIMIT 1");
  Statement lastChunk = db.prepare(
      "SELECT chunk, first_ts_ns, last_ts_ns, sample_count FROM timeline_chunk " +
      indexedBy(db, "timeline_chunk_by_first") +
      "WHERE session_id = ?1 AND level = ?2 AND first_ts_ns <= ?3 ORDER BY first_ts_ns DESC "
      "LIMIT 1");
  auto covered = [&](const Statement& st) {
    const int64_t first = st.columnInt(1);
    const int64_t last = st.columnInt(2);
    const double span = static_cast<double>(std::max<int64_t>(last - first, 1));
    const double part = static_cast<double>(std::min(last, toTs) - std::max(first, fromTs));
    return static_cast<double>(st.columnInt(3)) * std::clamp(part / span, 0.0, 1.0);
  };
  struct Range {
    int64_t firstChunk = 0;
    int64_t lastChunk = -1;
  };
  std::map<int64_t, Range> ranges;
  int64_t level = -1;
  for (int64_t l = 0; l <= maxLevel; ++l) {
    firstChunk.bind(1, id).bind(2, l).bind(3, fromTs);
    lastChunk.bind(1, id).bind(2, l).bind(3, toTs);
    const bool found = firstChunk.step() && lastChunk.step();
    if (firstChunk.failed() || (!found && lastChunk.failed()))
      return readFailed(firstChunk.failed() ? firstChunk : lastChunk);
    if (found) {
      Range r{firstChunk.columnInt(0), lastChunk.columnInt(0)};
      if (r.firstChunk <= r.lastChunk) {
        double n = covered(firstChunk);
        if (r.lastChunk > r.firstChunk) {
          n += covered(lastChunk) + static_cast<double>(r.lastChunk - r.firstChunk - 1) *
                                        static_cast<double>(core::AnalysisSink::kSamplesPerChunk);
        }
        ranges[l] = r;
        if (level < 0 || n >= buckets) level = l;
      }
    }
    firstChunk.reset();
    lastChunk.reset();
  }
  if (level < 0) return absl::NotFoundError("no stored timeline in that range");
  Statement rows = db.prepare(
      "SELECT samples FROM timeline_chunk WHERE session_id = ?1 AND level = ?2 AND "
      "chunk BETWEEN ?3 AND ?4 ORDER BY chunk");
  rows.bind(1, id)
      .bind(2, level)
      .bind(3, ranges[level].firstChunk)
      .bind(4, ranges[level].lastChunk);
  core::TimelineLevel samples;
  while (rows.step()) {
    if (!core::decodeSamples(rows.columnBlob(0), &samples.samples)) {
      return absl::DataLossError("corrupt timeline chunk in session " + std::to_string(id));
    }
  }
  if (rows.failed()) return readFailed(rows);
  // A coarse sample across an idle stretch is read again from the level below: the chunks
  // there that overlap its time, the samples within its events.
  Statement finerRows =
      db.prepare("SELECT samples FROM timeline_chunk " + indexedBy(db, "timeline_chunk_by_last") +
                 "WHERE session_id = ?1 AND level = ?2 AND last_ts_ns >= ?3 AND first_ts_ns <= ?4 "
                 "ORDER BY last_ts_ns");
  bool corrupt = false;
  absl::Status readError;
  auto finer = [&](int l, const core::TimelineSample& coarser) {
    std::vector<core::TimelineSample> out, chunk;
    finerRows.bind(1, id).bind(2, l).bind(3, coarser.firstTsNs).bind(4, coarser.lastTsNs);
    while (finerRows.step()) {
      chunk.clear();
      if (!core::decodeSamples(finerRows.columnBlob(0), &chunk)) {
        corrupt = true;
        break;
      }
      for (const core::TimelineSample& s : chunk)
        if (s.firstSeq >= coarser.firstSeq && s.lastSeq <= coarser.lastSeq) out.push_back(s);
    }
    if (finerRows.failed() && readError.ok()) readError = readFailed(finerRows);
    finerRows.reset();
    return out;
  };
  std::vector<core::TimelineBucket> folded =
      core::foldTimeline(core::samplesInRange(samples, fromTs, toTs), fromTs, toTs, buckets,
                         static_cast<int>(level), finer);
  if (corrupt)
    return absl::DataLossError("corrupt timeline chunk in session " + std::to_string(id));
  if (!readError.ok()) return readError;
  return folded;
}

absl::StatusOr<std::vector<SessionRecord>> Store::listSessions(const std::string& path,
                                                               int64_t afterId, int64_t limit,
                                                               std::optional<int64_t> owner,
                                                               int64_t storeOwner) {
  if (!owner) return readSessions(path, "WHERE id > ?1", afterId, limit);
  const std::string uid = std::to_string(*owner);
  return readSessions(path,
                      "WHERE id > ?1 AND (owner_uid = " + uid +
                          (*owner == storeOwner ? " OR owner_uid IS NULL)" : ")"),
                      afterId, limit);
}

absl::StatusOr<std::vector<JobRecord>> Store::listJobs(const std::string& path,
                                                       std::optional<int64_t> owner,
                                                       int64_t storeOwner) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  // A store older than schema 5 read without a daemon (--db) has no jobs.
  if (!isPostgres(db)) {
    Statement hasJobs = db.prepare("SELECT count(*) FROM sqlite_master WHERE name = 'job'");
    if (!hasJobs.step() || hasJobs.columnInt(0) == 0) return std::vector<JobRecord>();
  }
  std::string where;
  if (owner) {
    where = " WHERE owner_uid = " + std::to_string(*owner) +
            (*owner == storeOwner ? " OR owner_uid IS NULL" : "");
  }
  Statement st = db.prepare(
      "SELECT id, key, owner_uid, world_size, start_wall_ns, "
      "(SELECT COUNT(*) FROM session s WHERE s.job_id = job.id), "
      "(SELECT COUNT(*) FROM session s WHERE s.job_id = job.id AND s.state = 1) FROM job" +
      where + " ORDER BY id");
  if (auto s = checkPrepared(st, db); !s.ok()) return s;
  std::vector<JobRecord> out;
  while (st.step()) {
    JobRecord j;
    j.id = st.columnInt(0);
    j.key = st.columnText(1);
    if (!st.columnNull(2)) j.ownerUid = st.columnInt(2);
    j.worldSize = static_cast<int32_t>(st.columnInt(3));
    j.startWallNs = st.columnInt(4);
    j.ranksRecorded = st.columnInt(5);
    j.ranksLive = st.columnInt(6);
    out.push_back(std::move(j));
  }
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<std::vector<SessionRecord>> Store::jobSessions(const std::string& path,
                                                              int64_t jobId) {
  return readSessions(path, "WHERE job_id = ?1", jobId);
}

absl::StatusOr<int64_t> Store::insertToken(const TokenRow& t) {
  Statement st = m_db.prepare(
      "INSERT INTO token(name, role, uid, hash, created_wall_ns) VALUES (?1, ?2, ?3, ?4, ?5) "
      "RETURNING id");
  if (auto s = checkPrepared(st, m_db); !s.ok()) return s;
  st.bind(1, t.name).bind(2, t.role).bind(3, t.uid).bindBlob(4, t.hash).bind(5, t.createdWallNs);
  return runReturningId(st);
}

absl::Status Store::revokeToken(int64_t id) {
  Statement st = m_db.prepare("UPDATE token SET revoked = 1 WHERE id = ?1");
  if (auto s = checkPrepared(st, m_db); !s.ok()) return s;
  st.bind(1, id);
  if (auto s = st.run(); !s.ok()) return s;
  if (m_db.changes() == 0) {
    return absl::NotFoundError("no token " + std::to_string(id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenRow>> Store::readTokens(const std::string& path) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare(
      "SELECT id, name, role, uid, hash, created_wall_ns, revoked FROM token ORDER BY id");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  std::vector<TokenRow> out;
  while (st.step()) {
    TokenRow t;
    t.id = st.columnInt(0);
    t.name = st.columnText(1);
    t.role = static_cast<int>(st.columnInt(2));
    t.uid = st.columnInt(3);
    t.hash = std::string(st.columnBlob(4));
    t.createdWallNs = st.columnInt(5);
    t.revoked = st.columnInt(6) != 0;
    out.push_back(std::move(t));
  }
  if (st.failed()) return readFailed(st);
  return out;
}

absl::StatusOr<std::optional<int64_t>> Store::sessionOwner(const std::string& path, int64_t id) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  Statement st = db.prepare("SELECT owner_uid FROM session WHERE id = ?1");
  if (!st.ok()) return absl::InternalError("query failed: " + db.error());
  st.bind(1, id);
  if (!st.step()) {
    if (st.failed()) return readFailed(st);
    return absl::NotFoundError("no session " + std::to_string(id));
  }
  if (st.columnNull(0)) return std::optional<int64_t>();
  return std::optional<int64_t>(st.columnInt(0));
}

absl::StatusOr<SessionRecord> Store::getSession(const std::string& path, int64_t id,
                                                bool countSteps) {
  auto rows = readSessions(path, "WHERE id = ?1", id, -1, countSteps);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return absl::NotFoundError("no session " + std::to_string(id));
  return std::move(rows->front());
}

absl::StatusOr<core::Recording> Store::loadRecording(const std::string& path, int64_t id,
                                                     bool withBlocks) {
  Database db;
  if (auto s = Database::open(path, true, &db); !s.ok()) return s;
  {
    Statement pruned = db.prepare("SELECT raw_pruned_wall_ns FROM session WHERE id = ?1");
    pruned.bind(1, id);
    if (pruned.step() && !pruned.columnNull(0)) return rawEventsPruned(id, pruned.columnInt(0));
    if (pruned.failed()) return readFailed(pruned);
  }
  // Blocks, tags and phases as the streaming analysis reads them (recording_stream.h).
  auto stream = StoredRecordingStream::open(path, id);
  if (!stream.ok()) return stream.status();
  core::Recording rec;
  if (withBlocks) {
    auto blocks = (*stream)->blocks();
    for (core::Block b; blocks->next(b);) rec.blocks.push_back(b);
  }
  {
    auto tags = (*stream)->tags();
    for (core::TagRef t; tags->next(t);)
      rec.tags.push_back(
          {t.seq, t.tsNs, t.address, t.sizeBytes, t.category, (*stream)->name(t.nameId)});
  }
  {
    auto phases = (*stream)->phases();
    for (core::PhaseInterval p; phases->next(p);) rec.phases.push_back(p);
  }
  if (!(*stream)->error().empty()) return absl::InternalError((*stream)->error());
  auto endSeq = [](const Statement& st, int i) {
    return st.columnNull(i) ? core::kOpenSeq : u64(st.columnInt(i));
  };
  if (auto s = readSteps(db, id, &rec); !s.ok()) return s;
  {
    Statement st = db.prepare(
        "SELECT thread_id, name_id, depth, begin_seq, begin_ts_ns, end_seq, end_ts_ns, kind "
        "FROM scope WHERE session_id = ?1");
    st.bind(1, id);
    while (st.step()) {
      core::ScopeInterval s;
      s.threadId = static_cast<uint32_t>(st.columnInt(0));
      s.name = (*stream)->name(static_cast<uint32_t>(st.columnInt(1)));
      s.depth = static_cast<int>(st.columnInt(2));
      s.beginSeq = u64(st.columnInt(3));
      s.beginTsNs = st.columnInt(4);
      s.endSeq = endSeq(st, 5);
      s.endTsNs = st.columnInt(6);
      s.isOp = st.columnInt(7) == 1;
      s.isKernel = st.columnInt(7) == 2;
      (s.isKernel ? rec.kernels : s.isOp ? rec.ops : rec.scopes).push_back(std::move(s));
    }
    if (st.failed()) return readFailed(st);
  }
  if (!rec.kernels.empty()) {
    // Which CUDA call launched each kernel: its thread and moment.
    std::unordered_map<uint64_t, uint32_t> kernelCorrelation;
    Statement kl = db.prepare(
        "SELECT kernel_begin_seq, correlation_id FROM kernel_launch WHERE session_id = ?1");
    kl.bind(1, id);
    while (kl.step())
      kernelCorrelation[u64(kl.columnInt(0))] = static_cast<uint32_t>(kl.columnInt(1));
    if (kl.failed()) return readFailed(kl);
    for (core::ScopeInterval& k : rec.kernels)
      if (auto it = kernelCorrelation.find(k.beginSeq); it != kernelCorrelation.end())
        k.correlationId = it->second;
    Statement la =
        db.prepare("SELECT correlation_id, thread_id, seq FROM launch WHERE session_id = ?1");
    la.bind(1, id);
    while (la.step())
      rec.launches.push_back({static_cast<uint32_t>(la.columnInt(0)),
                              static_cast<uint32_t>(la.columnInt(1)), u64(la.columnInt(2))});
    if (la.failed()) return readFailed(la);
  }
  rec.sortBySeq();
  return rec;
}

}  // namespace tidemark::server
