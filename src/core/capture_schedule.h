#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tidemark::core {

// Which training steps a capture schedule records in full detail; the others are summarized
// (agent/capture/capture_filter.h). Steps are the adapter's numbers (the first step is 1).
//   --steps 3-4,10      ranges and single steps
//   --every 500 --window 3   steps 1-3, 501-503, 1001-1003, ...: a window every N steps
// Without a schedule every step is in full detail (the default).
class CaptureSchedule {
 public:
  // "3-4", "3-4,10,20-25". Error text (empty on success) in *error.
  static std::optional<CaptureSchedule> parseSteps(std::string_view text, std::string* error);
  // every >= 1, 1 <= window <= every.
  static std::optional<CaptureSchedule> everyWindow(uint64_t every, uint64_t window,
                                                    std::string* error);

  // From the settings as text (TIDEMARK_CAPTURE_STEPS, _EVERY, _WINDOW, or attach's capture_*
  // lines): none set is no schedule (and no error); steps and every together are an error.
  static std::optional<CaptureSchedule> fromSettings(std::string_view steps, std::string_view every,
                                                     std::string_view window, std::string* error);

  bool detailed(int64_t step) const;
  std::string describe() const;

 private:
  std::vector<std::pair<int64_t, int64_t>> m_ranges;  // inclusive, sorted
  uint64_t m_every = 0;
  uint64_t m_window = 0;
};

}  // namespace tidemark::core
