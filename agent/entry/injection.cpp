// CUDA's entry points. The injection entry: with CUDA_INJECTION64_PATH naming the agent (`tidemark
// run` sets it), the CUDA driver loads the agent when the process initializes CUDA and calls
// InitializeInjection. The agent loads (if LD_PRELOAD did not already), connects, and starts the
// CUPTI capture; at exit (or detach) the capture is flushed before the stream closes. A process
// that never initializes CUDA never comes here. `tidemark attach` starts the same capture in a
// running CUDA process (startGpuCaptureOnAttach).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/agent.h"
#include "agent/cupti/gpu_capture.h"
#include "agent/entry/cuda_entry.h"

namespace tidemark::agent {

std::string startGpuCaptureOnAttach(Agent& agent) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return "no CUDA in the process";
  dlclose(driver);
  std::string why;
  if (!gpu_capture::start(agent.recorder(), agent.interner(), 100, &why))
    return "no GPU capture: " + why;
  agent.setBeforeStop(&gpu_capture::stop);
  gpu_capture::stopAtExit(agent.config().exitTimeoutMs / 2);
  return "GPU capture started (CUPTI)";
}

void stopGpuCaptureOnDetach(int timeoutMs) { gpu_capture::stop(timeoutMs); }

}  // namespace tidemark::agent

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  using namespace tidemark::agent;
  try {
    // A child of a job under `tidemark run` inherits CUDA_INJECTION64_PATH; it is not profiled
    // unless asked for (TIDEMARK_FOLLOW_CHILDREN=1 leaves no owner).
    if (const char* owner = std::getenv("TIDEMARK_CUDA_OWNER");
        owner != nullptr && std::strtol(owner, nullptr, 10) != getpid())
      return 1;
    Agent& agent = Agent::instance();
    if (!agent.loaded()) {
      agent.load(AgentConfig::fromEnvironment());
      if (!agent.loaded()) return 0;
      agent.installProcessHandlers();
    }
    agent.start();
    std::string why;
    if (!gpu_capture::start(agent.recorder(), agent.interner(), 100, &why)) {
      std::fprintf(stderr, "tidemark: no GPU capture: %s\n", why.c_str());
      return 1;  // the host side goes on
    }
    agent.setBeforeStop(&gpu_capture::stop);
    gpu_capture::stopAtExit(agent.config().exitTimeoutMs / 2);
    return 1;
  } catch (...) {
    return 0;
  }
}
