// LD_PRELOAD entry: the ELF constructor reads TIDEMARK_* from the environment, loads the agent
// (memory and hooks) and starts its threads (the gRPC channel is opened by the sender thread,
// after the constructor returned). It also registers the fork and exit handlers. Loaded by dlopen
// instead, it does nothing (see attach.cpp).
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/agent.h"
#include "agent/job_member.h"
#include "src/base/preload_list.h"

namespace tidemark::agent {
void markPreloaded(bool on);  // attach.cpp: `tidemark attach` then says the job is recorded already
namespace {

// This library's own file, as the loader opened it (whatever it is called: `TIDEMARK_AGENT` may
// name a copy or a link under another name).
const std::string& selfPath() {
  static const std::string path = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&selfPath), &info) == 0 || info.dli_fname == nullptr) {
      return std::string();
    }
    return std::string(info.dli_fname);
  }();
  return path;
}

// (The install's own name too: a second agent preloaded beside this one is never kept.)
bool namesSelf(std::string_view entry) { return base::preloadEntryIsAgent(entry, selfPath()); }

// Drops the entries naming the agent from LD_PRELOAD, keeping any others the user set.
void removeSelfFromPreload() {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  const std::string kept = base::preloadWithout(preload, namesSelf);
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

// True when the agent came in by LD_PRELOAD; loaded by dlopen (`tidemark attach`, or a script's
// ctypes), the constructor leaves everything to the attach entry.
bool preloaded() { return base::preloadNames(std::getenv("LD_PRELOAD"), namesSelf); }

__attribute__((constructor)) void tidemarkPreloadInit() {
  if (!preloaded()) return;
  // A launcher (torchrun) under `tidemark run`: not a rank, not recorded; LD_PRELOAD stays for
  // the ranks it starts, each of which records itself.
  if (isLauncherOnly(std::getenv)) return;
  // Marked first: `tidemark attach` reads the mark to leave a job under `tidemark run` alone,
  // and the load below takes a while (the block table's pages).
  markPreloaded(true);
  Agent& agent = Agent::instance();
  agent.load(AgentConfig::fromEnvironment());
  if (!agent.loaded()) {
    markPreloaded(false);
    return;
  }
  agent.installProcessHandlers();
  // Child processes (a shell, a compiler, `uname`) are not profiled unless asked for: the
  // variables that brought the agent in are removed before the program reads its environment.
  const char* follow = std::getenv("TIDEMARK_FOLLOW_CHILDREN");
  if (follow == nullptr || *follow != '1') {
    removeSelfFromPreload();
    // CUDA_INJECTION64_PATH stays (the driver reads it when this process initializes CUDA, later)
    // and children inherit it: this names the one process whose CUDA the agent captures.
    setenv("TIDEMARK_CUDA_OWNER", std::to_string(getpid()).c_str(), 1);
  }
  // The collector runs from the start, for every program: a thread whose ring fills waits for
  // it (lossless), so it must be there before the first ring can fill.
  agent.start();
}

}  // namespace
}  // namespace tidemark::agent
