#pragma once

#include <string>

namespace tidemark::cli {

// The per-user daemon, started on demand (as gpg-agent is): when `address` is the user's own
// default socket (base::defaultDaemonAddress) and nobody answers there, starts tidemarkd in the
// background with its defaults (that socket; the store under $XDG_DATA_HOME/tidemark/) and waits
// until it answers. Says so once on stderr. Does nothing for any other address. False (after
// saying why) when a daemon was needed and could not be started.
bool ensureOwnDaemon(const std::string& address);

}  // namespace tidemark::cli
