#include "agent/cupti/gpu_recorder.h"

#include <algorithm>

namespace tidemark::agent {

namespace {
constexpr uint8_t kMemoryHost = 1, kMemoryDevice = 2;  // tidemark.v1.MemoryKind
constexpr uint8_t kScopeOp = 1, kScopeKernel = 2;      // tidemark.v1.ScopeKind

const char* copyName(uint8_t copyKind) {
  switch (copyKind) {  // CUpti_ActivityMemcpyKind
    case 1:
      return "[memcpy HtoD]";
    case 2:
      return "[memcpy DtoH]";
    case 3:
      return "[memcpy HtoA]";
    case 4:
      return "[memcpy AtoH]";
    case 5:
      return "[memcpy AtoA]";
    case 6:
      return "[memcpy AtoD]";
    case 7:
      return "[memcpy DtoA]";
    case 8:
      return "[memcpy DtoD]";
    case 9:
      return "[memcpy HtoH]";
    case 10:
      return "[memcpy PtoP]";
    default:
      return "[memcpy]";
  }
}
}  // namespace

GpuRecorder::GpuRecorder(Recorder& recorder, Interner& interner)
    : m_recorder(recorder), m_interner(interner) {
  m_deviceReservedIid = m_interner.intern("device_reserved_bytes");
  m_poolReservedIid = m_interner.intern("pool_reserved_bytes");
  m_droppedIid = m_interner.intern("cupti_dropped_records");
}

bool GpuRecorder::recordDropped(uint64_t total, int64_t tsNs) {
  return counter(m_droppedIid, static_cast<int64_t>(total), tsNs);
}

bool GpuRecorder::push(Record r) { return m_recorder.pushAt(r); }

bool GpuRecorder::scope(uint32_t nameIid, uint8_t kind, uint32_t lane, int64_t beginNs,
                        int64_t endNs, uint32_t correlationId) {
  Record b{};
  b.address = correlationId;
  b.kind = RecordKind::kScopeBegin;
  b.small = kind;
  b.nameIid = nameIid;
  b.threadId = lane;
  b.tsNs = beginNs;
  b.device = -1;
  Record e = b;
  e.kind = RecordKind::kScopeEnd;
  e.address = 0;
  e.tsNs = std::max(beginNs, endNs);
  return push(b) && push(e);
}

bool GpuRecorder::counter(uint32_t nameIid, int64_t value, int64_t tsNs) {
  Record c{};
  c.kind = RecordKind::kCounter;
  c.nameIid = nameIid;
  c.sizeBytes = static_cast<uint64_t>(value);
  c.tsNs = tsNs;
  c.device = -1;
  return push(c);
}

bool GpuRecorder::record(const GpuEvent& e) {
  using K = GpuEvent::Kind;
  switch (e.kind) {
    case K::kKernel:
      return scope(m_interner.intern(e.name.empty() ? "[kernel]" : e.name), kScopeKernel, e.stream,
                   e.startNs, e.endNs, e.correlationId);
    case K::kMemcpy:
      return scope(m_interner.intern(copyName(e.copyKind)), kScopeKernel, e.stream, e.startNs,
                   e.endNs, e.correlationId);
    case K::kMemset:
      return scope(m_interner.intern("[memset]"), kScopeKernel, e.stream, e.startNs, e.endNs,
                   e.correlationId);
    case K::kMemoryAlloc:
    case K::kMemoryFree: {
      const bool host =
          e.memory == GpuEvent::Memory::kPinned || e.memory == GpuEvent::Memory::kPageable;
      Record r{};
      r.kind = e.kind == K::kMemoryAlloc ? RecordKind::kAlloc : RecordKind::kFree;
      r.small = host ? kMemoryHost : kMemoryDevice;
      r.device = host ? -1 : static_cast<int32_t>(e.device);
      r.address = e.address;
      r.sizeBytes = e.bytes;
      r.tsNs = e.startNs;
      r.threadId = e.stream;
      bool ok = m_blocksFromCallbacks || push(r);
      if (!host) {
        if (e.kind == K::kMemoryAlloc) {
          m_deviceBlocks[e.address] = e.bytes;
          m_deviceBytes += static_cast<int64_t>(e.bytes);
        } else if (auto it = m_deviceBlocks.find(e.address); it != m_deviceBlocks.end()) {
          m_deviceBytes -= static_cast<int64_t>(it->second);
          m_deviceBlocks.erase(it);
        }
        ok = counter(m_deviceReservedIid, m_deviceBytes, e.startNs) && ok;
      }
      return ok;
    }
    case K::kPoolCreated:
      m_pools[e.address] = e.bytes;
      break;
    case K::kPoolTrimmed:
      m_pools[e.address] = e.bytes;
      break;
    case K::kPoolDestroyed:
      m_pools.erase(e.address);
      break;
    case K::kMarker: {
      if (e.markerStart) {
        m_openMarkers[e.markerId] = m_interner.intern(e.name.empty() ? "[range]" : e.name);
        Record b{};
        b.kind = RecordKind::kScopeBegin;
        b.small = kScopeOp;
        b.nameIid = m_openMarkers[e.markerId];
        b.tsNs = e.startNs;
        b.device = -1;
        return push(b);
      }
      if (e.markerEnd) {
        auto it = m_openMarkers.find(e.markerId);
        if (it == m_openMarkers.end()) return true;  // its start came before the capture
        Record r{};
        r.kind = RecordKind::kScopeEnd;
        r.small = kScopeOp;
        r.nameIid = it->second;
        r.tsNs = e.startNs;
        r.device = -1;
        m_openMarkers.erase(it);
        return push(r);
      }
      return true;  // instants are not kept
    }
    case K::kSynchronization:
      return scope(m_interner.intern("[synchronize]"), kScopeKernel, e.stream, e.startNs, e.endNs);
    case K::kExternalCorrelation:
      return true;  // used by the attribution of kernels to ops (not built yet)
  }
  // Pools: the counter of what they hold.
  m_poolBytes = 0;
  for (const auto& [address, bytes] : m_pools) m_poolBytes += static_cast<int64_t>(bytes);
  return counter(m_poolReservedIid, m_poolBytes, e.startNs);
}

}  // namespace tidemark::agent
