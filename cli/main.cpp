// tidemark: the command line. A thin gRPC client of tidemarkd, plus `run`, which starts a job
// with the agent in it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "src/base/daemon_address.h"

namespace {

constexpr const char* kUsage = R"(usage: tidemark [--server ADDR | --db FILE] COMMAND [ARGS]

Memory profiler and recompute advisor for training jobs.

commands:
  run [--name NAME] [--quiet] -- CMD...   run CMD with the agent in it; exits with CMD's code
  attach PID [--name NAME] [--no-adapter] record a running process started without tidemark
  detach PID                              stop recording it (the agent stays, dormant)
  sessions [--json]                       list recorded sessions
  jobs [--json]                           list training jobs (a session per rank)
  job JOB [--json]                        a job's ranks side by side: peaks, step times,
                                          the rank that sets the memory need, the imbalance
  delete SESSION [--json]                 delete an ended session and all stored about it
  breakdown SESSION [--step N] [--at peak|TIME] [--device D] [--json]
                                          memory by category at a moment (default: the peak)
  peak SESSION [--step N] [--top K] [--device D] [--json]
                                          the peak: by category, module and tensor
  timeline SESSION [--from T --to T] [--buckets N] [--device D] [--json]
                                          memory over time, per category (min/max/last)
  steps SESSION [--device D] [--json]     every step's time and peak by category, compared
  block SESSION ADDRESS [--json]          a block's history: allocation, stack, tags, free
  ops SESSION [--json]                    time per module: calls, total and self
  export SESSION [--format chrome] [-o FILE]
                                          a Chrome trace for Perfetto / chrome://tracing
  diff SESSION_A SESSION_B [--json]       two sessions' peaks by category, side by side
  upload SPOOL [--json]                   send a spool file (the rest of a run no daemon took)
  import FILE [--name NAME] [--json]      a PyTorch memory snapshot or Kineto trace as a session
  plan (SESSION | --job JOB | --profile FILE) --budget SIZE [--strategy S] [--out FILE] [--json]
                                          a recompute plan for a memory budget, predicted
  chain SESSION [--out FILE] [--json]     the chain model of a recorded step, checked against it
  pareto (SESSION | --profile FILE) [--json]
                                          least recomputation for every budget (optimal plans)
  apply SESSION PLAN [--no-wait]          apply a plan to the running job at its next step
  apply --job JOB PLAN                    ... to every running rank of a job, from one step on
  plan-check SESSION [--json]             applied plans: predicted against measured
  plan-check --job JOB [--json]           ... rank by rank
  token create|list|revoke                the daemon's tokens (its own user or root)

D (--device): all (host and devices, the default), cpu, cuda (every GPU) or cuda:N

options (every command):
  --server ADDR   tidemarkd's address: unix:/path or HOST:PORT (default $TIDEMARK_SERVER, else
                  your own daemon's socket, unix:$XDG_RUNTIME_DIR/tidemark/tidemarkd.sock or
                  unix:~/.cache/tidemark/tidemarkd.sock, started on demand); only a daemon run
                  by you or root is sent anything
  --db FILE       read the store file FILE directly, no daemon (one a tidemarkd wrote, running
                  or not; by default ~/.local/share/tidemark/tidemark.db): every command that
                  reads (sessions, jobs, job, breakdown, peak, timeline, steps, block, ops,
                  export, diff, plan, chain, pareto, plan-check); nothing is written to it
  --token-file F  present the token in file F (default $TIDEMARK_TOKEN, or the file named by
                  $TIDEMARK_TOKEN_FILE): for a daemon that requires one (docs/security.md)
  --tls-ca F      talk TLS to the daemon, its certificate checked against the CA in PEM file F
                  (default $TIDEMARK_TLS_CA); --tls-cert F and --tls-key F: this client's own,
                  for a daemon that asks (default $TIDEMARK_TLS_CERT, $TIDEMARK_TLS_KEY)
  --deadline S    wait at most S seconds for each answer of the daemon (default: the
                  command's own, 30 s to 10 min; import and upload: none); one that does
                  not answer in time exits 3
  --json          machine-readable output
  -h, --help      this help (or: tidemark COMMAND --help)
  --version       print the version

exit codes: 0 ok, 1 the server answered with an error, 2 bad usage, 3 no tidemarkd reachable (or
none answered in time), 4 no plan fits the budget, 5 refused (another user's session, or a daemon
not run by you or root); `run` exits with the job's own exit code.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tidemark::cli;
  // gRPC's own log would repeat, less clearly, what the CLI says about a failed call.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  GlobalOptions g;
  const char* env = std::getenv("TIDEMARK_SERVER");
  g.server = (env != nullptr && *env != '\0') ? env : tidemark::base::defaultDaemonAddress();
  const char* token = std::getenv("TIDEMARK_TOKEN");
  const char* tokenFile = std::getenv("TIDEMARK_TOKEN_FILE");
  g.token = tidemark::base::readToken(token ? token : "", tokenFile ? tokenFile : "");

  std::string command;
  std::vector<std::string> args;
  bool passthrough = false;  // after `--`, everything belongs to the job
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (passthrough) {
      args.push_back(a);
      continue;
    }
    if (a == "--") {
      passthrough = true;
      args.push_back(a);
    } else if (a == "--server") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tidemark: --server needs an address\n");
        return kExitUsage;
      }
      g.server = argv[++i];
    } else if (a.rfind("--server=", 0) == 0) {
      g.server = a.substr(9);
    } else if (a == "--db") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tidemark: --db needs a store file\n");
        return kExitUsage;
      }
      g.dbFile = argv[++i];
    } else if (a.rfind("--db=", 0) == 0) {
      g.dbFile = a.substr(5);
    } else if (a == "--token-file") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tidemark: --token-file needs a file\n");
        return kExitUsage;
      }
      g.token = tidemark::base::readToken("", argv[++i]);
      if (g.token.empty()) {
        std::fprintf(stderr, "tidemark: --token-file %s: no token in it\n", argv[i]);
        return kExitUsage;
      }
    } else if (a == "--tls-ca" || a == "--tls-cert" || a == "--tls-key") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tidemark: %s needs a PEM file\n", a.c_str());
        return kExitUsage;
      }
      std::string& field = a == "--tls-ca" ? g.tlsCa : a == "--tls-cert" ? g.tlsCert : g.tlsKey;
      field = argv[++i];
      // The agent of `tidemark run` reads them from its environment.
      setenv(a == "--tls-ca"     ? "TIDEMARK_TLS_CA"
             : a == "--tls-cert" ? "TIDEMARK_TLS_CERT"
                                 : "TIDEMARK_TLS_KEY",
             field.c_str(), 1);
    } else if (a == "--deadline" || a.rfind("--deadline=", 0) == 0) {
      const bool inline_ = a != "--deadline";
      if (!inline_ && i + 1 >= argc) {
        std::fprintf(stderr, "tidemark: --deadline needs seconds\n");
        return kExitUsage;
      }
      const std::string v = inline_ ? a.substr(11) : argv[++i];
      char* end = nullptr;
      const long s = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || s < 1 || s > 86400) {
        std::fprintf(stderr, "tidemark: --deadline takes 1 to 86400 seconds, not '%s'\n",
                     v.c_str());
        return kExitUsage;
      }
      g.deadlineS = static_cast<int>(s);
    } else if (a == "--json") {
      g.json = true;
    } else if (a == "--version") {
      std::printf("tidemark %s\n", TIDEMARK_VERSION);
      return kExitOk;
    } else if (command.empty() && (a == "-h" || a == "--help" || a == "help")) {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (command.empty()) {
      command = a;
    } else {
      args.push_back(a);
    }
  }
  if (command.empty()) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  // A store file is only read: what records, steers or writes needs a running daemon.
  static const char* const kNeedsDaemon[] = {"run",    "attach", "detach", "import",
                                             "upload", "delete", "apply",  "token"};
  if (!g.dbFile.empty()) {
    for (const char* c : kNeedsDaemon) {
      if (command != c) continue;
      std::fprintf(stderr,
                   "tidemark %s: needs a running tidemarkd; --db %s only reads a store file\n", c,
                   g.dbFile.c_str());
      return kExitUsage;
    }
  }
  if (command == "run") return runCommand(g, args);
  if (command == "sessions") return sessionsCommand(g, args);
  if (command == "jobs") return jobsCommand(g, args);
  if (command == "job") return jobCommand(g, args);
  if (command == "breakdown") return breakdownCommand(g, args);
  if (command == "upload") return uploadCommand(g, args);
  if (command == "timeline") return timelineCommand(g, args);
  if (command == "peak") return peakCommand(g, args);
  if (command == "ops") return opsCommand(g, args);
  if (command == "export") return exportCommand(g, args);
  if (command == "steps") return stepsCommand(g, args);
  if (command == "diff") return diffCommand(g, args);
  if (command == "plan") return planCommand(g, args);
  if (command == "pareto") return paretoCommand(g, args);
  if (command == "chain") return chainCommand(g, args);
  if (command == "apply") return applyCommand(g, args);
  if (command == "delete") return deleteCommand(g, args);
  if (command == "plan-check") return planCheckCommand(g, args);
  if (command == "import") return importCommand(g, args);
  if (command == "block") return blockCommand(g, args);
  if (command == "attach") return attachCommand(g, args);
  if (command == "detach") return detachCommand(g, args);
  if (command == "token") return tokenCommand(g, args);
  std::fprintf(stderr, "tidemark: unknown command '%s' (see tidemark --help)\n", command.c_str());
  return kExitUsage;
}
