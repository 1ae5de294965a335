// A fake libcupti for the tests: the entry points the agent loads (TIDEMARK_CUPTI_LIBRARY names
// this library), and fake_cupti_scenario(), which plays what CUPTI would report for one small
// training step on two streams: records written into the buffers the agent hands out, in the
// layout this library's own cuptiActivityGetNextRecord walks, timestamped by the timestamp
// callback the agent registered, delivered on flush. FAKE_CUPTI_BUSY=1 makes cuptiSubscribe
// answer as CUPTI does when another tool holds it.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "tests/cupti/activity_record.h"

namespace {

std::mutex g_mutex;
CUpti_BuffersCallbackRequestFunc g_request = nullptr;
CUpti_BuffersCallbackCompleteFunc g_complete = nullptr;
CUpti_TimestampCallbackFunc g_clock = nullptr;
std::vector<std::vector<uint8_t>> g_pending;  // records not yet delivered
size_t g_dropped = 0;
int g_subscribers = 0;
CUpti_CallbackFunc g_callback = nullptr;
int g_callbacksEnabled = 0;
int g_activityKinds = 0;  // enabled; with none, CUPTI records no activity

// Real CUPTI tears itself down when the loader unloads it at the process's exit, and a call after
// that crashes the job. The fake does likewise (it aborts, saying so): a capture still running then
// fails the test.
bool g_unloaded = false;
struct Unload {
  ~Unload() { g_unloaded = true; }
} g_unload;

void loaded(const char* entry) {
  if (!g_unloaded) return;
  std::fprintf(stderr, "fake CUPTI: %s called after libcupti was unloaded\n", entry);
  std::abort();
}

// Each record: an 8-byte size, then the record, padded to 8 bytes.
constexpr size_t kHeader = 8;

template <typename T>
void add(const T& record) {
  std::vector<uint8_t> bytes(sizeof(T));
  std::memcpy(bytes.data(), &record, sizeof(T));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_activityKinds > 0) g_pending.push_back(std::move(bytes));
}

uint64_t now() { return g_clock != nullptr ? g_clock() : 0; }

}  // namespace

extern "C" {

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback, void*) {
  loaded("cuptiSubscribe");
  const char* busy = std::getenv("FAKE_CUPTI_BUSY");
  if ((busy != nullptr && busy[0] == '1') || g_subscribers > 0)
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  ++g_subscribers;
  g_callback = callback;
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(0x1);
  return CUPTI_SUCCESS;
}
CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle) {
  loaded("cuptiUnsubscribe");
  --g_subscribers;
  g_callback = nullptr;
  g_callbacksEnabled = 0;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiEnableDomain(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain) {
  loaded("cuptiEnableDomain");
  return CUPTI_SUCCESS;
}
CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                                CUpti_CallbackId) {
  loaded("cuptiEnableCallback");
  g_callbacksEnabled += enable ? 1 : -1;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiGetDeviceId(CUcontext, uint32_t* device) {
  loaded("cuptiGetDeviceId");
  *device = 0;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityEnable(CUpti_ActivityKind) {
  loaded("cuptiActivityEnable");
  ++g_activityKinds;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityDisable(CUpti_ActivityKind) {
  loaded("cuptiActivityDisable");
  --g_activityKinds;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                           CUpti_BuffersCallbackCompleteFunc complete) {
  loaded("cuptiActivityRegisterCallbacks");
  g_request = request;
  g_complete = complete;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc f) {
  loaded("cuptiActivityRegisterTimestampCallback");
  g_clock = f;
  return CUPTI_SUCCESS;
}
CUptiResult cuptiGetResultString(CUptiResult, const char** s) {
  loaded("cuptiGetResultString");
  *s = "fake CUPTI error";
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  loaded("cuptiActivityGetNextRecord");
  size_t at = 0;
  if (*record != nullptr) {
    const size_t current = static_cast<size_t>(reinterpret_cast<uint8_t*>(*record) - buffer);
    uint64_t size = 0;
    std::memcpy(&size, buffer + current - kHeader, kHeader);
    at = current + ((size + 7) & ~size_t{7});
  }
  if (at + kHeader > valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + at + kHeader);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) {
  loaded("cuptiActivityGetNumDroppedRecords");
  std::lock_guard<std::mutex> lock(g_mutex);
  *dropped = g_dropped;
  g_dropped = 0;
  return CUPTI_SUCCESS;
}

// Delivers everything pending: one buffer from the agent per call (as many calls as needed).
CUptiResult cuptiActivityFlushAll(uint32_t) {
  loaded("cuptiActivityFlushAll");
  for (;;) {
    std::vector<std::vector<uint8_t>> records;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_pending.empty() || g_request == nullptr) return CUPTI_SUCCESS;
      records.swap(g_pending);
    }
    uint8_t* buffer = nullptr;
    size_t size = 0, maxRecords = 0;
    g_request(&buffer, &size, &maxRecords);
    if (buffer == nullptr) {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_dropped += records.size();
      return CUPTI_SUCCESS;
    }
    size_t used = 0;
    size_t i = 0;
    for (; i < records.size(); ++i) {
      const size_t need = kHeader + ((records[i].size() + 7) & ~size_t{7});
      if (used + need > size) break;
      const uint64_t n = records[i].size();
      std::memcpy(buffer + used, &n, kHeader);
      std::memcpy(buffer + used + kHeader, records[i].data(), records[i].size());
      used += need;
    }
    if (i < records.size()) {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_pending.insert(g_pending.begin(), records.begin() + static_cast<long>(i), records.end());
    }
    g_complete(nullptr, 0, buffer, size, used);
  }
}

}  // extern "C"

