#include "server/store/database.h"

#include <filesystem>

namespace tidemark::server {

bool isPostgresLocator(std::string_view locator) {
  return locator.starts_with("postgresql://") || locator.starts_with("postgres://");
}

std::string scratchDirFor(std::string_view locator) {
  const std::filesystem::path dir = isPostgresLocator(locator)
                                        ? std::filesystem::temp_directory_path()
                                        : std::filesystem::path(locator).parent_path();
  return dir.empty() ? "." : dir.string();
}

std::string displayLocator(std::string_view locator) {
  if (!isPostgresLocator(locator)) return std::string(locator);
  // scheme://user:password@host/db -> scheme://user@host/db
  const size_t scheme = locator.find("://") + 3;
  const size_t at = locator.find('@', scheme);
  if (at == std::string_view::npos) return std::string(locator);
  const size_t colon = locator.find(':', scheme);
  if (colon == std::string_view::npos || colon > at) return std::string(locator);
  return std::string(locator.substr(0, colon)) + std::string(locator.substr(at));
}

absl::Status Statement::run() {
  if (!ok()) return absl::InternalError("statement failed to prepare");
  while (step()) {
  }
  const bool bad = failed();
  const std::string why = bad ? error() : std::string();
  reset();
  if (bad) return absl::InternalError(why);
  return absl::OkStatus();
}

absl::Status Database::open(const std::string& locator, bool readOnly, Database* out) {
  std::unique_ptr<Impl> impl;
  absl::Status s = isPostgresLocator(locator) ? openPostgres(locator, readOnly, &impl)
                                              : openSqlite(locator, readOnly, &impl);
  if (!s.ok()) return s;
  out->m_impl = std::move(impl);
  return absl::OkStatus();
}

}  // namespace tidemark::server
