#include "server/store/recording_stream.h"

#include <functional>

namespace tidemark::server {

namespace {

uint64_t u64(int64_t v) { return static_cast<uint64_t>(v); }
uint64_t endSeq(const Statement& st, int i) {
  return st.columnNull(i) ? core::kOpenSeq : u64(st.columnInt(i));
}

// Steps a statement; read(st, out) turns a row into a record.
template <typename T>
class StatementCursor : public core::Cursor<T> {
 public:
  using Read = std::function<void(const Statement&, T&)>;
  StatementCursor(StoredRecordingStream& owner, std::string_view sql, int64_t session, int kind,
                  Read read)
      : m_owner(owner), m_st(owner.prepareCursor(sql, &m_own)), m_read(std::move(read)) {
    if (m_st.ok()) {
      m_st.bind(1, session);
      if (kind >= 0) m_st.bind(2, kind);
    }
    if (!m_st.ok()) m_owner.noteError("preparing a read of the session failed");
  }
  bool next(T& out) override {
    if (!m_st.ok() || m_done) return false;
    if (!m_st.step()) {
      m_done = true;
      if (m_st.failed()) m_owner.noteError("reading the session failed: " + m_st.error());
      return false;
    }
    m_read(m_st, out);
    return true;
  }

 private:
  StoredRecordingStream& m_owner;
  Database m_own;  // PostgreSQL: the cursor's own connection (its rows arrive as it reads them)
  Statement m_st;
  Read m_read;
  bool m_done = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StoredRecordingStream>> StoredRecordingStream::open(
    const std::string& path, int64_t sessionId) {
  std::unique_ptr<StoredRecordingStream> s(new StoredRecordingStream(path, sessionId));
  if (auto st = Database::open(path, true, &s->m_db); !st.ok()) return st;
  // Rows are read once, in order: no memory map (its pages would count as the daemon's), and a
  // page cache of 8 MiB.
  if (s->m_db.dialect() == Dialect::kSqlite) {
    if (auto st = s->m_db.exec("PRAGMA mmap_size=0; PRAGMA cache_size=-8192;"); !st.ok()) return st;
  }
  Statement names = s->m_db.prepare("SELECT iid, value FROM string WHERE session_id = ?1");
  names.bind(1, sessionId);
  while (names.step()) s->m_names[static_cast<uint32_t>(names.columnInt(0))] = names.columnText(1);
  if (names.failed())
    return absl::UnavailableError("reading the session's names failed: " + names.error());
  return s;
}

std::unique_ptr<core::Cursor<core::Block>> StoredRecordingStream::blocks() {
  return std::make_unique<StatementCursor<core::Block>>(
      *this,
      "SELECT a.id, address, size_bytes, device, thread_id, alloc_seq, alloc_ts_ns, free_seq, "
      "free_ts_ns, memory_kind FROM session s JOIN allocation a ON a.id BETWEEN "
      "s.first_block_id AND s.last_block_id AND a.session_id = s.id WHERE s.id = ?1 "
      "ORDER BY a.id",
      m_id, -1, [](const Statement& r, core::Block& b) {
        b.id = r.columnInt(0);
        b.address = u64(r.columnInt(1));
        b.sizeBytes = u64(r.columnInt(2));
        b.device = static_cast<int32_t>(r.columnInt(3));
        b.threadId = static_cast<uint32_t>(r.columnInt(4));
        b.allocSeq = u64(r.columnInt(5));
        b.allocTsNs = r.columnInt(6);
        b.freeSeq = endSeq(r, 7);
        b.freeTsNs = r.columnInt(8);
        b.kind = core::memoryKindFromWire(r.columnInt(9));
      });
}

std::unique_ptr<core::Cursor<core::TagRef>> StoredRecordingStream::tags() {
  return std::make_unique<StatementCursor<core::TagRef>>(
      *this,
      "SELECT seq, ts_ns, address, size_bytes, category, name_id FROM tag WHERE session_id = ?1 "
      "ORDER BY seq",
      m_id, -1, [](const Statement& r, core::TagRef& t) {
        t.seq = u64(r.columnInt(0));
        t.tsNs = r.columnInt(1);
        t.address = u64(r.columnInt(2));
        t.sizeBytes = u64(r.columnInt(3));
        t.category = core::categoryFromWire(static_cast<int>(r.columnInt(4)))
                         .value_or(core::Category::kUnknown);
        t.nameId = static_cast<uint32_t>(r.columnInt(5));
      });
}

std::unique_ptr<core::Cursor<core::PhaseInterval>> StoredRecordingStream::phases() {
  return std::make_unique<StatementCursor<core::PhaseInterval>>(
      *this,
      "SELECT thread_id, phase, begin_seq, begin_ts_ns, end_seq, end_ts_ns FROM phase "
      "WHERE session_id = ?1 ORDER BY begin_seq",
      m_id, -1, [](const Statement& r, core::PhaseInterval& p) {
        p.threadId = static_cast<uint32_t>(r.columnInt(0));
        p.phase =
            core::phaseFromWire(static_cast<int>(r.columnInt(1))).value_or(core::Phase::kNone);
        p.beginSeq = u64(r.columnInt(2));
        p.beginTsNs = r.columnInt(3);
        p.endSeq = endSeq(r, 4);
        p.endTsNs = r.columnInt(5);
      });
}

std::unique_ptr<core::Cursor<core::ScopeRef>> StoredRecordingStream::scopes(bool ops) {
  return std::make_unique<StatementCursor<core::ScopeRef>>(
      *this,
      "SELECT begin_seq, end_seq, thread_id, name_id FROM scope "
      "WHERE session_id = ?1 AND kind = ?2 ORDER BY begin_seq",
      m_id, ops ? 1 : 0, [](const Statement& r, core::ScopeRef& s) {
        s.beginSeq = u64(r.columnInt(0));
        s.endSeq = endSeq(r, 1);
        s.threadId = static_cast<uint32_t>(r.columnInt(2));
        s.nameId = static_cast<uint32_t>(r.columnInt(3));
      });
}

core::StepInterval stepRow(const Statement& st) {
  core::StepInterval s;
  s.step = st.columnInt(0);
  s.beginSeq = u64(st.columnInt(1));
  s.beginTsNs = st.columnInt(2);
  s.endSeq = endSeq(st, 3);
  s.endTsNs = st.columnInt(4);
  return s;
}

absl::StatusOr<std::vector<core::StepInterval>> readStepRows(Database& db, int64_t sessionId,
                                                             bool markedOnly) {
  std::vector<core::StepInterval> out;
  Statement st = db.prepare(std::string("SELECT step, begin_seq, begin_ts_ns, end_seq, end_ts_ns "
                                        "FROM step WHERE session_id = ?1") +
                            (markedOnly ? " AND inferred = 0" : "") + " ORDER BY begin_seq");
  st.bind(1, sessionId);
  while (st.step()) out.push_back(stepRow(st));
  if (st.failed()) return absl::InternalError("reading the steps failed: " + st.error());
  return out;
}

std::vector<core::StepInterval> StoredRecordingStream::steps() {
  auto steps = readStepRows(m_db, m_id, /*markedOnly=*/true);
  if (!steps.ok()) {
    noteError(std::string(steps.status().message()));
    return {};
  }
  return std::move(*steps);
}

Statement StoredRecordingStream::prepareCursor(std::string_view sql, Database* own) {
  if (m_db.dialect() == Dialect::kSqlite) return m_db.prepare(sql);
  // One PostgreSQL connection streams one result at a time: the analysis reads its cursors in
  // step, so each has its own.
  if (auto s = Database::open(m_path, true, own); !s.ok()) {
    noteError(std::string(s.message()));
    return Statement();
  }
  return own->prepareStream(sql);
}

std::string StoredRecordingStream::name(uint32_t id) {
  auto it = m_names.find(id);
  return it == m_names.end() ? std::string() : it->second;
}

}  // namespace tidemark::server