namespace {

// An API call as CUPTI reports it to the subscriber: entry, then (the call done) exit.
template <typename Params>
void apiCall(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, Params* params,
             void (*body)(Params*) = nullptr, uint32_t correlationId = 0) {
  if (g_callback == nullptr || g_callbacksEnabled == 0) return;
  int result = 0;
  CUpti_CallbackData d;
  std::memset(&d, 0, sizeof d);
  d.functionParams = params;
  d.functionReturnValue = &result;
  d.correlationId = correlationId;
  d.callbackSite = CUPTI_API_ENTER;
  g_callback(nullptr, domain, cbid, &d);
  if (body != nullptr) body(params);
  d.callbackSite = CUPTI_API_EXIT;
  g_callback(nullptr, domain, cbid, &d);
}

void* g_segment = reinterpret_cast<void*>(0x7f0000200000);
void* g_async = reinterpret_cast<void*>(0x7f1000000000);
void* g_pinned = reinterpret_cast<void*>(0x5000);
CUdeviceptr g_direct = 0x7f2000000000;

// The allocation calls of the scenario: cudaMalloc (which calls cuMemAlloc inside: reported
// once), cudaMallocAsync, cudaMallocHost, and a direct cuMemAlloc.
void allocationCalls() {
  void* out = nullptr;
  cudaMalloc_v3020_params malloc{&out, 2 << 20};
  apiCall<cudaMalloc_v3020_params>(
      CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, &malloc,
      [](cudaMalloc_v3020_params* p) {
        CUdeviceptr inner = 0;
        cuMemAlloc_v2_params driver{&inner, p->size};
        apiCall<cuMemAlloc_v2_params>(CUPTI_CB_DOMAIN_DRIVER_API,
                                      CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, &driver,
                                      [](cuMemAlloc_v2_params* q) { *q->dptr = 0x7f0000200000; });
        *p->devPtr = g_segment;
      });
  void* async = nullptr;
  cudaMallocAsync_v11020_params mallocAsync{&async, 1 << 20, nullptr};
  apiCall<cudaMallocAsync_v11020_params>(
      CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020, &mallocAsync,
      [](cudaMallocAsync_v11020_params* p) { *p->devPtr = g_async; });
  void* pinned = nullptr;
  cudaMallocHost_v3020_params host{&pinned, 4096};
  apiCall<cudaMallocHost_v3020_params>(CUPTI_CB_DOMAIN_RUNTIME_API,
                                       CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020, &host,
                                       [](cudaMallocHost_v3020_params* p) { *p->ptr = g_pinned; });
  CUdeviceptr direct = 0;
  cuMemAlloc_v2_params driver{&direct, 512 << 10};
  apiCall<cuMemAlloc_v2_params>(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
                                &driver, [](cuMemAlloc_v2_params* q) { *q->dptr = g_direct; });
}

void freeCalls() {
  cudaFreeAsync_v11020_params freeAsync{g_async, nullptr};
  apiCall<cudaFreeAsync_v11020_params>(CUPTI_CB_DOMAIN_RUNTIME_API,
                                       CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020, &freeAsync);
  cuMemFree_v2_params freeDirect{g_direct};
  apiCall<cuMemFree_v2_params>(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
                               &freeDirect);
}

}  // namespace

