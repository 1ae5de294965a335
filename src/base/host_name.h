#pragma once

#include <unistd.h>

#include <string>

namespace tidemark::base {

// This host's name ("" where the kernel gives none): what agents put in their handshake, and
// what tells the daemon a job's pid is one of this host's.
inline std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

}  // namespace tidemark::base
