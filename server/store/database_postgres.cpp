// The PostgreSQL backend of Database (database.h), over libpq. Statements have their ?N
// parameters renamed $N and run with text parameters (blobs in binary); results come in binary.
// Rows are read one at a time (single-row mode), so a large read holds one row, not the whole
// result; the analysis's streams (prepareStream) fetch thousands at a time from a server-side
// cursor. The writer's statements are prepared on the server; a reader's only once it runs a
// second time. Idle connections are kept for the next reader; a connection the server ended is
// made again outside transactions (ConnectionPool, PgConnection::reconnectIfLost).
#include <libpq-fe.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "server/store/database.h"

namespace tidemark::server {
namespace {

// ?N -> $N; a bare ? -> $(largest so far + 1), as SQLite numbers them. Quoted text is left alone.
std::string renameParameters(std::string_view sql, int* count) {
  std::string out;
  out.reserve(sql.size() + 16);
  int largest = 0;
  bool quoted = false;
  for (size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (c == '\'') quoted = !quoted;
    if (quoted || c != '?') {
      out += c;
      continue;
    }
    size_t j = i + 1;
    int n = 0;
    while (j < sql.size() && sql[j] >= '0' && sql[j] <= '9') n = n * 10 + (sql[j++] - '0');
    if (j == i + 1) n = largest + 1;
    largest = std::max(largest, n);
    out += '$';
    out += std::to_string(n);
    i = j - 1;
  }
  *count = largest;
  return out;
}

// Results come in PostgreSQL's binary format (blobs as they are, not hex text): a value's bytes
// are read by its column's type.
constexpr Oid kBoolOid = 16, kInt8Oid = 20, kInt2Oid = 21, kInt4Oid = 23, kOidOid = 26,
              kNumericOid = 1700;

uint64_t bigEndian(const char* v, int bytes) {
  uint64_t out = 0;
  for (int k = 0; k < bytes; ++k) out = out << 8 | static_cast<unsigned char>(v[k]);
  return out;
}

// A NUMERIC's integer part (base-10000 digits: ndigits, weight, sign, dscale, digits...).
int64_t numericInteger(const char* v, int len) {
  if (len < 8) return 0;
  const int ndigits = static_cast<int16_t>(bigEndian(v, 2));
  const int weight = static_cast<int16_t>(bigEndian(v + 2, 2));
  const bool negative = bigEndian(v + 4, 2) == 0x4000;
  int64_t out = 0;
  for (int d = 0; d <= weight; ++d) {
    const int64_t digit =
        d < ndigits && 8 + 2 * d + 2 <= len ? static_cast<int16_t>(bigEndian(v + 8 + 2 * d, 2)) : 0;
    out = out * 10000 + digit;
  }
  return negative ? -out : out;
}

// Connections kept open for the next reader of the same store: a PostgreSQL connection costs a
// server process's start (milliseconds), and every query opens one (Store's readers).
class ConnectionPool {
 public:
  static constexpr size_t kMaxIdlePerStore = 8;
  static ConnectionPool& instance() {
    static ConnectionPool* pool = new ConnectionPool();  // outlives every static user
    return *pool;
  }
  PGconn* take(const std::string& uri) {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_idle.find(uri);
    if (it == m_idle.end() || it->second.empty()) return nullptr;
    while (!it->second.empty()) {
      PGconn* conn = it->second.back();
      it->second.pop_back();
      // One the server closed while it waited here (a restart): its end is read now, not by
      // the next query.
      PQconsumeInput(conn);
      if (PQstatus(conn) == CONNECTION_OK) return conn;
      PQfinish(conn);
    }
    return nullptr;
  }
  // Keeps an idle connection (no transaction open, nothing in flight), or closes it.
  void give(const std::string& uri, PGconn* conn) {
    if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) == PQTRANS_IDLE) {
      std::lock_guard<std::mutex> lock(m_mutex);
      std::vector<PGconn*>& idle = m_idle[uri];
      if (idle.size() < kMaxIdlePerStore) {
        idle.push_back(conn);
        return;
      }
    }
    PQfinish(conn);
  }

