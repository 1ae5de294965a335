#pragma once

#include <cupti.h>

#include <cstdint>

namespace tidemark::agent {

// What a runtime or driver API callback says about memory: an allocation (at the API's exit,
// when it succeeded and the pointer is known) or a free (at its entry, before the memory can be
// handed out again). Recorded on the calling thread, at host time, so that a device block is
// ordered with the host's events and counted to the module or op open on that thread.
struct ApiMemoryEvent {
  enum class Op : uint8_t { kNone, kAlloc, kFree };
  Op op = Op::kNone;
  uint64_t address = 0;
  uint64_t bytes = 0;
  bool host = false;  // pinned host memory (cudaMallocHost, cudaHostAlloc)
};

// The callback ids tidemark enables, per domain (runtime: cudaMalloc, cudaFree, the async and
// pool forms, cudaMallocHost/HostAlloc/FreeHost, cudaMallocManaged; driver: cuMemAlloc_v2,
// cuMemFree_v2, cuMemMap/cuMemUnmap for expandable segments).
extern const CUpti_CallbackId kRuntimeMemoryCallbacks[];
extern const size_t kRuntimeMemoryCallbackCount;
extern const CUpti_CallbackId kDriverMemoryCallbacks[];
extern const size_t kDriverMemoryCallbackCount;

// The launches tidemark ties kernels to: the runtime's cudaLaunchKernel (and Ex, cooperative),
// cudaGraphLaunch, cudaMemcpy/Memset (sync and async); the driver's cuLaunchKernel (and Ex).
extern const CUpti_CallbackId kRuntimeLaunchCallbacks[];
extern const size_t kRuntimeLaunchCallbackCount;
extern const CUpti_CallbackId kDriverLaunchCallbacks[];
extern const size_t kDriverLaunchCallbackCount;
// The correlation id of a launch at its entry (0: not a launch, or not its entry).
uint32_t launchCorrelation(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                           const CUpti_CallbackData* data);

// Decodes one callback. A driver call made by the runtime (cudaMalloc calls cuMemAlloc) is not
// reported twice: while a runtime memory call runs on this thread, driver ones are ignored.
ApiMemoryEvent decodeApiCallback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const CUpti_CallbackData* data);

}  // namespace tidemark::agent
