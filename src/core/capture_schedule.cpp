#include "src/core/capture_schedule.h"

#include <algorithm>
#include <charconv>

namespace tidemark::core {

namespace {
bool parseStep(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= 1;
}
}  // namespace

std::optional<CaptureSchedule> CaptureSchedule::parseSteps(std::string_view text,
                                                           std::string* error) {
  CaptureSchedule schedule;
  std::string_view rest = text;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t dash = item.find('-');
    int64_t first = 0;
    int64_t last = 0;
    const bool ok = dash == std::string_view::npos
                        ? parseStep(item, &first) && parseStep(item, &last)
                        : parseStep(item.substr(0, dash), &first) &&
                              parseStep(item.substr(dash + 1), &last) && first <= last;
    if (!ok) {
      *error = "steps '" + std::string(text) + "': expected steps or ranges of steps from 1, " +
               "as 3-4 or 3-4,10 (\"" + std::string(item) + "\" is not one)";
      return std::nullopt;
    }
    schedule.m_ranges.emplace_back(first, last);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  std::sort(schedule.m_ranges.begin(), schedule.m_ranges.end());
  error->clear();
  return schedule;
}

std::optional<CaptureSchedule> CaptureSchedule::everyWindow(uint64_t every, uint64_t window,
                                                            std::string* error) {
  if (every < 1 || window < 1 || window > every) {
    *error = "--every N --window W: expected 1 <= W <= N (got N=" + std::to_string(every) +
             ", W=" + std::to_string(window) + ")";
    return std::nullopt;
  }
  CaptureSchedule schedule;
  schedule.m_every = every;
  schedule.m_window = window;
  error->clear();
  return schedule;
}

std::optional<CaptureSchedule> CaptureSchedule::fromSettings(std::string_view steps,
                                                             std::string_view every,
                                                             std::string_view window,
                                                             std::string* error) {
  error->clear();
  if (!steps.empty()) {
    if (!every.empty() || !window.empty()) {
      *error = "steps and every/window are two schedules: give one";
      return std::nullopt;
    }
    return parseSteps(steps, error);
  }
  if (every.empty() && window.empty()) return std::nullopt;
  int64_t n = 0;
  int64_t w = 1;
  if (!parseStep(every, &n) || (!window.empty() && !parseStep(window, &w))) {
    *error = "every '" + std::string(every) + "', window '" + std::string(window) +
             "': expected whole numbers from 1";
    return std::nullopt;
  }
  return everyWindow(static_cast<uint64_t>(n), static_cast<uint64_t>(w), error);
}

bool CaptureSchedule::detailed(int64_t step) const {
  if (m_every != 0) {
    return step >= 1 && static_cast<uint64_t>(step - 1) % m_every < m_window;
  }
  for (const auto& [first, last] : m_ranges)
    if (step >= first && step <= last) return true;
  return false;
}

std::string CaptureSchedule::describe() const {
  if (m_every != 0) {
    return "steps " + std::to_string(m_window) + " of every " + std::to_string(m_every) +
           " in full detail";
  }
  std::string out = "steps ";
  for (size_t i = 0; i < m_ranges.size(); ++i) {
    if (i != 0) out += ",";
    out += std::to_string(m_ranges[i].first);
    if (m_ranges[i].second != m_ranges[i].first) out += "-" + std::to_string(m_ranges[i].second);
  }
  return out + " in full detail";
}

}  // namespace tidemark::core