 private:
  std::mutex m_mutex;
  std::unordered_map<std::string, std::vector<PGconn*>> m_idle;
};

class PgConnection {
 public:
  PgConnection(PGconn* conn, std::string uri) : conn(conn), uri(std::move(uri)) {}
  ~PgConnection() { ConnectionPool::instance().give(uri, conn); }  // idle: kept for the next
  PGconn* conn;
  const std::string uri;
  class PgStatement* streaming = nullptr;  // a statement whose rows are still coming
  std::string lastError;
  int64_t changes = 0;
  // Between an exec of BEGIN and of COMMIT or ROLLBACK: a connection lost then is not
  // reconnected (the transaction is gone; its caller rolls back and begins again).
  bool inTransaction = false;
  // Counts reconnections: statements prepared before the last one prepare again.
  int64_t generation = 0;
  void finishStreaming();
  // A lost connection (the server restarted, or ended this session), outside a transaction:
  // connected again. False when it stays lost.
  bool reconnectIfLost() {
    // A connection the server ended while idle still says OK until its end is read.
    if (PQstatus(conn) == CONNECTION_OK && streaming == nullptr) PQconsumeInput(conn);
    if (PQstatus(conn) == CONNECTION_OK) return true;
    if (inTransaction) return false;
    PQreset(conn);
    if (PQstatus(conn) != CONNECTION_OK) return false;
    ++generation;
    return true;
  }
  void noteError(const char* what) {
    lastError = what;
    while (!lastError.empty() && (lastError.back() == '\n' || lastError.back() == ' '))
      lastError.pop_back();
  }
  // Reads results to the end of the command in flight; returns the last one's status.
  ExecStatusType drain(std::string* error) {
    ExecStatusType last = PGRES_COMMAND_OK;
    while (PGresult* r = PQgetResult(conn)) {
      const ExecStatusType st = PQresultStatus(r);
      if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE) {
        if (error != nullptr) *error = PQresultErrorMessage(r);
        last = st;
      } else if (last != PGRES_FATAL_ERROR && last != PGRES_BAD_RESPONSE) {
        last = st;
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
          const char* n = PQcmdTuples(r);
          changes = (n != nullptr && *n != 0) ? std::strtoll(n, nullptr, 10) : 0;
        }
      }
      PQclear(r);
    }
    return last;
  }
};

class PgStatement final : public Statement::Impl {
 public:
  // cursor: the rows are fetched kFetchRows at a time from a cursor of the server's (the SQL is
  // DECLARE name CURSOR FOR ...), in a transaction of its own unless one is open.
  // prepared: prepared on the server under `name` already; else it runs unnamed (parsed with
  // its run: one round trip) the first time and is prepared for the second.
  PgStatement(std::shared_ptr<PgConnection> c, std::string name, std::string sql, int params,
              bool cursor, bool prepared)
      : m_c(std::move(c)),
        m_name(std::move(name)),
        m_sql(std::move(sql)),
        m_cursor(cursor),
        m_prepared(prepared),
        m_generation(m_c->generation),
        m_values(static_cast<size_t>(params)),
        m_null(static_cast<size_t>(params), true),
        m_binary(static_cast<size_t>(params), 0) {}
  ~PgStatement() override {
    reset();
    m_c->finishStreaming();
    if (m_prepared && PQstatus(m_c->conn) == CONNECTION_OK)
      PQclear(PQexec(m_c->conn, ("DEALLOCATE " + m_name).c_str()));
  }

  void bindInt(int index, int64_t v) override { set(index, std::to_string(v), false); }
  void bindText(int index, std::string_view v) override { set(index, std::string(v), false); }
  void bindBlob(int index, std::string_view v) override { set(index, std::string(v), true); }
  void bindNull(int index) override {
    if (index >= 1 && static_cast<size_t>(index) <= m_values.size())
      m_null[static_cast<size_t>(index - 1)] = true;
  }

