// CUPTI activity records synthesized here (CUDA 13's structs, filled as CUPTI fills them) through
// the agent's decoder: every kind tidemark uses, and a completed buffer walked record by record.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "agent/cupti/activity_decoder.h"
#include "agent/cupti/api_callbacks.h"
#include "agent/cupti/gpu_recorder.h"
#include "tests/cupti/activity_record.h"
#include "tests/unit/record_sinks.h"

namespace tidemark::agent {
namespace {

using K = GpuEvent::Kind;

GpuEvent decode(const void* record) {
  GpuEvent e;
  EXPECT_TRUE(decodeActivity(static_cast<const CUpti_Activity*>(record), &e));
  return e;
}

TEST(CuptiDecoder, KernelsOnTheirStream) {
  auto k = zeroedRecord<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  k.start = 1'000'000;
  k.end = 1'250'000;
  k.deviceId = 1;
  k.contextId = 2;
  k.streamId = 7;
  k.correlationId = 42;
  k.name = "ampere_sgemm_128x64_tn";
  const GpuEvent e = decode(&k);
  EXPECT_EQ(e.kind, K::kKernel);
  EXPECT_EQ(e.startNs, 1'000'000);
  EXPECT_EQ(e.endNs, 1'250'000);
  EXPECT_EQ(e.device, 1u);
  EXPECT_EQ(e.stream, 7u);
  EXPECT_EQ(e.correlationId, 42u);
  EXPECT_EQ(e.name, "ampere_sgemm_128x64_tn");
}

TEST(CuptiDecoder, Memory2AllocationsAndReleasesIncludingPools) {
  auto a = zeroedRecord<CUpti_ActivityMemory4>(CUPTI_ACTIVITY_KIND_MEMORY2);
  a.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  a.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  a.address = 0x7f0000200000;
  a.bytes = 2 << 20;
  a.timestamp = 5000;
  a.deviceId = 0;
  a.streamId = 3;
  a.correlationId = 9;
  GpuEvent e = decode(&a);
  EXPECT_EQ(e.kind, K::kMemoryAlloc);
  EXPECT_EQ(e.address, 0x7f0000200000u);
  EXPECT_EQ(e.bytes, 2u << 20);
  EXPECT_EQ(e.startNs, 5000);
  EXPECT_EQ(e.memory, GpuEvent::Memory::kDevice);
  EXPECT_FALSE(e.fromPool);

  // cudaMallocAsync: the same record, from a pool.
  a.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  EXPECT_TRUE(decode(&a).fromPool);

  auto r = a;
  r.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
  r.timestamp = 9000;
  e = decode(&r);
  EXPECT_EQ(e.kind, K::kMemoryFree);
  EXPECT_EQ(e.address, 0x7f0000200000u);
  EXPECT_EQ(e.startNs, 9000);

  // Pinned host memory (cudaMallocHost) and managed memory keep their kind.
  a.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  EXPECT_EQ(decode(&a).memory, GpuEvent::Memory::kPinned);
  a.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_MANAGED;
  EXPECT_EQ(decode(&a).memory, GpuEvent::Memory::kManaged);

  // An operation CUPTI did not fill is skipped, not guessed.
  a.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_INVALID;
  GpuEvent skipped;
  EXPECT_FALSE(decodeActivity(reinterpret_cast<CUpti_Activity*>(&a), &skipped));
}

TEST(CuptiDecoder, PoolsCopiesFillsMarkersSyncAndCorrelation) {
  auto p = zeroedRecord<CUpti_ActivityMemoryPool3>(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED;
  p.address = 0x7f1000000000;
  p.size = 64 << 20;
  p.timestamp = 100;
  p.deviceId = 2;
  GpuEvent e = decode(&p);
  EXPECT_EQ(e.kind, K::kPoolCreated);
  EXPECT_EQ(e.bytes, 64u << 20);
  EXPECT_EQ(e.device, 2u);
  p.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED;
  EXPECT_EQ(decode(&p).kind, K::kPoolTrimmed);

  auto c = zeroedRecord<CUpti_ActivityMemcpy6>(CUPTI_ACTIVITY_KIND_MEMCPY);
  c.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  c.bytes = 4096;
  c.start = 10;
  c.end = 30;
  c.streamId = 5;
  e = decode(&c);
  EXPECT_EQ(e.kind, K::kMemcpy);
  EXPECT_EQ(e.bytes, 4096u);
  EXPECT_EQ(e.copyKind, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD);
  EXPECT_EQ(e.endNs - e.startNs, 20);

  auto s = zeroedRecord<CUpti_ActivityMemset4>(CUPTI_ACTIVITY_KIND_MEMSET);
  s.bytes = 512;
  s.start = 40;
  s.end = 41;
  EXPECT_EQ(decode(&s).kind, K::kMemset);
  EXPECT_EQ(decode(&s).bytes, 512u);

  auto m = zeroedRecord<CUpti_ActivityMarker2>(CUPTI_ACTIVITY_KIND_MARKER);
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_START;
  m.id = 77;
  m.timestamp = 1234;
  m.name = "forward";
  e = decode(&m);
  EXPECT_EQ(e.kind, K::kMarker);
  EXPECT_TRUE(e.markerStart);
  EXPECT_FALSE(e.markerEnd);
  EXPECT_EQ(e.markerId, 77u);
  EXPECT_EQ(e.name, "forward");
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_END;
  m.name = nullptr;  // an end carries no name
  e = decode(&m);
  EXPECT_TRUE(e.markerEnd);
  EXPECT_EQ(e.name, "");

  auto y = zeroedRecord<CUpti_ActivitySynchronization2>(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  y.start = 50;
  y.end = 80;
  y.streamId = 4;
  e = decode(&y);
  EXPECT_EQ(e.kind, K::kSynchronization);
  EXPECT_EQ(e.stream, 4u);

  auto x =
      zeroedRecord<CUpti_ActivityExternalCorrelation>(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
  x.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
  x.externalId = 123456789;
  x.correlationId = 42;
  e = decode(&x);
  EXPECT_EQ(e.kind, K::kExternalCorrelation);
  EXPECT_EQ(e.externalId, 123456789u);
  EXPECT_EQ(e.correlationId, 42u);
}

// The buffer a test hands the walker: pointers to records, in order.
CUptiResult walkPointers(uint8_t* buffer, size_t validSize, CUpti_Activity** record) {
  auto** slots = reinterpret_cast<CUpti_Activity**>(buffer);
  const size_t n = validSize / sizeof(CUpti_Activity*);
  size_t i = 0;
  if (*record != nullptr) {
    while (i < n && slots[i] != *record) ++i;
    ++i;
  }
  if (i >= n) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = slots[i];
  return CUPTI_SUCCESS;
}

TEST(CuptiDecoder, ABufferInOrderSkippingKindsNotUsed) {
  auto k = zeroedRecord<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_KERNEL);
  k.name = "k";
  auto a = zeroedRecord<CUpti_ActivityMemory4>(CUPTI_ACTIVITY_KIND_MEMORY2);
  a.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  auto other = zeroedRecord<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_OVERHEAD);
  std::vector<CUpti_Activity*> slots = {reinterpret_cast<CUpti_Activity*>(&k),
                                        reinterpret_cast<CUpti_Activity*>(&other),
                                        reinterpret_cast<CUpti_Activity*>(&a)};
  std::vector<GpuEvent> events;
  const size_t skipped =
      decodeBuffer(reinterpret_cast<uint8_t*>(slots.data()), slots.size() * sizeof(CUpti_Activity*),
                   &walkPointers, &events);
  EXPECT_EQ(skipped, 1u);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, K::kKernel);
  EXPECT_EQ(events[1].kind, K::kMemoryAlloc);
}

}  // namespace
}  // namespace tidemark::agent

