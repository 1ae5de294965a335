// tidemarkd: the daemon. Receives agents' event streams, stores them in SQLite, answers queries.
#include <grp.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <absl/synchronization/mutex.h>

#include "server/ingest/cpu_yield.h"
#include "server/server.h"
#include "server/store/database.h"
#include "src/advisor/planner.h"

namespace {

constexpr const char* kUsage = R"(usage: tidemarkd [options]

The tidemark daemon: stores what agents record and answers queries (gRPC).

options:
  --unix PATH       the Unix socket to listen on (default $XDG_RUNTIME_DIR/tidemark/tidemarkd.sock,
                    or ~/.cache/tidemark/tidemarkd.sock); its directory must be private (0700)
  --no-unix         do not listen on a Unix socket
  --listen ADDR     also listen on TCP (none by default): a loopback address only, e.g.
                    127.0.0.1:7531 (port 0 picks a free one); callers are told apart by uid
  --allow-group G   members of group G (a name or gid) see and steer every user's sessions
  --tls-cert F --tls-key K
                    TLS on the --listen address, with this certificate and key (PEM); then
                    --listen may be any address, and callers from elsewhere need a token
  --tls-client-ca C also require clients' certificates, signed by the CA in C (mutual TLS)
  --require-token   every call must present a token (TIDEMARK_TOKEN; made by this daemon's
                    user or root with `tidemark token create`), even from this host
  --db PATH         the SQLite store (default $XDG_DATA_HOME/tidemark/tidemark.db)
  --store S         the store: a SQLite file's path (as --db), or a PostgreSQL server,
                    postgresql://USER@HOST[:PORT]/DB, shared by the daemons of several nodes
                    (docs/deployment.md)
  --name N          this daemon's name in a shared store (default: the host's name); each
                    daemon resumes, closes and analyses the sessions it took
  --port-file FILE  write the TCP port to FILE once listening (for scripts and tests)
  --resume-grace S  how long a session whose stream broke waits for its agent to resume it
                    before it is closed as aborted (default 600 seconds; sooner when its
                    process is gone from this host)
  --nice N          the daemon's scheduling niceness, 0 to 19 (default 10): on a busy machine
                    the recorded jobs get the processors first, and the agents' buffers hold
                    what the daemon has not taken yet (0 keeps the niceness it was started with
                    and never pauses). The kernel's autogroups weigh niceness only within the
                    daemon's session, so while the jobs it records want every processor, its
                    work (their streams, the analysis of ended sessions) also pauses, taking
                    about the share a thread of niceness N would take against them (1/10 of a
                    processor at 10) in a session of its own too (setsid, as `tidemark` starts
                    one); on a machine with processors to spare it never pauses
  --memory-budget B what the daemon's work may hold in memory, e.g. 256MiB (default 1GiB, at
                    least 64MiB): the store's page cache, the analysis pass's sorts (more
                    spills to disk beside the store) and the rows each recording session holds
                    before its stream waits for the store; sessions of any length fit in it
                    (docs/scaling.md)
  --retain D        drop the raw events of sessions that ended more than D ago (30d, 12h,
                    90m, 45s); their summaries stay: the session, its steps, peaks and timeline
  --max-store S     keep the store under S (e.g. 50GB): the raw events of the oldest ended
                    sessions go first, then the oldest whole sessions; live ones never
                    (docs/scaling.md; none by default)
  --version         print the version and exit
  -h, --help        this help

Each session belongs to the user whose job it recorded: only that user, root and --allow-group
see it, plan for it or apply plans to it (docs/security.md). Files are made private (umask 077).
SIGINT or SIGTERM stops it cleanly: everything received is committed first.
exit codes: 0 stopped cleanly, 1 could not start, 2 bad usage
)";

int usageError(const std::string& msg) {
  std::fprintf(stderr, "tidemarkd: %s\n(see tidemarkd --help)\n", msg.c_str());
  return 2;
}

