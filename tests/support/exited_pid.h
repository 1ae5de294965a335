#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

namespace tidemark::test_support {

// A pid that no process has now: a child that exited and was reaped (a process that is gone,
// for the daemon's checks of a session's process).
inline int32_t exitedPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return static_cast<int32_t>(child);
}

}  // namespace tidemark::test_support
