#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tidemark::server {

// Thin RAII wrappers over the SQLite C API. All SQL of tidemark lives under server/store/.
class Statement {
 public:
  Statement() = default;
  Statement(sqlite3* db, std::string_view sql);
  ~Statement();
  Statement(Statement&& o) noexcept : m_stmt(o.m_stmt), m_db(o.m_db) { o.m_stmt = nullptr; }
  Statement& operator=(Statement&& o) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return m_stmt != nullptr; }
  Statement& bind(int index, int64_t v);
  Statement& bind(int index, uint64_t v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, int v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, uint32_t v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, std::string_view v);
  Statement& bindBlob(int index, std::string_view v);
  Statement& bindNull(int index);
  // SQLITE_ROW -> true; SQLITE_DONE -> false (then reset before reuse).
  bool step();
  absl::Status run();  // step to completion and reset
  void reset();
  int64_t columnInt(int i) const { return sqlite3_column_int64(m_stmt, i); }
  bool columnNull(int i) const { return sqlite3_column_type(m_stmt, i) == SQLITE_NULL; }
  std::string columnText(int i) const;
  std::string_view columnBlob(int i) const;  // valid until the next step or reset
  int lastError() const { return m_lastRc; }

 private:
  sqlite3_stmt* m_stmt = nullptr;
  sqlite3* m_db = nullptr;
  int m_lastRc = SQLITE_OK;
};

class Database {
 public:
  static absl::Status open(const std::string& path, bool readOnly, Database* out);
  Database() = default;
  ~Database();
  Database(Database&& o) noexcept : m_db(o.m_db) { o.m_db = nullptr; }
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  sqlite3* handle() const { return m_db; }
  absl::Status exec(std::string_view sql);
  Statement prepare(std::string_view sql) { return Statement(m_db, sql); }
  std::string error() const { return m_db ? sqlite3_errmsg(m_db) : "no database"; }

 private:
  sqlite3* m_db = nullptr;
};

}  // namespace tidemark::server
