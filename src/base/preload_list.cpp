#include "src/base/preload_list.h"

#include <sys/stat.h>

namespace tidemark::base {

namespace {
template <typename Visit>
void forEachEntry(const char* preload, Visit&& visit) {
  if (preload == nullptr) return;
  std::string_view rest(preload);
  while (!rest.empty()) {
    const size_t end = rest.find_first_of(": ");
    const std::string_view entry = rest.substr(0, end);
    if (!entry.empty()) visit(entry);
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
}

std::string_view fileName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}
}  // namespace

bool preloadEntryIs(std::string_view entry, const std::string& self) {
  if (entry.empty() || self.empty()) return false;
  if (entry.find('/') == std::string_view::npos) return entry == fileName(self);
  struct stat a {};
  struct stat b {};
  return ::stat(std::string(entry).c_str(), &a) == 0 && ::stat(self.c_str(), &b) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

bool preloadEntryIsAgent(std::string_view entry, const std::string& agent) {
  return entry.find("libtidemark_agent") != std::string_view::npos || preloadEntryIs(entry, agent);
}

bool preloadNames(const char* preload, const std::function<bool(std::string_view)>& is) {
  bool found = false;
  forEachEntry(preload, [&](std::string_view entry) { found = found || is(entry); });
  return found;
}

std::string preloadWithout(const char* preload, const std::function<bool(std::string_view)>& is) {
  std::string kept;
  forEachEntry(preload, [&](std::string_view entry) {
    if (is(entry)) return;
    if (!kept.empty()) kept += ':';
    kept += entry;
  });
  return kept;
}

}  // namespace tidemark::base
