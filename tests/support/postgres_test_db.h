#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tidemark::test_support {

// A new, empty database on the tests' PostgreSQL server (scripts/postgres-test-server.sh, which
// ctest's `postgres` fixture starts; its URI file is named by TIDEMARK_TEST_POSTGRES_FILE), as a
// store locator. An error, saying how to get a server, when there is none: the tests that need
// one fail then, never skip.
absl::StatusOr<std::string> freshPostgresDatabase();

}  // namespace tidemark::test_support
