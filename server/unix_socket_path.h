#pragma once

#include <string>

#include "absl/status/status.h"

namespace tidemark::server {

// Makes `path` free for a daemon's Unix socket: a stale socket (nobody accepts on it) is removed;
// a socket a daemon still serves, or anything that is not a socket, is refused and left as it is.
absl::Status claimUnixSocketPath(const std::string& path);

}  // namespace tidemark::server