  bool step() override {
    clearRow();
    const bool first = m_state == State::kIdle;
    if (m_cursor) return stepCursor();
    if (first && !start()) return false;
    if (m_state == State::kBuffered) {
      if (!m_buffer.empty()) {
        showRow(m_buffer.front());
        m_buffer.pop_front();
        return true;
      }
      m_state = m_bufferedFailed ? State::kFailed : State::kDone;
      return false;
    }
    if (m_state != State::kStreaming) return false;
    PGresult* r = PQgetResult(m_c->conn);
    if (r != nullptr && PQresultStatus(r) == PGRES_SINGLE_TUPLE) {
      showRow(r);
      return true;
    }
    finishWith(r);
    // The connection turned out lost (the server ended it while it was idle) before a row of
    // a statement outside a transaction: once more on a new connection.
    if (first && m_state == State::kFailed && PQstatus(m_c->conn) != CONNECTION_OK &&
        !m_c->inTransaction) {
      m_state = State::kIdle;
      return step();
    }
    return false;
  }
  bool failed() const override { return m_state == State::kFailed; }
  void reset() override {
    clearRow();
    endCursor();
    if (m_state == State::kStreaming) {
      m_c->drain(nullptr);
      m_c->streaming = nullptr;
    }
    for (PGresult* r : m_buffer) PQclear(r);
    m_buffer.clear();
    m_state = State::kIdle;
    std::fill(m_null.begin(), m_null.end(), true);
  }
  int64_t columnInt(int i) const override {
    const char* v = value(i);
    if (v == nullptr) return 0;
    const int len = PQgetlength(m_res, m_resRow, i);
    switch (PQftype(m_res, i)) {
      case kInt8Oid:
        return static_cast<int64_t>(bigEndian(v, 8));
      case kInt4Oid:
        return static_cast<int32_t>(bigEndian(v, 4));
      case kInt2Oid:
        return static_cast<int16_t>(bigEndian(v, 2));
      case kOidOid:
        return static_cast<uint32_t>(bigEndian(v, 4));
      case kBoolOid:
        return v[0] != 0;
      case kNumericOid:
        return numericInteger(v, len);
      default:  // text
        return std::strtoll(std::string(v, static_cast<size_t>(len)).c_str(), nullptr, 10);
    }
  }
  bool columnNull(int i) const override {
    return m_res == nullptr || PQgetisnull(m_res, m_resRow, i) != 0;
  }
  std::string columnText(int i) const override {
    const char* v = value(i);
    return v ? std::string(v, static_cast<size_t>(PQgetlength(m_res, m_resRow, i))) : std::string();
  }
  std::string_view columnBlob(int i) const override {
    const char* v = value(i);
    if (v == nullptr) return {};
    return std::string_view(v, static_cast<size_t>(PQgetlength(m_res, m_resRow, i)));
  }
  std::string error() const override { return m_error.empty() ? m_c->lastError : m_error; }

