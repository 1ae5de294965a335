// Plays the CUDA driver's part for the GPU capture tests: loads CUDA_INJECTION64_PATH and calls
// its InitializeInjection, as the driver does when a process initializes CUDA; then has the fake
// libcupti (TIDEMARK_CUPTI_LIBRARY) report one step of GPU activity, and exits (the agent flushes
// CUPTI before its stream closes).
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

int main() {
  const char* injection = std::getenv("CUDA_INJECTION64_PATH");
  const char* cupti = std::getenv("TIDEMARK_CUPTI_LIBRARY");
  if (injection == nullptr || cupti == nullptr) {
    std::fprintf(stderr, "CUDA_INJECTION64_PATH and TIDEMARK_CUPTI_LIBRARY must be set\n");
    return 2;
  }
  void* agent = dlopen(injection, RTLD_NOW | RTLD_GLOBAL);
  if (agent == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", injection, dlerror());
    return 2;
  }
  auto init = reinterpret_cast<int (*)()>(dlsym(agent, "InitializeInjection"));
  if (init == nullptr || init() != 1) {
    std::fprintf(stderr, "InitializeInjection failed\n");
    return 3;
  }
  void* fake = dlopen(cupti, RTLD_NOW | RTLD_NOLOAD);
  auto scenario = fake ? reinterpret_cast<void (*)()>(dlsym(fake, "fake_cupti_scenario")) : nullptr;
  if (scenario == nullptr) {
    std::fprintf(stderr, "the fake CUPTI was not loaded by the agent\n");
    return 4;
  }
  scenario();
  // Some of it is delivered by the agent's periodic flush, the rest by its flush at exit.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  std::puts("done");
  return 0;
}
