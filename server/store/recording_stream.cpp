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
  StatementCursor(StoredRecordingStream& owner, Statement st, Read read)
      : m_owner(owner), m_st(std::move(st)), m_read(std::move(read)) {
    if (!m_st.ok()) m_owner.noteError("preparing a read of the session failed");
  }
  bool next(T& out) override {
    if (!m_st.ok() || m_done) return false;
    if (!m_st.step()) {
      m_done = true;
      if (m_st.lastError() != SQLITE_DONE)
        m_owner.noteError("reading the session failed (SQLite error " +
                          std::to_string(m_st.lastError()) + ")");
      return false;
    }
    m_read(m_st, out);
    return true;
  }

 private:
  StoredRecordingStream& m_owner;
  Statement m_st;
  Read m_read;
  bool m_done = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StoredRecordingStream>> StoredRecordingStream::open(
    const std::string& path, int64_t sessionId) {
  std::unique_ptr<StoredRecordingStream> s(new StoredRecordingStream(sessionId));
  if (auto st = Database::open(path, true, &s->m_db); !st.ok()) return st;
  // Rows are read once, in order: no memory map (its pages would count as the daemon's), and a
  // page cache of 8 MiB.
  if (auto st = s->m_db.exec("PRAGMA mmap_size=0; PRAGMA cache_size=-8192;"); !st.ok()) return st;
  Statement names = s->m_db.prepare("SELECT iid, value FROM string WHERE session_id = ?1");
  names.bind(1, sessionId);
  while (names.step()) s->m_names[static_cast<uint32_t>(names.columnInt(0))] = names.columnText(1);
  return s;
}

std::unique_ptr<core::Cursor<core::Block>> StoredRecordingStream::blocks() {
  Statement st = m_db.prepare(
      "SELECT a.id, address, size_bytes, device, thread_id, alloc_seq, alloc_ts_ns, free_seq, "
      "free_ts_ns, memory_kind FROM session s JOIN allocation a ON a.id BETWEEN "
      "s.first_block_id AND s.last_block_id AND a.session_id = s.id WHERE s.id = ?1");
  st.bind(1, m_id);
  return std::make_unique<StatementCursor<core::Block>>(
      *this, std::move(st), [](const Statement& r, core::Block& b) {
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
  Statement st = m_db.prepare(
      "SELECT seq, ts_ns, address, size_bytes, category, name_id FROM tag WHERE session_id = ?1 "
      "ORDER BY seq");
  st.bind(1, m_id);
  return std::make_unique<StatementCursor<core::TagRef>>(
      *this, std::move(st), [](const Statement& r, core::TagRef& t) {
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
  Statement st = m_db.prepare(
      "SELECT thread_id, phase, begin_seq, begin_ts_ns, end_seq, end_ts_ns FROM phase "
      "WHERE session_id = ?1 ORDER BY begin_seq");
  st.bind(1, m_id);
  return std::make_unique<StatementCursor<core::PhaseInterval>>(
      *this, std::move(st), [](const Statement& r, core::PhaseInterval& p) {
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
  Statement st = m_db.prepare(
      "SELECT begin_seq, end_seq, thread_id, name_id FROM scope "
      "WHERE session_id = ?1 AND kind = ?2 ORDER BY begin_seq");
  st.bind(1, m_id).bind(2, ops ? 1 : 0);
  return std::make_unique<StatementCursor<core::ScopeRef>>(
      *this, std::move(st), [](const Statement& r, core::ScopeRef& s) {
        s.beginSeq = u64(r.columnInt(0));
        s.endSeq = endSeq(r, 1);
        s.threadId = static_cast<uint32_t>(r.columnInt(2));
        s.nameId = static_cast<uint32_t>(r.columnInt(3));
      });
}

absl::StatusOr<std::vector<core::StepInterval>> readStepRows(Database& db, int64_t sessionId,
                                                             bool markedOnly) {
  std::vector<core::StepInterval> out;
  Statement st = db.prepare(std::string("SELECT step, begin_seq, begin_ts_ns, end_seq, end_ts_ns "
                                        "FROM step WHERE session_id = ?1") +
                            (markedOnly ? " AND inferred = 0" : "") + " ORDER BY begin_seq");
  st.bind(1, sessionId);
  while (st.step()) {
    core::StepInterval s;
    s.step = st.columnInt(0);
    s.beginSeq = u64(st.columnInt(1));
    s.beginTsNs = st.columnInt(2);
    s.endSeq = endSeq(st, 3);
    s.endTsNs = st.columnInt(4);
    out.push_back(s);
  }
  if (st.lastError() != SQLITE_DONE) return absl::InternalError("reading the steps failed");
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

std::string StoredRecordingStream::name(uint32_t id) {
  auto it = m_names.find(id);
  return it == m_names.end() ? std::string() : it->second;
}

}  // namespace tidemark::server
