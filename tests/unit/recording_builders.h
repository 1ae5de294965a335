#pragma once

// Small builders for hand-written recordings in the unit tests. Timestamps are 100 ns per
// sequence number.
#include "src/core/recording.h"

namespace tidemark::core::testing {

inline Block block(uint64_t addr, uint64_t size, uint64_t allocSeq, uint64_t freeSeq) {
  Block b;
  b.address = addr;
  b.sizeBytes = size;
  b.allocSeq = allocSeq;
  b.allocTsNs = static_cast<int64_t>(allocSeq) * 100;
  b.freeSeq = freeSeq;
  b.freeTsNs = freeSeq == kOpenSeq ? 0 : static_cast<int64_t>(freeSeq) * 100;
  return b;
}

inline Tag tag(uint64_t seq, uint64_t addr, Category c) {
  Tag t;
  t.seq = seq;
  t.tsNs = static_cast<int64_t>(seq) * 100;
  t.address = addr;
  t.category = c;
  return t;
}

inline PhaseInterval phase(Phase p, uint64_t begin, uint64_t end) {
  PhaseInterval i;
  i.phase = p;
  i.beginSeq = begin;
  i.endSeq = end;
  return i;
}

}  // namespace tidemark::core::testing