  // Another command needs the connection: the rest of the rows wait here.
  void bufferRest() {
    while (PGresult* r = PQgetResult(m_c->conn)) {
      const ExecStatusType st = PQresultStatus(r);
      if (st == PGRES_SINGLE_TUPLE) {
        m_buffer.push_back(r);
        continue;
      }
      if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE) {
        m_bufferedFailed = true;
        m_error = PQresultErrorMessage(r);
      }
      PQclear(r);
    }
    m_state = State::kBuffered;
    m_c->streaming = nullptr;
  }

 private:
  enum class State { kIdle, kStreaming, kBuffered, kCursor, kDone, kFailed };
  static constexpr int kFetchRows = 8192;

  bool stepCursor() {
    if (m_state == State::kIdle) {
      m_c->finishStreaming();
      m_error.clear();
      if (!m_c->reconnectIfLost() || !prepareAgainIfReconnected()) return fail();
      if (!m_c->inTransaction) {
        PGresult* r = PQexec(m_c->conn, "BEGIN READ ONLY");
        const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        if (!ok) m_error = PQresultErrorMessage(r);
        PQclear(r);
        if (!ok) return fail();
        m_ownTransaction = true;
        m_c->inTransaction = true;
      }
      std::vector<const char*> values;
      std::vector<int> lengths;
      paramArrays(&values, &lengths);
      PGresult* r = PQexecPrepared(m_c->conn, m_name.c_str(), static_cast<int>(values.size()),
                                   values.data(), lengths.data(), m_binary.data(), 1);
      const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
      if (!ok) m_error = PQresultErrorMessage(r);
      PQclear(r);
      if (!ok) return fail();
      m_state = State::kCursor;
      m_cursorOpen = true;
    }
    if (m_state != State::kCursor) return false;
    if (m_batch != nullptr && ++m_batchRow < PQntuples(m_batch)) {
      m_res = m_batch;
      m_resRow = m_batchRow;
      return true;
    }
    if (m_batch != nullptr) PQclear(m_batch);
    m_batch = PQexecParams(
        m_c->conn, ("FETCH " + std::to_string(kFetchRows) + " FROM " + cursorName()).c_str(), 0,
        nullptr, nullptr, nullptr, nullptr, 1);
    m_batchRow = 0;
    if (PQresultStatus(m_batch) != PGRES_TUPLES_OK) {
      m_error = PQresultErrorMessage(m_batch);
      return fail();
    }
    if (PQntuples(m_batch) == 0) {
      endCursor();
      m_state = State::kDone;
      return false;
    }
    m_res = m_batch;
    m_resRow = 0;
    return true;
  }
  // The cursor closed, its transaction ended (when it began one).
  void endCursor() {
    if (m_batch != nullptr) PQclear(m_batch);
    m_batch = nullptr;
    if (m_cursorOpen && PQstatus(m_c->conn) == CONNECTION_OK)
      PQclear(PQexec(m_c->conn, ("CLOSE " + cursorName()).c_str()));
    m_cursorOpen = false;
    if (m_ownTransaction) {
      if (PQstatus(m_c->conn) == CONNECTION_OK) PQclear(PQexec(m_c->conn, "COMMIT"));
      m_c->inTransaction = false;
      m_ownTransaction = false;
    }
  }
  bool fail() {
    m_c->noteError(m_error.empty() ? PQerrorMessage(m_c->conn) : m_error.c_str());
    if (m_error.empty()) m_error = m_c->lastError;
    if (m_ownTransaction) {
      if (PQstatus(m_c->conn) == CONNECTION_OK) PQclear(PQexec(m_c->conn, "ROLLBACK"));
      m_c->inTransaction = false;
      m_ownTransaction = false;
    }
    m_cursorOpen = false;
    if (m_batch != nullptr) PQclear(m_batch);
    m_batch = nullptr;
    m_state = State::kFailed;
    return false;
  }
  std::string cursorName() const { return m_name + "_rows"; }
  void paramArrays(std::vector<const char*>* values, std::vector<int>* lengths) const {
    const size_t n = m_values.size();
    values->resize(n);
    lengths->resize(n);
    for (size_t k = 0; k < n; ++k) {
      (*values)[k] = m_null[k] ? nullptr : m_values[k].data();
      (*lengths)[k] = static_cast<int>(m_values[k].size());
    }
  }
  // A statement prepared before the connection was made again is prepared again.
  bool prepareAgainIfReconnected() {
    if (!m_prepared || m_generation == m_c->generation) return true;
    PGresult* r = PQprepare(m_c->conn, m_name.c_str(), m_sql.c_str(), 0, nullptr);
    const bool ok = r != nullptr && PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) m_error = r != nullptr ? PQresultErrorMessage(r) : PQerrorMessage(m_c->conn);
    PQclear(r);
    if (ok) m_generation = m_c->generation;
    return ok;
  }

  void set(int index, std::string v, bool binary) {
    if (index < 1 || static_cast<size_t>(index) > m_values.size()) return;
    const size_t k = static_cast<size_t>(index - 1);
    m_values[k] = std::move(v);
    m_null[k] = false;
    m_binary[k] = binary ? 1 : 0;
  }
  bool start() {
    m_c->finishStreaming();
    m_error.clear();
    if (!m_c->reconnectIfLost()) {
      m_error = "the connection to PostgreSQL is lost: " + std::string(PQerrorMessage(m_c->conn));
      m_c->noteError(m_error.c_str());
      m_state = State::kFailed;
      return false;
    }
    if (!prepareAgainIfReconnected()) {  // reconnected since: the server forgot it
      m_c->noteError(m_error.c_str());
      m_state = State::kFailed;
      return false;
    }
    if (!m_prepared && m_runs > 0) {  // its second run: prepared from now on
      PGresult* r = PQprepare(m_c->conn, m_name.c_str(), m_sql.c_str(), 0, nullptr);
      m_prepared = r != nullptr && PQresultStatus(r) == PGRES_COMMAND_OK;
      m_generation = m_c->generation;
      PQclear(r);
    }
    ++m_runs;
    m_bufferedFailed = false;
    std::vector<const char*> values;
    std::vector<int> lengths;
    paramArrays(&values, &lengths);
    const int n = static_cast<int>(values.size());
    const int sent = m_prepared
                         ? PQsendQueryPrepared(m_c->conn, m_name.c_str(), n, values.data(),
                                               lengths.data(), m_binary.data(), 1)
                         : PQsendQueryParams(m_c->conn, m_sql.c_str(), n, nullptr, values.data(),
                                             lengths.data(), m_binary.data(), 1);
    if (sent == 0) {
      m_error = PQerrorMessage(m_c->conn);
      m_state = State::kFailed;
      return false;
    }
    PQsetSingleRowMode(m_c->conn);
    m_state = State::kStreaming;
    m_c->streaming = this;
    return true;
  }
  // r: the first result that is not a row (or none).
  void finishWith(PGresult* r) {
    bool bad = false;
    if (r != nullptr) {
      const ExecStatusType st = PQresultStatus(r);
      bad = st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE;
      if (bad) {
        m_error = PQresultErrorMessage(r);
        // Class 42 (syntax, unknown names, types): SQL of tidemark's own refused, a bug. Said.
        const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        if (state != nullptr && state[0] == '4' && state[1] == '2')
          std::fprintf(stderr, "tidemarkd: PostgreSQL refused a statement: %s  %s\n",
                       m_error.c_str(), m_sql.c_str());
      } else {
        const char* n = PQcmdTuples(r);
        m_c->changes = (n != nullptr && *n != 0) ? std::strtoll(n, nullptr, 10) : 0;
      }
      PQclear(r);
    }
    std::string more;
    if (m_c->drain(&more) == PGRES_FATAL_ERROR) {
      bad = true;
      m_error = more;
    }
    m_c->streaming = nullptr;
    if (bad) m_c->noteError(m_error.c_str());
    m_state = bad ? State::kFailed : State::kDone;
  }
  const char* value(int i) const {
    if (m_res == nullptr || i < 0 || i >= PQnfields(m_res) || PQgetisnull(m_res, m_resRow, i))
      return nullptr;
    return PQgetvalue(m_res, m_resRow, i);
  }
  void clearRow() {
    if (m_row != nullptr) PQclear(m_row);
    m_row = nullptr;
    m_res = nullptr;
  }
  void showRow(PGresult* row) {
    m_row = row;
    m_res = row;
    m_resRow = 0;
  }

  std::shared_ptr<PgConnection> m_c;
  std::string m_name;
  std::string m_sql;  // as prepared ($N parameters)
  const bool m_cursor;
  bool m_prepared;
  int64_t m_runs = 0;
  int64_t m_generation;  // the connection's when prepared
  std::vector<std::string> m_values;
  std::vector<bool> m_null;
  std::vector<int> m_binary;
  State m_state = State::kIdle;
  PGresult* m_row = nullptr;  // the row of single-row mode (owned)
  // The row the columns read: m_row, or a row of a cursor's batch.
  const PGresult* m_res = nullptr;
  int m_resRow = 0;
  PGresult* m_batch = nullptr;  // a cursor's fetched rows
  int m_batchRow = 0;
  bool m_cursorOpen = false;
  bool m_ownTransaction = false;
  std::deque<PGresult*> m_buffer;
  bool m_bufferedFailed = false;
  std::string m_error;
};

