#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "src/core/category.h"

namespace tidemark::core {

// Sequence numbers order every event of one process. kOpenSeq marks an interval that was
// still open when the recording ended (a block live at the end, a phase never closed).
inline constexpr uint64_t kOpenSeq = std::numeric_limits<uint64_t>::max();

// Where a block's memory comes from (tidemark.v1.MemoryKind).
enum class MemoryKind : uint8_t {
  kHost = 1,    // the host allocator (malloc and friends)
  kDevice = 2,  // the device driver (cudaMalloc, cuMemMap, ...)
  kTensor = 3,  // a framework's caching allocator, inside a block of another kind (a segment)
};
inline MemoryKind memoryKindFromWire(int64_t wire) {
  return wire == 2 ? MemoryKind::kDevice : wire == 3 ? MemoryKind::kTensor : MemoryKind::kHost;
}

// One allocated block with its lifetime: alloc at allocSeq, free at freeSeq (or kOpenSeq).
struct Block {
  int64_t id = 0;
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  MemoryKind kind = MemoryKind::kHost;
  int32_t device = -1;
  uint32_t threadId = 0;
  uint64_t allocSeq = 0;
  int64_t allocTsNs = 0;
  uint64_t freeSeq = kOpenSeq;
  int64_t freeTsNs = 0;  // meaningless while freeSeq == kOpenSeq
  bool live() const { return freeSeq == kOpenSeq; }
};

// A framework tag: "the block at address, at the moment seq, is a <category> named name".
struct Tag {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  Category category = Category::kUnknown;
  std::string name;
};

// A closed-open stretch of the recording in sequence order: [beginSeq, endSeq).
struct Interval {
  uint64_t beginSeq = 0;
  uint64_t endSeq = kOpenSeq;
  int64_t beginTsNs = 0;
  int64_t endTsNs = 0;
  bool contains(uint64_t seq) const { return seq >= beginSeq && seq < endSeq; }
};

struct PhaseInterval : Interval {
  Phase phase = Phase::kNone;
  uint32_t threadId = 0;
};

struct StepInterval : Interval {
  int64_t step = 0;
  bool inferred = false;  // found by step inference (step_inference.h), not marked
};

struct ScopeInterval : Interval {
  std::string name;
  uint32_t threadId = 0;
  int depth = 0;
  bool isOp = false;           // a framework op ("aten::mm") rather than a module
  bool isKernel = false;       // a GPU kernel (threadId is its stream)
  uint32_t correlationId = 0;  // kernels: the CUDA call that launched it (0 unknown)
};

// A CUDA call that launched GPU work, on the launching thread (GPU capture).
struct Launch {
  uint32_t correlationId = 0;
  uint32_t threadId = 0;
  uint64_t seq = 0;
};

// Everything the analysis needs about one session, as read from the store.
struct Recording {
  std::vector<Block> blocks;           // any order
  std::vector<Tag> tags;               // any order
  std::vector<PhaseInterval> phases;   // any order; they may nest (recompute inside backward)
  std::vector<StepInterval> steps;     // any order
  std::vector<ScopeInterval> scopes;   // module scopes, any order
  std::vector<ScopeInterval> ops;      // op scopes (tidemark_op_begin/end), any order
  std::vector<ScopeInterval> kernels;  // GPU kernels, any order
  std::vector<Launch> launches;        // the CUDA calls that launched them, any order

  // Sorts every vector by its begin sequence number; the analysis functions expect this.
  void sortBySeq();
  // The recording as it stood just before sequence number `seq`: what began at or after it
  // goes, what ended at or after it is open again (a live session read at one cut of its
  // stream, with rows of later events already in the store).
  void clipBefore(uint64_t seq);
  const StepInterval* findStep(int64_t step) const;
  // The innermost phase / scope open at seq, or nullptr.
  const PhaseInterval* phaseAt(uint64_t seq) const;
  const ScopeInterval* scopeAt(uint64_t seq) const;
  // The step whose interval contains seq, or nullptr.
  const StepInterval* stepAt(uint64_t seq) const;
};

}  // namespace tidemark::core
