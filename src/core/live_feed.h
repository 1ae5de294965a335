#pragma once

#include <cstdint>

#include "src/core/live_analysis.h"

namespace tidemark::core {

// One call of LiveAnalysis's feed (but for names, which carry text), as a record: what an
// ingest hands a live analysis that is not there yet (being built again from the store) waits in
// a log of these, applied in order once it is.
struct LiveCall {
  enum class Kind : uint8_t {
    kAlloc,
    kFree,
    kTag,
    kPhaseBegin,
    kPhaseEnd,
    kModuleBegin,
    kModuleEnd,
    kOpScopeSeen,
    kStepBegin,
    kStepEnd,
  };
  Kind kind = Kind::kAlloc;
  MemoryKind memoryKind = MemoryKind::kHost;  // alloc, free
  Category category = Category::kUnknown;     // tag
  Phase phase = Phase::kNone;                 // phase begin
  int32_t device = -1;                        // alloc, free
  uint32_t threadId = 0;                      // alloc
  uint32_t iid = 0;                           // alloc: module scope; tag: name; module begin: name
  uint32_t opIid = 0;                         // alloc
  uint64_t seq = 0;                           // the event's (the begin's for phase and module ends)
  uint64_t endSeq = 0;                        // phase end
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  int64_t tsNs = 0;
  int64_t step = 0;  // step begin, end

  static LiveCall of(Kind kind, uint64_t seq, int64_t tsNs = 0) {
    LiveCall c;
    c.kind = kind;
    c.seq = seq;
    c.tsNs = tsNs;
    return c;
  }
  static LiveCall stepMark(Kind kind, int64_t step, uint64_t seq, int64_t tsNs) {
    LiveCall c = of(kind, seq, tsNs);
    c.step = step;
    return c;
  }

  void applyTo(LiveAnalysis& live) const {
    switch (kind) {
      case Kind::kAlloc: {
        Block b;
        b.address = address;
        b.sizeBytes = sizeBytes;
        b.kind = memoryKind;
        b.device = device;
        b.threadId = threadId;
        b.allocSeq = seq;
        b.allocTsNs = tsNs;
        live.alloc(b, iid, opIid);
        break;
      }
      case Kind::kFree:
        live.free(memoryKind, device, address, seq, tsNs);
        break;
      case Kind::kTag:
        live.tag(seq, address, category, iid);
        break;
      case Kind::kPhaseBegin:
        live.phaseBegin(seq, phase);
        break;
      case Kind::kPhaseEnd:
        live.phaseEnd(seq, endSeq);
        break;
      case Kind::kModuleBegin:
        live.moduleBegin(seq, iid);
        break;
      case Kind::kModuleEnd:
        live.moduleEnd(seq);
        break;
      case Kind::kOpScopeSeen:
        live.opScopeSeen();
        break;
      case Kind::kStepBegin:
        live.stepBegin(step, seq, tsNs);
        break;
      case Kind::kStepEnd:
        live.stepEnd(step, seq, tsNs);
        break;
    }
  }
};

}  // namespace tidemark::core
