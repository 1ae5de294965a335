// `tidemark run -- CMD...`: execs CMD with the agent preloaded and the Python adapter importable
// at interpreter start (a sitecustomize in python/tidemark_boot), so the script needs no change.
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/install_paths.h"
#include "cli/own_daemon.h"
#include "src/advisor/planner.h"
#include "src/core/capture_schedule.h"
#include "src/inject/elf_file.h"

namespace tidemark::cli {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kDefaultStackMinBytes = 64 << 10;

constexpr const char* kRunUsage =
    R"(usage: tidemark run [--server ADDR] [--name NAME] [--job NAME] [--quiet] [--lossy] [--ops]
                    [--stacks [--stacks-min SIZE]] [--steps A-B[,C-D] | --every N [--window W]]
                    -- CMD [ARGS...]

Runs CMD with the tidemark agent in it. Python programs are instrumented at interpreter start
(models, optimizers, phases, steps, tensor categories) without any change to the script.
The job's exit code is tidemark's exit code. Events go to tidemarkd at ADDR; if none answers,
they are spooled to a file that `tidemark upload` sends later. A run that ends far ahead of the
daemon (a burst of allocations before exit) hands the rest to it in a file instead of waiting:
the job exits at once, the session ends when the daemon has stored the file.

  --name NAME   a name for the session
  --job NAME    the training job this process is a rank of (tidemark jobs, tidemark job NAME).
                Without it a rank finds its job by itself: torchrun's run id, else
                MASTER_ADDR:MASTER_PORT; RANK, LOCAL_RANK and WORLD_SIZE give its place. Under
                `tidemark run -- torchrun ...` (or python -m torch.distributed.run / .launch)
                every rank the launcher starts is recorded, each a session of the job; the
                launcher itself is not (docs/jobs.md)
  --quiet       no summary line from the agent at exit
  --lossy       a thread whose buffer is full drops the event (counted in the session's stats)
                instead of waiting for the agent to make room; the default loses nothing
  --ops         torch 2: every aten op as an op scope (tidemark ops, the peak's memory by op);
                costs a CPU training step ~10 % more, so not on by default
  --stacks      the Python stack of every allocation of 64 KiB or more (tidemark block, the
                GUI's inspector): on the thread that imports torch and the threads it starts
                after that; a thread that already has a profiler (cProfile, a debugger) keeps
                it and its allocations go without stacks. Costs each Python call a C call
                (bench/run.sh measures it), so not on by default
  --stacks-min SIZE  with --stacks, the smallest allocation whose stack is recorded (4KiB, 1MiB)
  --steps A-B   full detail only in these steps (3-4, or 3-4,10,20-25; the first step is 1);
                every other step is recorded as a summary (its peak, the bytes by tag at the
                peak, reserved, step time), at a cost that does not grow with its allocations
  --every N     full detail in a window of W steps (--window, default 1) every N steps:
                steps 1..W, N+1..N+W, ...; summaries between
  --no-adapter  allocations only: do not start the Python adapter (no scopes, phases, steps or
                tags; categories then come from rules, steps from the recording's periodicity)
environment: TIDEMARK_AGENT (the agent library), TIDEMARK_PYTHON_DIR (the adapter package)
)";

// torchrun, or python -m torch.distributed.run / torch.distributed.launch: a launcher whose
// ranks are recorded (the agent passes through it to them), not itself.
bool isLauncher(const std::vector<std::string>& cmd) {
  const std::string program = fs::path(cmd.front()).filename().string();
  if (program == "torchrun") return true;
  if (program.rfind("python", 0) != 0) return false;
  for (size_t i = 1; i + 1 < cmd.size(); ++i) {
    if (cmd[i] != "-m") continue;
    return cmd[i + 1] == "torch.distributed.run" || cmd[i + 1] == "torch.distributed.launch";
  }
  return false;
}

void prependEnv(const char* name, const std::string& value, char sep) {
  const char* old = std::getenv(name);
  std::string v = value;
  if (old != nullptr && *old != '\0') v += sep + std::string(old);
  setenv(name, v.c_str(), 1);
}

}  // namespace

bool checkCaptureOptions(const char* command, const std::string& steps, const std::string& every,
                         const std::string& window) {
  if (!window.empty() && every.empty()) {
    std::fprintf(stderr, "tidemark %s: --window goes with --every\n", command);
    return false;
  }
  std::string error;
  core::CaptureSchedule::fromSettings(steps, every, window, &error);
  if (!error.empty()) std::fprintf(stderr, "tidemark %s: %s\n", command, error.c_str());
  return error.empty();
}

int runCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  std::vector<std::string> cmd;
  std::string name;
  std::string job;
  bool quiet = false;
  bool adapter = true;
  bool lossy = false;
  bool ops = false;
  uint64_t stackMinBytes = 0;  // 0: no stacks
  std::string steps, every, window;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kRunUsage, stdout);
      return kExitOk;
    } else if (a == "--name" && i + 1 < args.size()) {
      name = args[++i];
    } else if (a == "--job" && i + 1 < args.size()) {
      job = args[++i];
      if (job.empty() || job.size() > 256) {
        std::fputs("tidemark run: --job needs a name of 1 to 256 bytes\n", stderr);
        return kExitUsage;
      }
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "--no-adapter") {
      adapter = false;
    } else if (a == "--lossy") {
      lossy = true;
    } else if (a == "--ops") {
      ops = true;
    } else if (a == "--stacks") {
      if (stackMinBytes == 0) stackMinBytes = kDefaultStackMinBytes;
    } else if (a == "--stacks-min" && i + 1 < args.size()) {
      auto size = core::parseBudget(args[++i]);
      if (!size.ok() || size->bytes <= 0) {
        std::fprintf(stderr, "tidemark run: bad --stacks-min '%s' (examples: 4KiB, 1MiB, 65536)\n",
                     args[i].c_str());
        return kExitUsage;
      }
      stackMinBytes = static_cast<uint64_t>(size->bytes);
    } else if (a == "--steps" && i + 1 < args.size()) {
      steps = args[++i];
    } else if (a == "--every" && i + 1 < args.size()) {
      every = args[++i];
    } else if (a == "--window" && i + 1 < args.size()) {
      window = args[++i];
    } else if (a.rfind("-", 0) == 0) {
      std::fprintf(stderr, "tidemark run: unknown option '%s'\n", a.c_str());
      return kExitUsage;
    } else {
      break;  // the command starts here (no `--` given)
    }
  }
  for (; i < args.size(); ++i) cmd.push_back(args[i]);
  if (!checkCaptureOptions("run", steps, every, window)) return kExitUsage;
  if (cmd.empty()) {
    std::fputs("tidemark run: no command given\n", stderr);
    std::fputs(kRunUsage, stderr);
    return kExitUsage;
  }

  const std::string agent = findAgent();
  if (agent.empty()) {
    std::fputs("tidemark run: libtidemark_agent.so not found beside tidemark; set TIDEMARK_AGENT\n",
               stderr);
    return kExitError;
  }
  const std::string python = findPythonDir();
  // The user's own daemon is started if none runs (before the agent goes into this process's
  // environment: the daemon must not load it); the job runs either way (without a daemon the
  // agent spools what it recorded).
  ensureOwnDaemon(g.server);
  prependEnv("LD_PRELOAD", agent, ':');
  setenv("TIDEMARK_SERVER", g.server.c_str(), 1);
  if (!g.token.empty()) setenv("TIDEMARK_TOKEN", g.token.c_str(), 1);
  setenv("TIDEMARK_AGENT", agent.c_str(), 1);
  // CUDA's injection: the driver calls the agent's InitializeInjection when the job initializes
  // CUDA (GPU capture); a job that never does is not affected. Only an agent built with CUPTI
  // has the entry.
  if (auto elf = inject::ElfFile::read(agent); elf.ok() && elf->symbol("InitializeInjection"))
    setenv("CUDA_INJECTION64_PATH", agent.c_str(), 1);
  if (!name.empty()) setenv("TIDEMARK_SESSION_NAME", name.c_str(), 1);
  if (!job.empty()) setenv("TIDEMARK_JOB", job.c_str(), 1);
  // (An outer run's mark is not this one's: set for a launcher only.)
  if (isLauncher(cmd)) {
    setenv("TIDEMARK_LAUNCHER", "1", 1);
  } else {
    unsetenv("TIDEMARK_LAUNCHER");
  }
  if (quiet) setenv("TIDEMARK_QUIET", "1", 1);
  if (lossy) setenv("TIDEMARK_LOSSY", "1", 1);
  if (ops) setenv("TIDEMARK_OPS", "1", 1);
  if (stackMinBytes != 0) {
    setenv("TIDEMARK_STACKS", std::to_string(stackMinBytes).c_str(), 1);
  } else {
    unsetenv("TIDEMARK_STACKS");
  }
  // The job's environment may carry a schedule of its own: the options (or none) decide.
  setenv("TIDEMARK_CAPTURE_STEPS", steps.c_str(), 1);
  setenv("TIDEMARK_CAPTURE_EVERY", every.c_str(), 1);
  setenv("TIDEMARK_CAPTURE_WINDOW", window.c_str(), 1);
  if (!python.empty()) {
    // tidemark_boot holds the sitecustomize that starts the agent (and, unless --no-adapter, the
    // adapter) once the interpreter is up; the package sits beside it.
    prependEnv("PYTHONPATH", python + ":" + python + "/tidemark_boot", ':');
    setenv("TIDEMARK_AUTOSTART", adapter ? "1" : "agent", 1);
  }

  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "tidemark run: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

}  // namespace tidemark::cli
