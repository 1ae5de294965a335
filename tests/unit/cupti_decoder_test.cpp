// CUPTI activity records synthesized here (CUDA 13's structs, filled as CUPTI fills them) through
// the agent's decoder: every kind tidemark uses, and a completed buffer walked record by record.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "agent/cupti/activity_decoder.h"

namespace tidemark::agent {
namespace {

using K = GpuEvent::Kind;

template <typename T>
T zeroed(CUpti_ActivityKind kind) {
  T r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  return r;
}

GpuEvent decode(const void* record) {
  GpuEvent e;
  EXPECT_TRUE(decodeActivity(static_cast<const CUpti_Activity*>(record), &e));
  return e;
}

TEST(CuptiDecoder, KernelsOnTheirStream) {
  auto k = zeroed<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
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
  auto a = zeroed<CUpti_ActivityMemory4>(CUPTI_ACTIVITY_KIND_MEMORY2);
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
  auto p = zeroed<CUpti_ActivityMemoryPool3>(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
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

  auto c = zeroed<CUpti_ActivityMemcpy6>(CUPTI_ACTIVITY_KIND_MEMCPY);
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

  auto s = zeroed<CUpti_ActivityMemset4>(CUPTI_ACTIVITY_KIND_MEMSET);
  s.bytes = 512;
  s.start = 40;
  s.end = 41;
  EXPECT_EQ(decode(&s).kind, K::kMemset);
  EXPECT_EQ(decode(&s).bytes, 512u);

  auto m = zeroed<CUpti_ActivityMarker2>(CUPTI_ACTIVITY_KIND_MARKER);
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

  auto y = zeroed<CUpti_ActivitySynchronization2>(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  y.start = 50;
  y.end = 80;
  y.streamId = 4;
  e = decode(&y);
  EXPECT_EQ(e.kind, K::kSynchronization);
  EXPECT_EQ(e.stream, 4u);

  auto x = zeroed<CUpti_ActivityExternalCorrelation>(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
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
  auto k = zeroed<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_KERNEL);
  k.name = "k";
  auto a = zeroed<CUpti_ActivityMemory4>(CUPTI_ACTIVITY_KIND_MEMORY2);
  a.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  auto other = zeroed<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_OVERHEAD);
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
