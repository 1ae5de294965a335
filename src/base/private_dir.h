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

// Where the agent hands its exit's rest to the daemon first (docs/architecture.md, "Handoff at
// exit"): /dev/shm/tidemark-<uid> where /dev/shm is a memory file system (a write of a hundred
// megabytes there takes tens of milliseconds, to a disk's page cache it took up to a second on a
// busy machine); "" where it is not. Private (0700), like the spool directory, which is where a
// file goes that does not fit or cannot be written here.
std::string defaultHandoffDirectory();

}  // namespace tidemark::base
