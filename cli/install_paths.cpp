#include "cli/install_paths.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace tidemark::cli {

namespace fs = std::filesystem;

namespace {

fs::path selfDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return fs::current_path();
  buf[n] = '\0';
  return fs::path(buf).parent_path();
}

}  // namespace

std::string findAgent() {
  if (const char* e = std::getenv("TIDEMARK_AGENT"); e != nullptr && *e != '\0') return e;
  const fs::path dir = selfDir();
  for (const fs::path& p :
       {dir / "../lib/libtidemark_agent.so", dir / "../lib/tidemark/libtidemark_agent.so"}) {
    std::error_code ec;
    if (fs::exists(p, ec)) return fs::canonical(p, ec).string();
  }
  return {};
}

std::string findDaemon() {
  if (const char* e = std::getenv("TIDEMARK_DAEMON"); e != nullptr && *e != '\0') return e;
  std::error_code ec;
  const fs::path beside = selfDir() / "tidemarkd";
  return fs::exists(beside, ec) ? beside.string() : std::string();
}

std::string findPythonDir() {
  if (const char* e = std::getenv("TIDEMARK_PYTHON_DIR"); e != nullptr && *e != '\0') return e;
  const fs::path dir = selfDir();
  for (const fs::path& p : {dir / "../share/tidemark/python", fs::path(TIDEMARK_INSTALL_PYTHON_DIR),
                            fs::path(TIDEMARK_SOURCE_PYTHON_DIR)}) {
    std::error_code ec;
    if (fs::exists(p / "tidemark" / "__init__.py", ec)) return fs::canonical(p, ec).string();
  }
  return {};
}

}  // namespace tidemark::cli
