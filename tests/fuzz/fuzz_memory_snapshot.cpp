// libFuzzer target: any bytes into the pickle reader and the memory-snapshot importer. They must
// answer with a value or an error, never crash, hang or read out of bounds (built with ASan).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/importers/memory_snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)tidemark::core::importMemorySnapshot(bytes);
  return 0;
}
