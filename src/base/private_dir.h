#pragma once

#include <string>

namespace tidemark::base {

// Makes dir if missing (its parents as usual, dir itself 0700). "" when dir is then a directory
// of this user's that no other user can enter; otherwise why not (another user's, open to
// others, not a directory): nothing of tidemark's goes there.
std::string makePrivateDirectory(const std::string& dir);

// Where the agent writes what no daemon took (spool files, and its buffer's overflow):
// $XDG_STATE_HOME/tidemark/spool, or ~/.local/state/tidemark/spool. Private (0700).
std::string defaultSpoolDirectory();

}  // namespace tidemark::base
