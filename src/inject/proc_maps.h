#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tidemark::inject {

// One line of /proc/PID/maps.
struct Mapping {
  uint64_t begin = 0, end = 0, offset = 0;
  std::string perms;  // "r-xp"
  std::string path;   // "" for anonymous memory
  bool executable() const { return perms.size() > 2 && perms[2] == 'x'; }
};

std::vector<Mapping> parseMaps(const std::string& text);
absl::StatusOr<std::vector<Mapping>> readMaps(pid_t pid);

// The mapping at offset 0 of the first file whose path ends with `suffix` (a file name like
// "/libc.so.6", or a whole path).
std::optional<Mapping> findObject(const std::vector<Mapping>& maps, const std::string& suffix);
// True if address lies in an executable mapping of a file whose path contains one of `names`.
bool inCodeOf(const std::vector<Mapping>& maps, uint64_t address,
              const std::vector<std::string>& names);

}  // namespace tidemark::inject
