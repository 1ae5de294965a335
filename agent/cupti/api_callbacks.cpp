#include "agent/cupti/api_callbacks.h"

// cupti.h brings the parameter structs of every runtime and driver call.

#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include <iterator>

namespace tidemark::agent {

const CUpti_CallbackId kRuntimeMemoryCallbacks[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000};
const size_t kRuntimeMemoryCallbackCount = std::size(kRuntimeMemoryCallbacks);
const CUpti_CallbackId kDriverMemoryCallbacks[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemMap, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap};
const size_t kDriverMemoryCallbackCount = std::size(kDriverMemoryCallbacks);

const CUpti_CallbackId kRuntimeLaunchCallbacks[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020};
const size_t kRuntimeLaunchCallbackCount = std::size(kRuntimeLaunchCallbacks);
const CUpti_CallbackId kDriverLaunchCallbacks[] = {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx};
const size_t kDriverLaunchCallbackCount = std::size(kDriverLaunchCallbacks);

uint32_t launchCorrelation(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                           const CUpti_CallbackData* data) {
  if (data == nullptr || data->callbackSite != CUPTI_API_ENTER) return 0;
  const CUpti_CallbackId* ids =
      domain == CUPTI_CB_DOMAIN_RUNTIME_API ? kRuntimeLaunchCallbacks : kDriverLaunchCallbacks;
  const size_t n = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? kRuntimeLaunchCallbackCount
                                                         : kDriverLaunchCallbackCount;
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return 0;
  for (size_t i = 0; i < n; ++i)
    if (ids[i] == cbid) return data->correlationId;
  return 0;
}

namespace {

thread_local int t_runtimeMemoryCalls = 0;

bool succeeded(const CUpti_CallbackData* d) {
  // cudaError_t and CUresult are both 0 on success.
  return d->functionReturnValue != nullptr && *static_cast<const int*>(d->functionReturnValue) == 0;
}

ApiMemoryEvent alloc(void* const* out, size_t bytes, bool host = false) {
  ApiMemoryEvent e;
  if (out == nullptr || *out == nullptr) return e;
  e.op = ApiMemoryEvent::Op::kAlloc;
  e.address = reinterpret_cast<uint64_t>(*out);
  e.bytes = bytes;
  e.host = host;
  return e;
}

ApiMemoryEvent release(const void* ptr, bool host = false) {
  ApiMemoryEvent e;
  if (ptr == nullptr) return e;
  e.op = ApiMemoryEvent::Op::kFree;
  e.address = reinterpret_cast<uint64_t>(ptr);
  e.host = host;
  return e;
}

ApiMemoryEvent runtime(CUpti_CallbackId cbid, const CUpti_CallbackData* d) {
  const bool enter = d->callbackSite == CUPTI_API_ENTER;
  if (enter) ++t_runtimeMemoryCalls;
  if (!enter && t_runtimeMemoryCalls > 0) --t_runtimeMemoryCalls;
  const void* p = d->functionParams;
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020: {
      const auto* a = static_cast<const cudaMalloc_v3020_params*>(p);
      return !enter && succeeded(d) ? alloc(a->devPtr, a->size) : ApiMemoryEvent{};
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000: {
      const auto* a = static_cast<const cudaMallocManaged_v6000_params*>(p);
      return !enter && succeeded(d) ? alloc(a->devPtr, a->size) : ApiMemoryEvent{};
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020: {
      const auto* a = static_cast<const cudaMallocAsync_v11020_params*>(p);
      return !enter && succeeded(d) ? alloc(a->devPtr, a->size) : ApiMemoryEvent{};
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020: {
      const auto* a = static_cast<const cudaMallocFromPoolAsync_v11020_params*>(p);
      return !enter && succeeded(d) ? alloc(a->ptr, a->size) : ApiMemoryEvent{};
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020: {
      const auto* a = static_cast<const cudaMallocHost_v3020_params*>(p);
      return !enter && succeeded(d) ? alloc(a->ptr, a->size, true) : ApiMemoryEvent{};
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020: {
      const auto* a = static_cast<const cudaHostAlloc_v3020_params*>(p);
      return !enter && succeeded(d) ? alloc(a->pHost, a->size, true) : ApiMemoryEvent{};
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
      return enter ? release(static_cast<const cudaFree_v3020_params*>(p)->devPtr)
                   : ApiMemoryEvent{};
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
      return enter ? release(static_cast<const cudaFreeAsync_v11020_params*>(p)->devPtr)
                   : ApiMemoryEvent{};
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020:
      return enter ? release(static_cast<const cudaFreeHost_v3020_params*>(p)->ptr, true)
                   : ApiMemoryEvent{};
    default:
      return {};
  }
}

ApiMemoryEvent driver(CUpti_CallbackId cbid, const CUpti_CallbackData* d) {
  if (t_runtimeMemoryCalls > 0) return {};  // the runtime call reports it
  const bool enter = d->callbackSite == CUPTI_API_ENTER;
  const void* p = d->functionParams;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
      const auto* a = static_cast<const cuMemAlloc_v2_params*>(p);
      if (enter || !succeeded(d) || a->dptr == nullptr || *a->dptr == 0) return {};
      ApiMemoryEvent e;
      e.op = ApiMemoryEvent::Op::kAlloc;
      e.address = *a->dptr;
      e.bytes = a->bytesize;
      return e;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
      // Expandable segments: physical memory mapped into a reserved range.
      const auto* a = static_cast<const cuMemMap_params*>(p);
      if (enter || !succeeded(d)) return {};
      ApiMemoryEvent e;
      e.op = ApiMemoryEvent::Op::kAlloc;
      e.address = a->ptr;
      e.bytes = a->size;
      return e;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2: {
      if (!enter) return {};
      ApiMemoryEvent e;
      e.op = ApiMemoryEvent::Op::kFree;
      e.address = static_cast<const cuMemFree_v2_params*>(p)->dptr;
      return e.address != 0 ? e : ApiMemoryEvent{};
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap: {
      if (!enter) return {};
      ApiMemoryEvent e;
      e.op = ApiMemoryEvent::Op::kFree;
      e.address = static_cast<const cuMemUnmap_params*>(p)->ptr;
      return e.address != 0 ? e : ApiMemoryEvent{};
    }
    default:
      return {};
  }
}

}  // namespace

ApiMemoryEvent decodeApiCallback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const CUpti_CallbackData* data) {
  if (data == nullptr) return {};
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) return runtime(cbid, data);
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) return driver(cbid, data);
  return {};
}

}  // namespace tidemark::agent
