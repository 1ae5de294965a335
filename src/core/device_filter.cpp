#include "src/core/device_filter.h"

#include <algorithm>
#include <charconv>

namespace tidemark::core {

std::optional<DeviceFilter> DeviceFilter::parse(std::string_view text, std::string* error) {
  DeviceFilter f;
  if (text.empty() || text == "all") return f;
  if (text == "cpu" || text == "host") {
    f.kind = Kind::kHost;
    return f;
  }
  if (text == "cuda" || text == "gpu") {
    f.kind = Kind::kAnyDevice;
    return f;
  }
  constexpr std::string_view kPrefix = "cuda:";
  if (text.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view number = text.substr(kPrefix.size());
    int32_t device = -1;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), device);
    if (ec == std::errc() && end == number.data() + number.size() && !number.empty() &&
        device >= 0) {
      f.kind = Kind::kDevice;
      f.device = device;
      return f;
    }
  }
  if (error != nullptr)
    *error = "unknown device '" + std::string(text) + "' (all, cpu, cuda or cuda:N)";
  return std::nullopt;
}

void keepDevice(Recording& rec, const DeviceFilter& filter) {
  if (filter.all()) return;
  rec.blocks.erase(std::remove_if(rec.blocks.begin(), rec.blocks.end(),
                                  [&](const Block& b) { return !filter.keeps(b); }),
                   rec.blocks.end());
}

bool keepTensorLevel(Recording& rec) {
  const bool tensors = std::any_of(rec.blocks.begin(), rec.blocks.end(),
                                   [](const Block& b) { return b.kind == MemoryKind::kTensor; });
  if (!tensors) return false;
  rec.blocks.erase(std::remove_if(rec.blocks.begin(), rec.blocks.end(),
                                  [](const Block& b) { return b.kind != MemoryKind::kTensor; }),
                   rec.blocks.end());
  return true;
}

}  // namespace tidemark::core
