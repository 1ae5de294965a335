#pragma once

#include <string>

namespace tidemark::cli {

// Where the agent library and the Python adapter are: $TIDEMARK_AGENT / $TIDEMARK_PYTHON_DIR,
// else beside the tidemark binary (build tree or installation). "" when not found.
std::string findAgent();
std::string findPythonDir();
// tidemarkd: $TIDEMARK_DAEMON, else beside the tidemark binary. "" when not found.
std::string findDaemon();

}  // namespace tidemark::cli
