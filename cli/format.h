#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tidemark::cli {

// "1.50 GiB", "12.0 MiB", "512 B".
std::string humanBytes(int64_t bytes);
// 1234567 -> "1,234,567".
std::string groupDigits(int64_t n);
// A JSON string literal, quoted and escaped.
std::string jsonString(std::string_view s);
// "12.3 ms" from nanoseconds.
std::string msText(int64_t ns);
// "2026-11-29 09:05:49" (UTC) from nanoseconds since the epoch.
std::string wallTime(int64_t wallNs);

}  // namespace tidemark::cli
