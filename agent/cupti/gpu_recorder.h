#pragma once

#include <cstdint>
#include <unordered_map>

#include "agent/cupti/gpu_event.h"
#include "agent/recorder/recorder.h"
#include "agent/transport/interner.h"

namespace tidemark::agent {

// Turns decoded GPU events into the agent's records, at CUPTI's times (which the agent's
// timestamp callback puts on the host's CLOCK_MONOTONIC: one clock in the store):
// - device and managed memory (MEMORY2) → Alloc/Free of kind DEVICE on its device; pinned host
//   memory → Alloc/Free of kind HOST; and the counter "device_reserved_bytes" after each change;
// - kernels → KERNEL scopes on their stream (the scope's thread is the stream), named by the
//   kernel; memcpy and memset → KERNEL scopes "[memcpy HtoD]", "[memset]";
// - memory pools → the counter "pool_reserved_bytes";
// - NVTX ranges → op scopes on the stream 0 lane (the host thread is unknown to CUPTI's record).
// Called on the thread that parses CUPTI's buffers, never on a hook.
class GpuRecorder {
 public:
  GpuRecorder(Recorder& recorder, Interner& interner);
  // False if the record(s) were dropped (ring full).
  bool record(const GpuEvent& e);

  // With the allocation callbacks on, device blocks come from them (on the calling thread, in
  // order with the host's events); MEMORY2 records then only move the reserved counter.
  void setBlocksFromCallbacks(bool on) { m_blocksFromCallbacks = on; }
  // CUPTI's count of records it dropped so far, as the counter "cupti_dropped_records".
  bool recordDropped(uint64_t total, int64_t tsNs);

  int64_t deviceReservedBytes() const { return m_deviceBytes; }
  int64_t poolReservedBytes() const { return m_poolBytes; }

 private:
  bool push(Record r);
  bool scope(uint32_t nameIid, uint8_t kind, uint32_t lane, int64_t beginNs, int64_t endNs,
             uint32_t correlationId = 0);
  bool counter(uint32_t nameIid, int64_t value, int64_t tsNs);

  Recorder& m_recorder;
  Interner& m_interner;
  int64_t m_deviceBytes = 0, m_poolBytes = 0;
  bool m_blocksFromCallbacks = false;
  std::unordered_map<uint64_t, uint64_t> m_deviceBlocks;  // address → bytes
  std::unordered_map<uint64_t, uint64_t> m_pools;         // address → bytes
  std::unordered_map<uint32_t, uint32_t> m_openMarkers;   // marker id → name iid
  uint32_t m_deviceReservedIid = 0, m_poolReservedIid = 0, m_droppedIid = 0;
};

}  // namespace tidemark::agent
