#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/category.h"

namespace tidemark::core {

// The largest block an imported file may hold: 4 TiB, more than any device or host gives one
// allocation; a larger size is a corrupt file, refused.
constexpr int64_t kMaxImportedBlockBytes = int64_t{1} << 42;

// A recording made by another tool, turned into tidemark's events in time order: what
// `tidemark import` sends to tidemarkd through the Ingest API, as if an agent had recorded it.
struct ImportEvent {
  enum class Kind {
    kAlloc,
    kFree,
    kTag,
    kScopeBegin,
    kScopeEnd,
    kStepBegin,
    kStepEnd,
    kCounter,
    kStack,  // name: the allocating frames, one per line, innermost first
  };
  Kind kind = Kind::kAlloc;
  int64_t tsNs = 0;
  uint32_t thread = 0;
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  int32_t device = -1;  // -1: host memory
  uint64_t stream = 0;
  Category category = Category::kUnknown;  // kTag
  bool op = false;                         // scopes: an op rather than a module
  bool kernel = false;                     // scopes: a GPU kernel (thread = its stream)
  int64_t step = 0;
  int64_t value = 0;  // kCounter (name: "reserved_bytes")
  std::string name;   // tag, scope, stack
};

struct ImportedRecording {
  std::string format;               // "pytorch-memory-snapshot", "kineto-trace"
  std::vector<ImportEvent> events;  // in time order
  // Figures the file states, for the summary and the checks.
  int64_t reservedBytes = -1;        // reserved by the caching allocator (at dump / maximum)
  int64_t allocatedAtEndBytes = -1;  // allocated at the dump
  int64_t statedPeakBytes = -1;      // the file's own figure for the peak (Total Allocated)
  int64_t preexistingBytes = 0;      // allocated before the recording began (blocks at its start)
  int64_t kernels = 0;
  int64_t ops = 0;
  int64_t modules = 0;
  std::vector<std::string> notes;  // what could not be used, and why
};

}  // namespace tidemark::core
