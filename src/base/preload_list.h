#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace tidemark::base {

// LD_PRELOAD's entries (separated by ':' or spaces, as the dynamic loader reads them).

// Whether an entry names the file `self` (an absolute path): the same file by device and inode
// (any other path to it: a symbolic link, a copy's own path), or, for an entry without a '/'
// (which the loader looks up in its search path), the same file name.
bool preloadEntryIs(std::string_view entry, const std::string& self);

// Whether an entry names tidemark's agent: its installed name (libtidemark_agent), or the file
// `agent` is, by any name (`TIDEMARK_AGENT` may name a copy or a link called otherwise).
bool preloadEntryIsAgent(std::string_view entry, const std::string& agent);

// Whether some entry of `preload` satisfies `is`.
bool preloadNames(const char* preload, const std::function<bool(std::string_view)>& is);

// `preload` without the entries that satisfy `is`, the others in their order, ':'-separated.
std::string preloadWithout(const char* preload, const std::function<bool(std::string_view)>& is);

}  // namespace tidemark::base
