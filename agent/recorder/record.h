#pragma once

#include <cstdint>

namespace tidemark::agent {

// The fixed-size record a hook or a C entry copies into its thread's ring. Plain data: the hot
// path writes it with stores only; the drain thread turns it into protobuf.
enum class RecordKind : uint8_t {
  kAlloc = 1,
  kFree = 2,
  kScopeBegin = 3,
  kScopeEnd = 4,
  kPhaseBegin = 5,
  kPhaseEnd = 6,
  kStepBegin = 7,  // sizeBytes: how many numbers right after its own it reserves (the capture
                   // filter's restated blocks go under them)
  kStepEnd = 8,
  kTag = 9,
  kCounter = 10,  // nameIid, the value in sizeBytes (as int64)
  kLaunch = 11,   // the CUDA call launching GPU work: its correlation id in address
  // Made by the capture filter (agent/capture), never by a hook:
  kSummarized = 12,   // the records seq..address were summarized, not sent (small 1: the
                      // numbers were reserved and not used)
  kStepSummary = 13,  // one figure of a summarized step: the step in address, the figure in
                      // small, its category in reserved, the value in sizeBytes (as int64)
  kStack = 14,        // the allocating stack of the block at address: frames in nameIid
};
// kAlloc's reserved: sent again when full detail began (v1.Alloc.restated).
inline constexpr uint16_t kAllocRestated = 1;
// kTag's small for a native library's own memory (tidemark.v1.CATEGORY_WORKSPACE).
inline constexpr uint8_t kCategoryWorkspace = 9;

struct Record {
  RecordKind kind;
  uint8_t small;      // category (kTag), phase (kPhase*), memory kind (kAlloc/kFree),
                      // scope kind (kScope*: 0 module, 1 op, 2 kernel)
  uint16_t reserved;  // kAlloc: kAllocRestated; kStepSummary: the category
  uint32_t threadId;
  uint64_t seq;  // the collector's number (dense, in the order things happened); in a ring, before
                 // the collector numbered it, the time it was pushed (Recorder::drainAll)
  int64_t tsNs;
  uint64_t address;    // kAlloc/kFree/kTag; the step number for kStep*; the correlation id
                       // for kLaunch and kernel kScopeBegin
  uint64_t sizeBytes;  // kAlloc/kTag
  uint32_t nameIid;    // kScope*/kTag/kStack
  int32_t device;      // -1 for host memory
};
static_assert(sizeof(Record) == 48, "keep records small: they are copied on the hot path");

// The layout above as files carry it (v1.RawRecords.layout): raised whenever a field, its place
// or a kind's meaning changes, so that a reader of another build refuses what it would misread.
inline constexpr uint32_t kRecordLayout = 1;

}  // namespace tidemark::agent
