// libtidemark_torch-<version>.so: torch's tensor-level memory, handed to the agent as it happens.
//
// torch's allocators report every block they hand out and take back to the profiler state in the
// calling thread's debug info (c10::ThreadLocalDebugInfo, kind PROFILER_STATE): the CUDA caching
// allocator always (pointer, block size, the device's allocated and reserved totals), the CPU
// allocator while that state wants memory reports. It is how torch.profiler's profile_memory
// sees memory. This library puts a state of its own there on the threads that train (autograd's
// worker threads inherit it with the rest of the thread's state): a profiler state that is
// *disabled* for every other purpose (torch code asking whether a profiler runs is told no) but
// wants memory reports, and passes each to the agent's tidemark_tensor_memory.
//
// Built against the headers of the torch that runs the job (agent/CMakeLists.txt); the adapter
// (python/tidemark/torch_memory.py) loads it with ctypes and installs it per thread.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include <c10/core/Device.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

namespace {

namespace prof = torch::profiler::impl;

using TensorMemoryFn = void (*)(uint64_t address, int64_t sizeDelta, int device,
                                int64_t totalReserved);

std::atomic<TensorMemoryFn> g_report{nullptr};
std::atomic<bool> g_enabled{false};
std::atomic<bool> g_includeCpu{false};

class MemoryReporter final : public prof::ProfilerStateBase {
 public:
  MemoryReporter()
      : ProfilerStateBase(prof::ProfilerConfig(prof::ProfilerState::Disabled,
                                               /*report_input_shapes=*/false,
                                               /*profile_memory=*/true)) {}

  // torch 1.x passes the totals as int64_t, torch 2.x as size_t: one of the two overrides the
  // allocator's entry, the other is never called.
  virtual void reportMemoryUsage(void* ptr, int64_t allocSize, int64_t /*totalAllocated*/,
                                 int64_t totalReserved, c10::Device device) {
    report(ptr, allocSize, totalReserved, device);
  }
  virtual void reportMemoryUsage(void* ptr, int64_t allocSize, size_t /*totalAllocated*/,
                                 size_t totalReserved, c10::Device device) {
    report(ptr, allocSize, static_cast<int64_t>(totalReserved), device);
  }

  // Asked by the CPU allocator only (the CUDA caching allocator reports to any state it finds):
  // "yes" makes it keep a size table under a lock for every CPU block, so only when asked for.
  bool memoryProfilingEnabled() const override {
    return g_enabled.load(std::memory_order_relaxed) &&
           g_includeCpu.load(std::memory_order_relaxed);
  }

  prof::ActiveProfilerType profilerType() override { return prof::ActiveProfilerType::NONE; }

 private:
  static void report(void* ptr, int64_t allocSize, int64_t totalReserved, c10::Device device) {
    if (!g_enabled.load(std::memory_order_relaxed) || ptr == nullptr || allocSize == 0) return;
    const TensorMemoryFn fn = g_report.load(std::memory_order_acquire);
    if (fn == nullptr) return;
    if (device.is_cuda()) {
      fn(reinterpret_cast<uintptr_t>(ptr), allocSize, device.index(), totalReserved);
    } else if (device.is_cpu() && g_includeCpu.load(std::memory_order_relaxed)) {
      fn(reinterpret_cast<uintptr_t>(ptr), allocSize, -1, -1);
    }
  }
};

std::shared_ptr<MemoryReporter>& instance() {
  static auto* reporter = new std::shared_ptr<MemoryReporter>(std::make_shared<MemoryReporter>());
  return *reporter;  // never destroyed: threads may hold it until the process ends
}

}  // namespace

extern "C" {

// The version of torch this library was built for (torch.__version__ at build time): it works
// only in a process running that torch.
__attribute__((visibility("default"))) const char* tidemark_torch_built_for() {
  return TIDEMARK_TORCH_VERSION;
}

// Installs the reporter on the calling thread and turns reporting on. include_cpu: report CPU
// tensors too (they duplicate what the allocator hooks see; for tests). Returns 1 installed now,
// 2 already installed on this thread, 0 another profiler state is active on this thread
// (torch.profiler: left alone), -1 the agent's tidemark_tensor_memory is not in the process.
__attribute__((visibility("default"))) int tidemark_torch_reporter_install(int include_cpu) {
  if (g_report.load() == nullptr) {
    auto fn = reinterpret_cast<TensorMemoryFn>(dlsym(RTLD_DEFAULT, "tidemark_tensor_memory"));
    if (fn == nullptr) return -1;
    g_report.store(fn, std::memory_order_release);
  }
  g_includeCpu.store(include_cpu != 0);
  g_enabled.store(true);
  c10::DebugInfoBase* current = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  if (current == instance().get()) return 2;
  if (current != nullptr) return 0;
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, instance());
  return 1;
}

// Takes the reporter off the calling thread, where it is the innermost debug info (torch's
// profiler is about to start here: torch 1.x refuses to while any profiler state is installed,
// torch 2.x would be fine; either way the profiler gets the reports while it runs). Returns 1 when
// taken off; install() puts it back.
__attribute__((visibility("default"))) int tidemark_torch_reporter_step_aside() {
  try {
    if (c10::ThreadLocalDebugInfo::_peek(c10::DebugInfoKind::PROFILER_STATE) != instance())
      return 0;
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    return 1;
  } catch (...) {  // c10::Error: the innermost debug info is of another kind
    return 0;
  }
}

// Turns reporting on or off in every thread (the state stays installed, and answers "no memory
// reports wanted" while off).
__attribute__((visibility("default"))) void tidemark_torch_reporter_enable(int on) {
  g_enabled.store(on != 0);
}

}  // extern "C"
