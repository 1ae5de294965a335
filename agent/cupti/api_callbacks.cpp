#include "agent/cupti/api_callbacks.h"

// cupti.h brings the parameter structs of every runtime and driver call.

#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include <iterator>
#include <type_traits>

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

template <typename T>
uint64_t addressOf(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<uint64_t>(v);
  } else {
    return static_cast<uint64_t>(v);
  }
}

ApiMemoryEvent event(ApiMemoryEvent::Op op, uint64_t address, uint64_t bytes, bool host) {
  ApiMemoryEvent e;
  if (address == 0) return e;
  e.op = op;
  e.address = address;
  e.bytes = bytes;
  e.host = host;
  return e;
}

// An allocation call, at its exit when it succeeded: the block is what its out-parameter names.
template <typename Params, typename Out>
ApiMemoryEvent allocAtExit(const CUpti_CallbackData* d, Out Params::*out, size_t Params::*bytes,
                           bool host = false) {
  if (d->callbackSite == CUPTI_API_ENTER || !succeeded(d)) return {};
  const auto* a = static_cast<const Params*>(d->functionParams);
  if (a->*out == nullptr) return {};
  return event(ApiMemoryEvent::Op::kAlloc, addressOf(*(a->*out)), a->*bytes, host);
}

// A free call, at its entry (before the address can be handed out again).
template <typename Params, typename Ptr>
ApiMemoryEvent freeAtEntry(const CUpti_CallbackData* d, Ptr Params::*ptr, bool host = false) {
  if (d->callbackSite != CUPTI_API_ENTER) return {};
  const auto* a = static_cast<const Params*>(d->functionParams);
  return event(ApiMemoryEvent::Op::kFree, addressOf(a->*ptr), 0, host);
}

ApiMemoryEvent runtime(CUpti_CallbackId cbid, const CUpti_CallbackData* d) {
  if (d->callbackSite == CUPTI_API_ENTER) ++t_runtimeMemoryCalls;
  if (d->callbackSite != CUPTI_API_ENTER && t_runtimeMemoryCalls > 0) --t_runtimeMemoryCalls;
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020:
      return allocAtExit(d, &cudaMalloc_v3020_params::devPtr, &cudaMalloc_v3020_params::size);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000:
      return allocAtExit(d, &cudaMallocManaged_v6000_params::devPtr,
                         &cudaMallocManaged_v6000_params::size);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
      return allocAtExit(d, &cudaMallocAsync_v11020_params::devPtr,
                         &cudaMallocAsync_v11020_params::size);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020:
      return allocAtExit(d, &cudaMallocFromPoolAsync_v11020_params::ptr,
                         &cudaMallocFromPoolAsync_v11020_params::size);
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020:
      return allocAtExit(d, &cudaMallocHost_v3020_params::ptr, &cudaMallocHost_v3020_params::size,
                         true);
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020:
      return allocAtExit(d, &cudaHostAlloc_v3020_params::pHost, &cudaHostAlloc_v3020_params::size,
                         true);
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
      return freeAtEntry(d, &cudaFree_v3020_params::devPtr);
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
      return freeAtEntry(d, &cudaFreeAsync_v11020_params::devPtr);
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020:
      return freeAtEntry(d, &cudaFreeHost_v3020_params::ptr, true);
    default:
      return {};
  }
}

ApiMemoryEvent driver(CUpti_CallbackId cbid, const CUpti_CallbackData* d) {
  if (t_runtimeMemoryCalls > 0) return {};  // the runtime call reports it
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
      return allocAtExit(d, &cuMemAlloc_v2_params::dptr, &cuMemAlloc_v2_params::bytesize);
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
      // Expandable segments: physical memory mapped into a reserved range.
      if (d->callbackSite == CUPTI_API_ENTER || !succeeded(d)) return {};
      const auto* a = static_cast<const cuMemMap_params*>(d->functionParams);
      return event(ApiMemoryEvent::Op::kAlloc, a->ptr, a->size, false);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
      return freeAtEntry(d, &cuMemFree_v2_params::dptr);
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap:
      return freeAtEntry(d, &cuMemUnmap_params::ptr);
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