// Decoded events through the GPU recorder into the agent's rings: what the drain thread sends.
namespace tidemark::agent {
namespace {

std::vector<Record> drain(Recorder& rec) {
  std::vector<Record> out;
  rec.drainAll(eachRecord([&](const Record& r) { out.push_back(r); }));
  return out;
}

TEST(GpuRecorder, KernelsMemoryCountersAndRanges) {
  Recorder& rec = Recorder::instance();
  ASSERT_TRUE(rec.init(1 << 12, 1 << 10));
  rec.setRecording(true);
  drain(rec);
  Interner names;
  GpuRecorder gpu(rec, names);
  using K = GpuEvent::Kind;
  auto event = [](K kind, int64_t t) {
    GpuEvent e;
    e.kind = kind;
    e.startNs = e.endNs = t;
    return e;
  };
  GpuEvent alloc = event(K::kMemoryAlloc, 100);
  alloc.memory = GpuEvent::Memory::kDevice;
  alloc.device = 1;
  alloc.address = 0x7f0000000000;
  alloc.bytes = 1 << 20;
  GpuEvent kernel = event(K::kKernel, 200);
  kernel.endNs = 260;
  kernel.stream = 7;
  kernel.name = "gemm";
  GpuEvent copy = event(K::kMemcpy, 300);
  copy.endNs = 310;
  copy.copyKind = 1;
  GpuEvent pinned = event(K::kMemoryAlloc, 320);
  pinned.memory = GpuEvent::Memory::kPinned;
  pinned.address = 0x5000;
  pinned.bytes = 4096;
  GpuEvent free = alloc;
  free.kind = K::kMemoryFree;
  free.startNs = free.endNs = 400;
  GpuEvent pool = event(K::kPoolCreated, 410);
  pool.address = 0x7f1000000000;
  pool.bytes = 64 << 20;
  GpuEvent start = event(K::kMarker, 500);
  start.markerStart = true;
  start.markerId = 3;
  start.name = "forward";
  GpuEvent end = event(K::kMarker, 600);
  end.markerEnd = true;
  end.markerId = 3;
  for (const GpuEvent& e : {alloc, kernel, copy, pinned, free, pool, start, end})
    ASSERT_TRUE(gpu.record(e));
  const std::vector<Record> r = drain(rec);
  ASSERT_EQ(r.size(), 12u);
  // Device memory, on its device, and the reserved counter after it.
  EXPECT_EQ(r[0].kind, RecordKind::kAlloc);
  EXPECT_EQ(r[0].small, 2);  // DEVICE
  EXPECT_EQ(r[0].device, 1);
  EXPECT_EQ(r[0].tsNs, 100);
  EXPECT_EQ(r[1].kind, RecordKind::kCounter);
  EXPECT_EQ(r[1].sizeBytes, 1u << 20);
  // The kernel: a KERNEL scope on stream 7, at CUPTI's times, named.
  EXPECT_EQ(r[2].kind, RecordKind::kScopeBegin);
  EXPECT_EQ(r[2].small, 2);
  EXPECT_EQ(r[2].threadId, 7u);
  EXPECT_EQ(r[3].kind, RecordKind::kScopeEnd);
  EXPECT_EQ(r[3].tsNs, 260);
  EXPECT_EQ(r[2].nameIid, names.intern("gemm"));
  EXPECT_EQ(r[4].nameIid, names.intern("[memcpy HtoD]"));
  // Pinned host memory is host memory, with no device counter after it.
  EXPECT_EQ(r[6].kind, RecordKind::kAlloc);
  EXPECT_EQ(r[6].small, 1);
  EXPECT_EQ(r[6].device, -1);
  EXPECT_EQ(r[7].kind, RecordKind::kFree);
  EXPECT_EQ(r[8].kind, RecordKind::kCounter);
  EXPECT_EQ(r[8].sizeBytes, 0u);
  EXPECT_EQ(gpu.deviceReservedBytes(), 0);
  EXPECT_EQ(r[9].kind, RecordKind::kCounter);  // the pool
  EXPECT_EQ(r[9].nameIid, names.intern("pool_reserved_bytes"));
  EXPECT_EQ(r[9].sizeBytes, 64u << 20);
  // The NVTX range as an op scope, its end found by the marker id.
  EXPECT_EQ(r[10].kind, RecordKind::kScopeBegin);
  EXPECT_EQ(r[10].small, 1);
  EXPECT_EQ(r[10].nameIid, names.intern("forward"));
  EXPECT_EQ(r[11].kind, RecordKind::kScopeEnd);
  EXPECT_EQ(r[11].nameIid, r[10].nameIid);
  // Sequence numbers stay dense.
  for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i].seq, r[i - 1].seq + 1);
}

}  // namespace
}  // namespace tidemark::agent

