#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "src/core/recording.h"
#include "src/core/timeline.h"

namespace tidemark::core {

// Writes a recording as a Chrome trace (JSON object format), which Perfetto and chrome://tracing
// open: a "memory" counter track per category (bytes at the end of each timeline sample, from the
// finest level with at most maxCounterSamples samples), module scopes as complete events on their
// threads, and phases and steps on tracks of their own. Timestamps are microseconds from the
// session's start. Output goes to `write` in pieces.
void writeChromeTrace(const Recording& recording, const Timeline& timeline, int64_t startTsNs,
                      const std::string& processName,
                      const std::function<void(std::string_view)>& write,
                      size_t maxCounterSamples = 200000);

}  // namespace tidemark::core
