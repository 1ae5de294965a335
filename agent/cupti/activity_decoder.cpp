#include "agent/cupti/activity_decoder.h"

namespace tidemark::agent {

namespace {

using K = GpuEvent::Kind;

int64_t ns(uint64_t t) { return static_cast<int64_t>(t); }

// What kernels, copies and fills share: their interval on a stream and the launching call.
template <typename Record>
const Record* onStream(const CUpti_Activity* record, K kind, GpuEvent* out) {
  const auto* r = reinterpret_cast<const Record*>(record);
  out->kind = kind;
  out->startNs = ns(r->start);
  out->endNs = ns(r->end);
  out->device = r->deviceId;
  out->context = r->contextId;
  out->stream = r->streamId;
  out->correlationId = r->correlationId;
  return r;
}

}  // namespace

bool decodeActivity(const CUpti_Activity* record, GpuEvent* out) {
  *out = GpuEvent{};
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = onStream<CUpti_ActivityKernel10>(record, K::kKernel, out);
      if (k->name != nullptr) out->name = k->name;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = onStream<CUpti_ActivityMemcpy6>(record, K::kMemcpy, out);
      out->bytes = m->bytes;
      out->copyKind = m->copyKind;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET:
      out->bytes = onStream<CUpti_ActivityMemset4>(record, K::kMemset, out)->bytes;
      return true;
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemory4*>(record);
      if (m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION) {
        out->kind = K::kMemoryAlloc;
      } else if (m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE) {
        out->kind = K::kMemoryFree;
      } else {
        return false;
      }
      out->startNs = out->endNs = ns(m->timestamp);
      out->device = m->deviceId;
      out->context = m->contextId;
      out->stream = m->streamId;
      out->correlationId = m->correlationId;
      out->address = m->address;
      out->bytes = m->bytes;
      out->memory = static_cast<GpuEvent::Memory>(
          m->memoryKind <= CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC ? m->memoryKind : 0);
      out->fromPool = m->memoryPoolConfig.memoryPoolType != CUPTI_ACTIVITY_MEMORY_POOL_TYPE_INVALID;
      if (m->name != nullptr) out->name = m->name;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL: {
      const auto* p = reinterpret_cast<const CUpti_ActivityMemoryPool3*>(record);
      switch (p->memoryPoolOperationType) {
        case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED:
          out->kind = K::kPoolCreated;
          break;
        case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED:
          out->kind = K::kPoolDestroyed;
          break;
        case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED:
          out->kind = K::kPoolTrimmed;
          break;
        default:
          return false;
      }
      out->startNs = out->endNs = ns(p->timestamp);
      out->device = p->deviceId;
      out->correlationId = p->correlationId;
      out->address = p->address;
      out->bytes = p->size;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMarker2*>(record);
      out->kind = K::kMarker;
      out->startNs = out->endNs = ns(m->timestamp);
      out->markerId = m->id;
      out->markerStart = (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) != 0;
      out->markerEnd = (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) != 0;
      if (m->name != nullptr) out->name = m->name;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(record);
      out->kind = K::kSynchronization;
      out->startNs = ns(s->start);
      out->endNs = ns(s->end);
      out->context = s->contextId;
      out->stream = s->streamId;
      out->correlationId = s->correlationId;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      out->kind = K::kExternalCorrelation;
      out->correlationId = e->correlationId;
      out->externalId = e->externalId;
      out->externalKind = static_cast<uint32_t>(e->externalKind);
      return true;
    }
    default:
      return false;
  }
}

size_t decodeBuffer(uint8_t* buffer, size_t validSize, NextRecordFn next,
                    std::vector<GpuEvent>* out) {
  size_t skipped = 0;
  CUpti_Activity* record = nullptr;
  while (next(buffer, validSize, &record) == CUPTI_SUCCESS && record != nullptr) {
    GpuEvent e;
    if (decodeActivity(record, &e)) {
      out->push_back(std::move(e));
    } else {
      ++skipped;
    }
  }
  return skipped;
}

}  // namespace tidemark::agent
