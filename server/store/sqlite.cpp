#include "server/store/sqlite.h"

namespace tidemark::server {

Statement::Statement(sqlite3* db, std::string_view sql) : m_db(db) {
  m_lastRc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &m_stmt, nullptr);
  if (m_lastRc != SQLITE_OK) m_stmt = nullptr;
}

Statement::~Statement() {
  if (m_stmt != nullptr) sqlite3_finalize(m_stmt);
}

Statement& Statement::operator=(Statement&& o) noexcept {
  if (this != &o) {
    if (m_stmt != nullptr) sqlite3_finalize(m_stmt);
    m_stmt = o.m_stmt;
    m_db = o.m_db;
    o.m_stmt = nullptr;
  }
  return *this;
}

Statement& Statement::bind(int index, int64_t v) {
  sqlite3_bind_int64(m_stmt, index, v);
  return *this;
}
Statement& Statement::bind(int index, std::string_view v) {
  sqlite3_bind_text(m_stmt, index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}
Statement& Statement::bindBlob(int index, std::string_view v) {
  sqlite3_bind_blob(m_stmt, index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

std::string_view Statement::columnBlob(int i) const {
  const void* p = sqlite3_column_blob(m_stmt, i);
  const int n = sqlite3_column_bytes(m_stmt, i);
  return p ? std::string_view(static_cast<const char*>(p), static_cast<size_t>(n))
           : std::string_view();
}

Statement& Statement::bindNull(int index) {
  sqlite3_bind_null(m_stmt, index);
  return *this;
}

bool Statement::step() {
  m_lastRc = sqlite3_step(m_stmt);
  return m_lastRc == SQLITE_ROW;
}

absl::Status Statement::run() {
  if (m_stmt == nullptr) return absl::InternalError("statement failed to prepare");
  while (step()) {
  }
  const int rc = m_lastRc;
  reset();
  if (rc != SQLITE_DONE) return absl::InternalError(sqlite3_errmsg(m_db));
  return absl::OkStatus();
}

void Statement::reset() {
  sqlite3_reset(m_stmt);
  sqlite3_clear_bindings(m_stmt);
}

std::string Statement::columnText(int i) const {
  const unsigned char* t = sqlite3_column_text(m_stmt, i);
  return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
}

absl::Status Database::open(const std::string& path, bool readOnly, Database* out) {
  sqlite3* db = nullptr;
  const int flags = readOnly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (db) sqlite3_close(db);
    return absl::UnavailableError("cannot open " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db, 5000);
  if (readOnly) {
    // Queries read large result blobs (timeline chunks): map the file instead of copying pages.
    sqlite3_exec(db, "PRAGMA mmap_size=1073741824", nullptr, nullptr, nullptr);
  }
  if (out->m_db) sqlite3_close(out->m_db);
  out->m_db = db;
  return absl::OkStatus();
}

Database::~Database() {
  if (m_db != nullptr) sqlite3_close(m_db);
}

absl::Status Database::exec(std::string_view sql) {
  char* err = nullptr;
  const std::string s(sql);
  if (sqlite3_exec(m_db, s.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(msg);
  }
  return absl::OkStatus();
}

}  // namespace tidemark::server
