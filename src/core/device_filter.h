#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "src/core/recording.h"

namespace tidemark::core {

// Which memory a query is about. A GPU job holds host memory (the allocator hooks, pinned memory)
// and device memory (CUPTI's, torch's tensors); its breakdown, peak, steps and timeline can be
// asked for one side: "" or "all" every block, "cpu" host memory, "cuda" every device, "cuda:N"
// device N.
struct DeviceFilter {
  enum class Kind { kAll, kHost, kAnyDevice, kDevice };
  Kind kind = Kind::kAll;
  int32_t device = -1;  // kDevice

  bool all() const { return kind == Kind::kAll; }
  bool keeps(const Block& b) const {
    switch (kind) {
      case Kind::kAll:
        return true;
      case Kind::kHost:
        return b.device < 0;
      case Kind::kAnyDevice:
        return b.device >= 0;
      case Kind::kDevice:
        return b.device == device;
    }
    return true;
  }
  // The filter a text names, or nullopt with *error saying what is accepted.
  static std::optional<DeviceFilter> parse(std::string_view text, std::string* error);
};

// Keeps only the blocks the filter keeps (every other part of the recording stays).
void keepDevice(Recording& recording, const DeviceFilter& filter);

// The advisor's view: it plans what the framework allocates. Where the recording has torch's
// tensor view (blocks of kind TENSOR: a GPU job's tensors), only those blocks stay — the caching
// allocator's slack, memory outside the framework and host memory are not what recomputation
// changes, and a budget is then in tensor bytes, as torch.cuda.max_memory_allocated counts. True
// if blocks were left out.
bool keepTensorLevel(Recording& recording);

}  // namespace tidemark::core