void PgConnection::finishStreaming() {
  if (streaming != nullptr) streaming->bufferRest();
}

class PgDatabase final : public Database::Impl {
 public:
  PgDatabase(PGconn* conn, std::string uri, bool readOnly)
      : m_c(std::make_shared<PgConnection>(conn, std::move(uri))), m_readOnly(readOnly) {}

  Dialect dialect() const override { return Dialect::kPostgres; }
  absl::Status exec(std::string_view sql) override {
    m_c->finishStreaming();
    const bool begins = sql.starts_with("BEGIN");
    const bool ends =
        sql == "COMMIT" || sql == "END" || (sql.starts_with("ROLLBACK") && sql.size() == 8);
    if (ends && PQstatus(m_c->conn) != CONNECTION_OK) {
      // The transaction went with the connection: nothing to end but the flag.
      m_c->inTransaction = false;
      return absl::UnavailableError("the connection to PostgreSQL was lost in a transaction");
    }
    if (!m_c->reconnectIfLost()) return failure();
    std::string error;
    bool failed = PQsendQuery(m_c->conn, std::string(sql).c_str()) == 0 ||
                  m_c->drain(&error) == PGRES_FATAL_ERROR;
    if (failed && PQstatus(m_c->conn) != CONNECTION_OK && !m_c->inTransaction) {
      // Lost while idle (the server ended it): once more on a new connection.
      if (!m_c->reconnectIfLost()) return failure();
      error.clear();
      failed = PQsendQuery(m_c->conn, std::string(sql).c_str()) == 0 ||
               m_c->drain(&error) == PGRES_FATAL_ERROR;
    }
    if (failed && error.empty()) error = PQerrorMessage(m_c->conn);
    if (ends) m_c->inTransaction = false;
    if (begins) m_c->inTransaction = PQtransactionStatus(m_c->conn) != PQTRANS_IDLE;
    if (failed) {
      m_c->noteError(error.c_str());
      return absl::InternalError(m_c->lastError);
    }
    return absl::OkStatus();
  }
  std::unique_ptr<Statement::Impl> prepare(std::string_view sql) override {
    return prepareAs(sql, false);
  }
  std::unique_ptr<Statement::Impl> prepareStream(std::string_view sql) override {
    return prepareAs(sql, true);
  }
  std::unique_ptr<Statement::Impl> prepareAs(std::string_view sql, bool cursor) {
    m_c->finishStreaming();
    m_c->reconnectIfLost();  // (else PQprepare says why)
    int params = 0;
    // Names unique in the process: a pooled connection may hold its earlier users' (released).
    static std::atomic<int64_t> names{0};
    std::string name = "tidemark_" + std::to_string(names.fetch_add(1) + 1);
    const std::string text =
        (cursor ? "DECLARE " + name + "_rows NO SCROLL CURSOR FOR " : std::string()) +
        renameParameters(sql, &params);
    if (m_readOnly && !cursor) {
      // A reader's statement mostly runs once: not prepared until it runs a second time.
      return std::make_unique<PgStatement>(m_c, std::move(name), text, params, false, false);
    }
    PGresult* r = PQprepare(m_c->conn, name.c_str(), text.c_str(), 0, nullptr);
    const bool ok = r != nullptr && PQresultStatus(r) == PGRES_COMMAND_OK;
    m_c->noteError(r != nullptr ? PQresultErrorMessage(r) : PQerrorMessage(m_c->conn));
    PQclear(r);
    if (!ok) {
      // A statement of tidemark's own the server refuses is a bug: said, not only returned.
      std::fprintf(stderr, "tidemarkd: PostgreSQL refused a statement: %s\n  %s\n",
                   m_c->lastError.c_str(), text.c_str());
      return nullptr;
    }
    return std::make_unique<PgStatement>(m_c, std::move(name), text, params, cursor, true);
  }
  std::string error() const override { return m_c->lastError; }
  int64_t changes() const override { return m_c->changes; }
  int64_t lastInsertId() const override { return -1; }
  absl::Status copyIn(std::string_view table, std::string_view columns,
                      std::string_view rows) override {
    m_c->finishStreaming();
    const std::string sql =
        "COPY " + std::string(table) + " (" + std::string(columns) + ") FROM STDIN";
    PGresult* r = PQexec(m_c->conn, sql.c_str());
    const bool copying = r != nullptr && PQresultStatus(r) == PGRES_COPY_IN;
    if (!copying) m_c->noteError(r ? PQresultErrorMessage(r) : PQerrorMessage(m_c->conn));
    PQclear(r);
    if (!copying) {
      m_c->drain(nullptr);
      return absl::InternalError(m_c->lastError);
    }
    constexpr size_t kPiece = size_t{1} << 20;
    bool sent = true;
    for (size_t at = 0; at < rows.size() && sent; at += kPiece) {
      const size_t n = std::min(kPiece, rows.size() - at);
      sent = PQputCopyData(m_c->conn, rows.data() + at, static_cast<int>(n)) == 1;
    }
    if (PQputCopyEnd(m_c->conn, sent ? nullptr : "tidemark stopped sending") != 1) return failure();
    std::string error;
    if (m_c->drain(&error) == PGRES_FATAL_ERROR || !sent) {
      m_c->noteError(error.empty() ? PQerrorMessage(m_c->conn) : error.c_str());
      return absl::InternalError(m_c->lastError);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status failure() {
    m_c->noteError(PQerrorMessage(m_c->conn));
    return absl::UnavailableError(m_c->lastError);
  }
  std::shared_ptr<PgConnection> m_c;
  const bool m_readOnly;  // a reader's (Database::open's readOnly)
};

}  // namespace

absl::Status openPostgres(const std::string& uri, bool readOnly,
                          std::unique_ptr<Database::Impl>* out) {
  if (PGconn* pooled = ConnectionPool::instance().take(uri)) {
    *out = std::make_unique<PgDatabase>(pooled, uri, readOnly);
    return absl::OkStatus();
  }
  PGconn* conn = PQconnectdb(uri.c_str());
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    std::string why = conn ? PQerrorMessage(conn) : "out of memory";
    while (!why.empty() && why.back() == '\n') why.pop_back();
    PQfinish(conn);
    return absl::UnavailableError("cannot connect to " + displayLocator(uri) + ": " + why);
  }
  // CREATE ... IF NOT EXISTS and the like say NOTICE: not for the daemon's log.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  *out = std::make_unique<PgDatabase>(conn, uri, readOnly);
  return absl::OkStatus();
}

std::string postgresDdl(std::string_view sqlite) {
  std::string out;
  out.reserve(sqlite.size() + 1024);
  size_t i = 0;
  auto word = [&](std::string_view w) { return sqlite.substr(i, w.size()) == w; };
  bool comment = false;
  while (i < sqlite.size()) {
    const char c = sqlite[i];
    if (comment || c == '\n') {
      comment = comment && c != '\n';
      out += c;
      ++i;
      continue;
    }
    if (word("--")) {
      comment = true;
      continue;
    }
    if (word("INTEGER PRIMARY KEY,") || word("INTEGER PRIMARY KEY\n")) {
      out += "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY";
      i += 19;
    } else if (word("INTEGER")) {
      out += "BIGINT";
      i += 7;
    } else if (word("BLOB")) {
      out += "BYTEA";
      i += 4;
    } else if (word(" WITHOUT ROWID")) {
      i += 14;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace tidemark::server
