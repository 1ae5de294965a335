#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/core/timeline.h"

namespace tidemark::core {

// Timeline samples as stored: 40 little-endian int64 a sample (see server/store/schema.sql).
inline constexpr size_t kEncodedSampleBytes = 40 * 8;
std::string encodeSamples(const TimelineSample* samples, size_t count);
// False if the bytes are not a whole number of samples.
bool decodeSamples(std::string_view bytes, std::vector<TimelineSample>* out);

}  // namespace tidemark::core