// The allocation callbacks: what each call says about memory, at entry or exit.
namespace tidemark::agent {
namespace {

CUpti_CallbackData callbackData(const void* params, int* result, CUpti_ApiCallbackSite site) {
  CUpti_CallbackData d;
  std::memset(&d, 0, sizeof d);
  d.functionParams = params;
  d.functionReturnValue = result;
  d.callbackSite = site;
  return d;
}

TEST(ApiCallbacks, AllocsAtExitFreesAtEntryRuntimeOverDriver) {
  using Op = ApiMemoryEvent::Op;
  int ok = 0, failed = 2;
  void* ptr = reinterpret_cast<void*>(0x7f0000200000);
  cudaMalloc_v3020_params malloc{&ptr, 2 << 20};
  CUdeviceptr inner = 0x7f0000200000;
  cuMemAlloc_v2_params driver{&inner, 2 << 20};
  auto runtimeCall = [&](CUpti_ApiCallbackSite site, int* result) {
    const CUpti_CallbackData d = callbackData(&malloc, result, site);
    return decodeApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,
                             &d);
  };
  auto driverCall = [&](CUpti_ApiCallbackSite site) {
    const CUpti_CallbackData d = callbackData(&driver, &ok, site);
    return decodeApiCallback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, &d);
  };
  // cudaMalloc, with the cuMemAlloc it makes inside: one allocation, at the runtime's exit.
  EXPECT_EQ(runtimeCall(CUPTI_API_ENTER, &ok).op, Op::kNone);
  EXPECT_EQ(driverCall(CUPTI_API_ENTER).op, Op::kNone);
  EXPECT_EQ(driverCall(CUPTI_API_EXIT).op, Op::kNone);
  const ApiMemoryEvent a = runtimeCall(CUPTI_API_EXIT, &ok);
  EXPECT_EQ(a.op, Op::kAlloc);
  EXPECT_EQ(a.address, 0x7f0000200000u);
  EXPECT_EQ(a.bytes, 2u << 20);
  EXPECT_FALSE(a.host);
  // A failed cudaMalloc allocates nothing.
  runtimeCall(CUPTI_API_ENTER, &failed);
  EXPECT_EQ(runtimeCall(CUPTI_API_EXIT, &failed).op, Op::kNone);
  // cuMemAlloc called directly counts.
  EXPECT_EQ(driverCall(CUPTI_API_ENTER).op, Op::kNone);
  EXPECT_EQ(driverCall(CUPTI_API_EXIT).op, Op::kAlloc);
  // Frees at entry, before the memory can be reused.
  cudaFree_v3020_params release{ptr};
  CUpti_CallbackData d = callbackData(&release, &ok, CUPTI_API_ENTER);
  const ApiMemoryEvent f =
      decodeApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, &d);
  EXPECT_EQ(f.op, Op::kFree);
  EXPECT_EQ(f.address, 0x7f0000200000u);
  d.callbackSite = CUPTI_API_EXIT;
  EXPECT_EQ(
      decodeApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, &d)
          .op,
      Op::kNone);
  // Pinned host memory is marked as such; expandable segments map and unmap.
  void* pinned = reinterpret_cast<void*>(0x5000);
  cudaMallocHost_v3020_params host{&pinned, 4096};
  d = callbackData(&host, &ok, CUPTI_API_ENTER);
  decodeApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020, &d);
  d.callbackSite = CUPTI_API_EXIT;
  EXPECT_TRUE(decodeApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API,
                                CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020, &d)
                  .host);
  cuMemMap_params map{0x7f3000000000, 20 << 20, 0, 0, 0};
  d = callbackData(&map, &ok, CUPTI_API_EXIT);
  const ApiMemoryEvent m =
      decodeApiCallback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemMap, &d);
  EXPECT_EQ(m.op, Op::kAlloc);
  EXPECT_EQ(m.bytes, 20u << 20);
}

}  // namespace
}  // namespace tidemark::agent
