// libFuzzer target: any bytes into the Kineto trace importer (JSON in, events or an error out).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/importers/kineto_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)tidemark::core::importKinetoTrace(text);
  return 0;
}
