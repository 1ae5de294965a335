#include "tests/support/postgres_test_db.h"

#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>

namespace tidemark::test_support {

absl::StatusOr<std::string> freshPostgresDatabase() {
  const char* file = std::getenv("TIDEMARK_TEST_POSTGRES_FILE");
  std::string admin;
  if (file != nullptr) std::getline(std::ifstream(file), admin);
  if (admin.empty()) {
    return absl::FailedPreconditionError(
        "no PostgreSQL server for the tests: run them with ctest (its `postgres` fixture starts "
        "one), or start one with scripts/postgres-test-server.sh start FILE and set "
        "TIDEMARK_TEST_POSTGRES_FILE=FILE");
  }
  static std::atomic<int> counter{0};
  const std::string name =
      "t" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1));
  PGconn* conn = PQconnectdb(admin.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    const std::string why = PQerrorMessage(conn);
    PQfinish(conn);
    return absl::UnavailableError("the tests' PostgreSQL server (" + admin + "): " + why);
  }
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  PQclear(PQexec(conn, ("DROP DATABASE IF EXISTS " + name).c_str()));  // a pid reused
  PGresult* r = PQexec(conn, ("CREATE DATABASE " + name).c_str());
  const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  const std::string why = PQresultErrorMessage(r);
  PQclear(r);
  PQfinish(conn);
  if (!ok) return absl::InternalError("CREATE DATABASE " + name + ": " + why);
  // postgresql://tidemark@/tidemark?host=... -> the same with the new database's name.
  const size_t slash = admin.find('/', admin.find("://") + 3);
  const size_t query = admin.find('?', slash);
  return admin.substr(0, slash + 1) + name +
         (query == std::string::npos ? std::string() : admin.substr(query));
}

}  // namespace tidemark::test_support
