// The SQLite backend of Database (database.h): a file, one writer, WAL.
#include <sqlite3.h>

#include "server/store/database.h"

namespace tidemark::server {
namespace {

class SqliteStatement final : public Statement::Impl {
 public:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : m_db(db), m_stmt(stmt) {}
  ~SqliteStatement() override { sqlite3_finalize(m_stmt); }

  void bindInt(int index, int64_t v) override { sqlite3_bind_int64(m_stmt, index, v); }
  void bindText(int index, std::string_view v) override {
    sqlite3_bind_text(m_stmt, index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void bindBlob(int index, std::string_view v) override {
    sqlite3_bind_blob(m_stmt, index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void bindNull(int index) override { sqlite3_bind_null(m_stmt, index); }
  bool step() override {
    m_lastRc = sqlite3_step(m_stmt);
    return m_lastRc == SQLITE_ROW;
  }
  bool failed() const override { return m_lastRc != SQLITE_ROW && m_lastRc != SQLITE_DONE; }
  void reset() override {
    sqlite3_reset(m_stmt);
    sqlite3_clear_bindings(m_stmt);
    m_lastRc = SQLITE_OK;
  }
  int64_t columnInt(int i) const override { return sqlite3_column_int64(m_stmt, i); }
  bool columnNull(int i) const override { return sqlite3_column_type(m_stmt, i) == SQLITE_NULL; }
  std::string columnText(int i) const override {
    const unsigned char* t = sqlite3_column_text(m_stmt, i);
    return t ? std::string(reinterpret_cast<const char*>(t),
                           static_cast<size_t>(sqlite3_column_bytes(m_stmt, i)))
             : std::string();
  }
  std::string_view columnBlob(int i) const override {
    const void* p = sqlite3_column_blob(m_stmt, i);
    const int n = sqlite3_column_bytes(m_stmt, i);
    return p ? std::string_view(static_cast<const char*>(p), static_cast<size_t>(n))
             : std::string_view();
  }
  std::string error() const override { return sqlite3_errmsg(m_db); }

 private:
  sqlite3* m_db;
  sqlite3_stmt* m_stmt;
  int m_lastRc = SQLITE_OK;
};

class SqliteDatabase final : public Database::Impl {
 public:
  explicit SqliteDatabase(sqlite3* db) : m_db(db) {}
  ~SqliteDatabase() override { sqlite3_close(m_db); }

  Dialect dialect() const override { return Dialect::kSqlite; }
  absl::Status exec(std::string_view sql) override {
    char* err = nullptr;
    const std::string s(sql);
    if (sqlite3_exec(m_db, s.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      return absl::InternalError(msg);
    }
    return absl::OkStatus();
  }
  std::unique_ptr<Statement::Impl> prepare(std::string_view sql) override {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(m_db, sql.data(), static_cast<int>(sql.size()),
                           SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) != SQLITE_OK ||
        stmt == nullptr) {
      sqlite3_finalize(stmt);
      return nullptr;
    }
    return std::make_unique<SqliteStatement>(m_db, stmt);
  }
  std::string error() const override { return sqlite3_errmsg(m_db); }
  int64_t changes() const override { return sqlite3_changes64(m_db); }
  int64_t lastInsertId() const override { return sqlite3_last_insert_rowid(m_db); }
  absl::Status copyIn(std::string_view, std::string_view, std::string_view) override {
    return absl::UnimplementedError("COPY is PostgreSQL's");
  }

 private:
  sqlite3* m_db;
};

}  // namespace

absl::Status openSqlite(const std::string& path, bool readOnly,
                        std::unique_ptr<Database::Impl>* out) {
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
  *out = std::make_unique<SqliteDatabase>(db);
  return absl::OkStatus();
}

}  // namespace tidemark::server
