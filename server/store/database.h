#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tidemark::server {

// The SQL databases a store can live in (docs/deployment.md): a SQLite file (the default) or a
// PostgreSQL server shared by several daemons. All SQL of tidemark lives under server/store/ and
// is written once for both: parameters are ?N, upserts are ON CONFLICT ... DO UPDATE, new ids
// come back with RETURNING; what differs is asked of dialect().
enum class Dialect { kSqlite, kPostgres };

// True for a store locator that names a PostgreSQL server (postgresql://... or postgres://...);
// anything else is a SQLite file's path.
bool isPostgresLocator(std::string_view locator);
// The locator as it may be shown (a PostgreSQL URI without its password).
std::string displayLocator(std::string_view locator);
// Where the daemon's sorts spill (external_sort.h): beside a SQLite store (a private directory,
// the same disk); with a PostgreSQL store, in the temporary directory (files of mode 0600).
std::string scratchDirFor(std::string_view locator);

// A prepared statement. Its rows are read one at a time (step); reset before it runs again.
class Statement {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void bindInt(int index, int64_t v) = 0;
    virtual void bindText(int index, std::string_view v) = 0;
    virtual void bindBlob(int index, std::string_view v) = 0;
    virtual void bindNull(int index) = 0;
    virtual bool step() = 0;
    virtual bool failed() const = 0;
    virtual void reset() = 0;
    virtual int64_t columnInt(int i) const = 0;
    virtual bool columnNull(int i) const = 0;
    virtual std::string columnText(int i) const = 0;
    virtual std::string_view columnBlob(int i) const = 0;
    virtual std::string error() const = 0;
  };

  Statement() = default;
  explicit Statement(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}

  bool ok() const { return m_impl != nullptr; }
  // A statement that failed to prepare takes binds and steps as no-ops: step() is false and
  // failed() true.
  Statement& bind(int index, int64_t v) {
    if (m_impl) m_impl->bindInt(index, v);
    return *this;
  }
  Statement& bind(int index, uint64_t v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, int v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, uint32_t v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, std::string_view v) {
    if (m_impl) m_impl->bindText(index, v);
    return *this;
  }
  Statement& bind(int index, const std::string& v) { return bind(index, std::string_view(v)); }
  Statement& bind(int index, const char* v) { return bind(index, std::string_view(v)); }
  Statement& bindBlob(int index, std::string_view v) {
    if (m_impl) m_impl->bindBlob(index, v);
    return *this;
  }
  Statement& bindNull(int index) {
    if (m_impl) m_impl->bindNull(index);
    return *this;
  }
  // true: a row to read; false: no more rows, or an error (failed()). Reset before reuse.
  bool step() { return m_impl && m_impl->step(); }
  // The last step ended in an error rather than at the end of the rows.
  bool failed() const { return !m_impl || m_impl->failed(); }
  absl::Status run();  // steps to completion and resets
  void reset() {
    if (m_impl) m_impl->reset();
  }
  int64_t columnInt(int i) const { return m_impl->columnInt(i); }
  bool columnNull(int i) const { return m_impl->columnNull(i); }
  std::string columnText(int i) const { return m_impl->columnText(i); }
  std::string_view columnBlob(int i) const { return m_impl->columnBlob(i); }  // until next step
  std::string error() const { return m_impl ? m_impl->error() : "statement not prepared"; }

 private:
  std::unique_ptr<Impl> m_impl;
};

// A connection. Not thread-safe: one thread at a time.
class Database {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual Dialect dialect() const = 0;
    virtual absl::Status exec(std::string_view sql) = 0;
    virtual std::unique_ptr<Statement::Impl> prepare(std::string_view sql) = 0;
    virtual std::unique_ptr<Statement::Impl> prepareStream(std::string_view sql) {
      return prepare(sql);
    }
    virtual std::string error() const = 0;
    virtual int64_t changes() const = 0;
    virtual int64_t lastInsertId() const = 0;
    virtual absl::Status copyIn(std::string_view table, std::string_view columns,
                                std::string_view rows) = 0;
  };

  // locator: a SQLite file's path, or a PostgreSQL URI (isPostgresLocator). readOnly: a SQLite
  // file opened read-only; a PostgreSQL reader's connection (its statements are prepared on the
  // server only when they run a second time; the role decides what it may do).
  static absl::Status open(const std::string& locator, bool readOnly, Database* out);
  Database() = default;

  bool isOpen() const { return m_impl != nullptr; }
  Dialect dialect() const { return m_impl->dialect(); }
  absl::Status exec(std::string_view sql) { return m_impl->exec(sql); }
  // A statement that failed to prepare is !ok(); error() says why.
  Statement prepare(std::string_view sql) { return Statement(m_impl->prepare(sql)); }
  // A SELECT whose many rows are read once, in order (the analysis's cursors): PostgreSQL
  // fetches them thousands at a time from a cursor, in a read-only transaction of their own
  // (the connection must be the statement's alone while it reads); SQLite as prepare.
  Statement prepareStream(std::string_view sql) { return Statement(m_impl->prepareStream(sql)); }
  std::string error() const { return m_impl ? m_impl->error() : "no database"; }
  // Rows changed by the last INSERT, UPDATE or DELETE.
  int64_t changes() const { return m_impl->changes(); }
  // SQLite only: the rowid of the last row inserted (PostgreSQL: use RETURNING).
  int64_t lastInsertId() const { return m_impl->lastInsertId(); }
  // PostgreSQL only: rows in COPY's text format (a line each, tab-separated, \N for NULL)
  // appended to table(columns) in one stream.
  absl::Status copyIn(std::string_view table, std::string_view columns, std::string_view rows) {
    return m_impl->copyIn(table, columns, rows);
  }

 private:
  std::unique_ptr<Impl> m_impl;
};

// The backends (database_sqlite.cpp, database_postgres.cpp).
absl::Status openSqlite(const std::string& path, bool readOnly,
                        std::unique_ptr<Database::Impl>* out);
absl::Status openPostgres(const std::string& uri, bool readOnly,
                          std::unique_ptr<Database::Impl>* out);
// The store's schema (written for SQLite) as PostgreSQL takes it: 64-bit integers, identity ids,
// BYTEA for blobs.
std::string postgresDdl(std::string_view sqliteDdl);

}  // namespace tidemark::server