// glibc gives each thread that allocates an arena of its own, up to eight a processor, and an
// arena keeps what was freed in it: gRPC starts threads as calls wait, more on a busy machine, and
// the memory the daemon's work freed stays resident in each. A few arenas bound that, whatever the
// machine's load (a 300,000-step live session, --memory-budget 256MiB, beside four busy processes:
// peak resident 295 MiB with glibc's default, 220-234 MiB with two; ingest 1.04-1.21 against
// 1.19-1.34 million events/s, tests/e2e/test_scale.py). MALLOC_ARENA_MAX, when set, is left as set.
void limitMallocArenas() {
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  mallopt(M_ARENA_MAX, static_cast<int>(std::clamp<long>(cpus / 2, 2, 8)));
}

}  // namespace

int main(int argc, char** argv) {
  // abseil's lock-order check (on in Debian's abseil, built without NDEBUG) keeps a graph of
  // every mutex gRPC locks and ends the process when it cannot grow it (an mmap failing, the
  // daemon at a memory limit of its own): a debugging aid, off, as in the agent. (Ingest rate
  // with and without it: 1.46–1.60 against 1.49–1.59 million events/s, bench_scale, 3 runs each.)
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  limitMallocArenas();
  using tidemark::server::Server;
  using tidemark::server::ServerOptions;
  ServerOptions options;
  options.dbPath = tidemark::server::defaultDbPath();
  options.unixSocket = tidemark::server::defaultUnixSocket();
  std::string portFile;
  int niceness = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) return nullptr;
      (void)name;
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--version") {
      std::printf("tidemarkd %s\n", TIDEMARK_VERSION);
      return 0;
    } else if (arg == "--listen") {
      const char* v = value("--listen");
      if (!v) return usageError("--listen needs an address");
      options.listen = v;
    } else if (arg == "--unix") {
      const char* v = value("--unix");
      if (!v) return usageError("--unix needs a path");
      options.unixSocket = v;
    } else if (arg == "--no-unix") {
      options.unixSocket.clear();
    } else if (arg == "--db" || arg == "--store") {
      const char* v = value(arg.c_str());
      if (!v || *v == '\0')
        return usageError(arg + " needs a path" + (arg == "--db" ? "" : " or a URI"));
      if (arg == "--db" && tidemark::server::isPostgresLocator(v))
        return usageError("--db is a SQLite file: give a PostgreSQL server with --store");
      options.dbPath = v;
    } else if (arg == "--name") {
      const char* v = value("--name");
      if (!v || *v == '\0' || std::strlen(v) > 255)
        return usageError("--name needs a name (1 to 255 bytes)");
      options.daemonName = v;
    } else if (arg == "--resume-grace") {
      const char* v = value("--resume-grace");
      char* end = nullptr;
      const long seconds = v ? std::strtol(v, &end, 10) : -1;
      if (!v || *end != '\0' || seconds < 0 || seconds > 86400 * 30) {
        return usageError("--resume-grace needs a number of seconds (0 to 2592000)");
      }
      options.resumeGrace = std::chrono::seconds(seconds);
    } else if (arg == "--allow-group") {
      const char* v = value("--allow-group");
      if (!v) return usageError("--allow-group needs a group name or gid");
      const group* g = getgrnam(v);
      char* end = nullptr;
      const long gid = std::strtol(v, &end, 10);
      if (g != nullptr) {
        options.allowGroup = g->gr_gid;
      } else if (*v != '\0' && *end == '\0' && gid >= 0) {
        options.allowGroup = static_cast<gid_t>(gid);
      } else {
        return usageError(std::string("--allow-group: no group '") + v + "'");
      }
    } else if (arg == "--tls-cert" || arg == "--tls-key" || arg == "--tls-client-ca") {
      const char* v = value(arg.c_str());
      if (!v) return usageError(arg + " needs a PEM file");
      (arg == "--tls-cert"  ? options.tlsCert
       : arg == "--tls-key" ? options.tlsKey
                            : options.tlsClientCa) = v;
    } else if (arg == "--require-token") {
      options.requireToken = true;
    } else if (arg == "--nice") {
      const char* v = value("--nice");
      char* end = nullptr;
      const long n = v ? std::strtol(v, &end, 10) : -1;
      if (!v || *end != '\0' || n < 0 || n > 19)
        return usageError("--nice needs a number from 0 to 19");
      niceness = static_cast<int>(n);
    } else if (arg == "--memory-budget") {
      const char* v = value("--memory-budget");
      const auto spec = v ? tidemark::core::parseBudget(v)
                          : absl::InvalidArgumentError("--memory-budget needs a size");
      if (!spec.ok() || spec->bytes < 0)
        return usageError("--memory-budget needs a size such as 256MiB or 2GiB");
      if (spec->bytes < tidemark::server::kMinMemoryBudgetBytes)
        return usageError("--memory-budget must be at least 64MiB");
      options.memoryBudgetBytes = spec->bytes;
    } else if (arg == "--retain") {
      const char* v = value("--retain");
      const auto d = v ? tidemark::server::parseDuration(v)
                       : absl::InvalidArgumentError("--retain needs a duration");
      if (!d.ok()) return usageError("--retain: " + std::string(d.status().message()));
      options.retention.retain = *d;
    } else if (arg == "--max-store") {
      const char* v = value("--max-store");
      const auto spec = v ? tidemark::core::parseBudget(v)
                          : absl::InvalidArgumentError("--max-store needs a size");
      if (!spec.ok() || spec->bytes <= 0)
        return usageError("--max-store needs a size such as 50GB or 500MiB");
      options.retention.maxStoreBytes = spec->bytes;
    } else if (arg == "--port-file") {
      const char* v = value("--port-file");
      if (!v) return usageError("--port-file needs a path");
      portFile = v;
    } else {
      return usageError("unknown argument '" + arg + "'");
    }
  }

  if (options.tlsCert.empty() != options.tlsKey.empty()) {
    return usageError("--tls-cert and --tls-key go together");
  }
  if (!options.tlsClientCa.empty() && options.tlsCert.empty()) {
    return usageError("--tls-client-ca needs --tls-cert and --tls-key");
  }

  // Signals are taken by one thread with sigwait, so that shutdown runs outside a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // A file size limit or a closed client makes a write fail (the store answers UNAVAILABLE and
  // the agents keep their events) instead of killing the daemon.
  signal(SIGXFSZ, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);

  // Nothing tidemarkd creates (store, journal, socket, directories) is open to other users.
  umask(077);

  // Before any thread starts: threads inherit it. Never lowered below what it was started with.
  if (niceness > 0) {
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, 0);
    if (errno == 0 && current < niceness) setpriority(PRIO_PROCESS, 0, niceness);
  }

  // The same weight against the jobs across sessions' scheduling groups, where the kernel's
  // niceness does not reach: the daemon's work pauses while the jobs it records want the
  // processors (server/ingest/cpu_yield.h).
  options.yieldFactor = tidemark::server::CpuYield::factorForNiceness(niceness);
  Server server(options);
  if (absl::Status s = server.start(); !s.ok()) {
    std::fprintf(stderr, "tidemarkd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // address() is the Unix socket itself when there is no TCP address: said once.
  const bool both = !options.listen.empty() && !options.unixSocket.empty();
  std::fprintf(stderr, "tidemarkd: listening on %s%s%s; store %s\n", server.address().c_str(),
               both ? " and unix:" : "", both ? options.unixSocket.c_str() : "",
               tidemark::server::displayLocator(options.dbPath).c_str());
  if (!portFile.empty()) {
    const std::string tmp = portFile + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), portFile.c_str());
  }

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "tidemarkd: %s received, stopping\n", strsignal(sig));
  server.shutdown();
  std::fprintf(stderr, "tidemarkd: stopped; everything received is committed\n");
  return 0;
}
