#include "src/inject/proc_maps.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tidemark::inject {

std::vector<Mapping> parseMaps(const std::string& text) {
  std::vector<Mapping> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string range, perms, offset, dev, inode;
    if (!(l >> range >> perms >> offset >> dev >> inode)) continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    Mapping m;
    try {
      m.begin = std::stoull(range.substr(0, dash), nullptr, 16);
      m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
      m.offset = std::stoull(offset, nullptr, 16);
    } catch (...) {
      continue;
    }
    m.perms = perms;
    std::getline(l >> std::ws, m.path);
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<std::vector<Mapping>> readMaps(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/maps");
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::stringstream s;
  s << in.rdbuf();
  return parseMaps(s.str());
}

namespace {
bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::optional<Mapping> findObject(const std::vector<Mapping>& maps, const std::string& suffix) {
  for (const Mapping& m : maps)
    if (m.offset == 0 && !m.path.empty() && endsWith(m.path, suffix)) return m;
  return std::nullopt;
}

bool inCodeOf(const std::vector<Mapping>& maps, uint64_t address,
              const std::vector<std::string>& names) {
  for (const Mapping& m : maps) {
    if (address < m.begin || address >= m.end || !m.executable()) continue;
    for (const std::string& n : names)
      if (m.path.find(n) != std::string::npos) return true;
  }
  return false;
}

}  // namespace tidemark::inject
