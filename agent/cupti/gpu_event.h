#pragma once

#include <cstdint>
#include <string>

namespace tidemark::agent {

// One thing CUPTI saw on the GPU, decoded from its activity record (activity_decoder.h). Plain
// data without CUDA types, so that what is built on it (recording, tests) needs no CUDA headers.
struct GpuEvent {
  enum class Kind : uint8_t {
    kKernel,       // a kernel ran on a stream: [startNs, endNs)
    kMemcpy,       // a copy: bytes, copyKind
    kMemset,       // a fill: bytes
    kMemoryAlloc,  // MEMORY2: device (or pinned, managed) memory allocated at address
    kMemoryFree,   // MEMORY2: released
    kPoolCreated,  // a memory pool (cudaMallocAsync's): address, bytes reserved
    kPoolDestroyed,
    kPoolTrimmed,
    kMarker,               // NVTX: a range start, end, or an instant; markerId pairs them
    kSynchronization,      // a stream, event or context synchronization: [startNs, endNs)
    kExternalCorrelation,  // a correlation id tied to an id of a layer above (e.g. torch's op)
  };
  // Where the memory of a MEMORY2 record lives (CUpti_ActivityMemoryKind).
  enum class Memory : uint8_t {
    kUnknown = 0,
    kPageable = 1,
    kPinned = 2,
    kDevice = 3,
    kArray = 4,
    kManaged = 5,
    kDeviceStatic = 6,
    kManagedStatic = 7,
  };

  Kind kind = Kind::kKernel;
  int64_t startNs = 0;  // CUPTI's timestamps (its clock: see the timestamp callback)
  int64_t endNs = 0;    // = startNs for instants
  uint32_t device = 0;
  uint32_t context = 0;
  uint32_t stream = 0;
  uint32_t correlationId = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
  Memory memory = Memory::kUnknown;
  bool fromPool = false;  // MEMORY2: stream-ordered (cudaMallocAsync) memory from a pool
  uint8_t copyKind = 0;   // memcpy: CUpti_ActivityMemcpyKind
  uint32_t markerId = 0;  // marker: pairs a range's start and end
  bool markerStart = false, markerEnd = false;
  uint64_t externalId = 0;
  uint32_t externalKind = 0;
  std::string name;  // kernel, marker ("" when CUPTI gave none)
};

}  // namespace tidemark::agent