extern "C" {

// 1 while a subscriber's callbacks and activity records are on (an attached agent's capture).
int fake_cupti_capturing() { return g_callback != nullptr && g_activityKinds > 0 ? 1 : 0; }

// One step's worth of GPU activity on device 0 (see tests/e2e/test_gpu_capture.py).
void fake_cupti_scenario() {
  allocationCalls();
  const uint64_t t0 = now();
  // A 2 MiB segment (cudaMalloc by the caching allocator), a pool, one stream-ordered block.
  auto seg = zeroedRecord<CUpti_ActivityMemory4>(CUPTI_ACTIVITY_KIND_MEMORY2);
  seg.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  seg.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  seg.address = 0x7f0000200000;
  seg.bytes = 2 << 20;
  seg.timestamp = t0 + 1000;
  seg.streamId = 7;
  add(seg);
  auto pool = zeroedRecord<CUpti_ActivityMemoryPool3>(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
  pool.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED;
  pool.address = 0x7f1000000000;
  pool.size = 64 << 20;
  pool.timestamp = t0 + 1500;
  add(pool);
  auto async = seg;
  async.address = 0x7f1000000000;
  async.bytes = 1 << 20;
  async.timestamp = t0 + 2000;
  async.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  add(async);
  // An NVTX range around the step.
  auto mark = zeroedRecord<CUpti_ActivityMarker2>(CUPTI_ACTIVITY_KIND_MARKER);
  mark.flags = CUPTI_ACTIVITY_FLAG_MARKER_START;
  mark.id = 1;
  mark.timestamp = t0 + 2500;
  mark.name = "train_step";
  add(mark);
  // A copy in, three kernels on stream 7, two on stream 13, a fill.
  auto copy = zeroedRecord<CUpti_ActivityMemcpy6>(CUPTI_ACTIVITY_KIND_MEMCPY);
  copy.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  copy.bytes = 1 << 16;
  copy.start = t0 + 3000;
  copy.end = t0 + 4000;
  copy.streamId = 7;
  add(copy);
  const struct {
    const char* name;
    uint32_t stream;
    uint64_t start, end;
  } kernels[] = {{"sgemm_128x64", 7, 5000, 15000},
                 {"softmax_fwd", 7, 15000, 18000},
                 {"sgemm_128x64", 7, 18000, 28000},
                 {"nccl_allreduce", 13, 6000, 26000},
                 {"elementwise_add", 13, 26000, 27000}};
  uint32_t correlation = 100;
  for (const auto& k : kernels) {
    // The launch, on the calling thread (its correlation id ties the kernel to it).
    cudaLaunchKernel_v7000_params launch{};
    apiCall<cudaLaunchKernel_v7000_params>(CUPTI_CB_DOMAIN_RUNTIME_API,
                                           CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, &launch,
                                           nullptr, correlation);
    auto r = zeroedRecord<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    r.name = k.name;
    r.streamId = k.stream;
    r.start = t0 + k.start;
    r.end = t0 + k.end;
    r.correlationId = correlation++;
    add(r);
  }
  auto fill = zeroedRecord<CUpti_ActivityMemset4>(CUPTI_ACTIVITY_KIND_MEMSET);
  fill.bytes = 4096;
  fill.start = t0 + 28000;
  fill.end = t0 + 28500;
  fill.streamId = 13;
  add(fill);
  auto sync = zeroedRecord<CUpti_ActivitySynchronization2>(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  sync.start = t0 + 28500;
  sync.end = t0 + 29000;
  sync.streamId = 7;
  add(sync);
  mark.flags = CUPTI_ACTIVITY_FLAG_MARKER_END;
  mark.name = nullptr;
  mark.timestamp = t0 + 29500;
  add(mark);
  // The stream-ordered block goes back to its pool; the segment stays (a caching allocator's).
  async.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
  async.timestamp = t0 + 30000;
  add(async);
  freeCalls();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_dropped += 3;  // CUPTI lost three records (reported with the next buffer)
}

}  // extern "C"
