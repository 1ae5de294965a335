#pragma once

#include <cstdint>
#include <utility>

namespace tidemark::core {

// What names a live block: its memory kind (a tensor starts at its segment's address), its
// device (device addresses are per device) and its address. Hashable by absl's containers.
struct BlockKey {
  int32_t kind;
  int32_t device;
  uint64_t address;
  bool operator==(const BlockKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.kind, k.device, k.address);
  }
};

}  // namespace tidemark::core
