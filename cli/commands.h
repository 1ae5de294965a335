#pragma once

#include <string>
#include <vector>

namespace tidemark::cli {

// Exit codes of the tidemark CLI.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;        // the server answered with an error (not found, ...)
inline constexpr int kExitUsage = 2;        // bad arguments
inline constexpr int kExitUnreachable = 3;  // no tidemarkd at the address
inline constexpr int kExitInfeasible = 4;   // no recompute plan fits the budget
// The daemon refused the caller: another user's session, or a caller it cannot identify
// (PERMISSION_DENIED, UNAUTHENTICATED), or a daemon not run by this user or root.
inline constexpr int kExitRefused = 5;

struct GlobalOptions {
  std::string server;  // --server, else $TIDEMARK_SERVER, else base::defaultDaemonAddress()
  bool json = false;
  std::string token;  // --token-file, else $TIDEMARK_TOKEN or $TIDEMARK_TOKEN_FILE ("": none)
  // --tls-ca / --tls-cert / --tls-key (else $TIDEMARK_TLS_CA, ...): PEM files for TLS.
  std::string tlsCa;
  std::string tlsCert;
  std::string tlsKey;
  // --db FILE: a store file read in this process instead of a daemon ("": talk to g.server).
  std::string dbFile;
  // --deadline S: at most S seconds for each call to the daemon (0: each command's own).
  int deadlineS = 0;
};

int runCommand(const GlobalOptions& g, const std::vector<std::string>& args);
// A capture schedule's options (--steps, or --every with --window): true when they make one or
// none; else says why on stderr, as `tidemark COMMAND: ...`.
bool checkCaptureOptions(const char* command, const std::string& steps, const std::string& every,
                         const std::string& window);
int sessionsCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int jobsCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int jobCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int deleteCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int breakdownCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int uploadCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int timelineCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int peakCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int stepsCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int exportCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int opsCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int diffCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int planCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int paretoCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int chainCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int applyCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int planCheckCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int importCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int blockCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int attachCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int detachCommand(const GlobalOptions& g, const std::vector<std::string>& args);
int tokenCommand(const GlobalOptions& g, const std::vector<std::string>& args);

}  // namespace tidemark::cli
