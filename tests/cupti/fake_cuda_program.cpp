// Plays the CUDA driver's part for the GPU capture tests: loads CUDA_INJECTION64_PATH and calls
// its InitializeInjection, as the driver does when a process initializes CUDA; then has the fake
// libcupti (TIDEMARK_CUPTI_LIBRARY) report one step of GPU activity, and exits (the agent flushes
// CUPTI before its stream closes). With "attach-target" it is a running CUDA process that
// `tidemark attach` finds (attachTarget below).
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

// `attach-target`: a running process that uses CUDA, for `tidemark attach`. It loads the driver's
// stand-in ($TIDEMARK_FAKE_CUDA_DRIVER, SONAME libcuda.so.1), says "ready", and once an attached
// agent captures (it loaded the fake libcupti and subscribed) plays one step of GPU activity and
// says "captured". Each line "again" on stdin plays one more step ("again done"); end of input
// ends it.
int attachTarget() {
  const char* driver = std::getenv("TIDEMARK_FAKE_CUDA_DRIVER");
  const char* cupti = std::getenv("TIDEMARK_CUPTI_LIBRARY");
  if (driver == nullptr || cupti == nullptr || dlopen(driver, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr,
                 "TIDEMARK_FAKE_CUDA_DRIVER and TIDEMARK_CUPTI_LIBRARY must name the "
                 "fakes\n");
    return 2;
  }
  std::puts("ready");
  std::fflush(stdout);
  void (*scenario)() = nullptr;
  for (int i = 0; i < 6000 && scenario == nullptr; ++i) {
    if (void* fake = dlopen(cupti, RTLD_NOW | RTLD_NOLOAD)) {
      auto capturing = reinterpret_cast<int (*)()>(dlsym(fake, "fake_cupti_capturing"));
      if (capturing != nullptr && capturing() == 1)
        scenario = reinterpret_cast<void (*)()>(dlsym(fake, "fake_cupti_scenario"));
    }
    if (scenario == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (scenario == nullptr) {
    std::fprintf(stderr, "no agent captured within 60 s\n");
    return 4;
  }
  scenario();
  std::puts("captured");
  std::fflush(stdout);
  char line[64];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    if (std::strncmp(line, "again", 5) != 0) continue;
    scenario();
    std::puts("again done");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "attach-target") == 0) return attachTarget();
  // With "with-child": a child process (fork + exec of this program) initializes CUDA too; it
  // inherits CUDA_INJECTION64_PATH but must not be captured (it is not the job tidemark runs).
  if (argc > 1 && std::strcmp(argv[1], "with-child") == 0) {
    const pid_t child = fork();
    if (child == 0) {
      execl("/proc/self/exe", argv[0], "child", static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "the child failed\n");
      return 5;
    }
    std::printf("child %d done\n", child);
  }
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
  if (scenario == nullptr && argc > 1 && std::strcmp(argv[1], "child") == 0) {
    std::puts("child: not captured");  // as it should be
    return 0;
  }
  if (scenario == nullptr) {
    std::fprintf(stderr, "the fake CUPTI was not loaded by the agent\n");
    return 4;
  }
  // The step runs inside a module scope and an op scope (as the Python adapter would report them):
  // the device memory allocated by its API calls is counted to that module, the kernels it
  // launches to both.
  auto intern = reinterpret_cast<unsigned (*)(const char*)>(dlsym(agent, "tidemark_intern"));
  auto begin = reinterpret_cast<void (*)(unsigned)>(dlsym(agent, "tidemark_scope_begin"));
  auto end = reinterpret_cast<void (*)(unsigned)>(dlsym(agent, "tidemark_scope_end"));
  auto opBegin = reinterpret_cast<void (*)(unsigned)>(dlsym(agent, "tidemark_op_begin"));
  auto opEnd = reinterpret_cast<void (*)(unsigned)>(dlsym(agent, "tidemark_op_end"));
  const unsigned layer = intern("model.layer");
  const unsigned linear = intern("aten::linear");
  begin(layer);
  opBegin(linear);
  scenario();
  opEnd(linear);
  end(layer);
  if (argc > 1 && std::strcmp(argv[1], "with-tensors") == 0) {
    // torch's caching allocator, as its memory reporter tells the agent: a weight at the start
    // of the 2 MiB segment the scenario's cudaMalloc reserved, and an activation after it that
    // is freed again; the segment stays reserved.
    auto tensor = reinterpret_cast<void (*)(uint64_t, int64_t, int, int64_t)>(
        dlsym(agent, "tidemark_tensor_memory"));
    auto tag =
        reinterpret_cast<void (*)(uint64_t, uint64_t, int, unsigned)>(dlsym(agent, "tidemark_tag"));
    const uint64_t segment = 0x7f0000200000;
    const int64_t mib = 1 << 20;
    tensor(segment, mib, 0, 2 * mib);
    tag(segment, mib, 1, intern("model.layer.weight"));  // WEIGHT
    tensor(segment + mib, mib / 4, 0, 2 * mib);
    tag(segment + mib, mib / 4, 4, intern("model.layer:saved"));  // ACTIVATION
    tensor(segment + mib, -mib / 4, 0, 2 * mib);
  }
  // Some of it is delivered by the agent's periodic flush, the rest by its flush at exit.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  std::puts("done");
  return 0;
}
