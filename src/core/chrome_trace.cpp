#include "src/core/chrome_trace.h"

#include <cstdio>

namespace tidemark::core {

namespace {

std::string jsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1000.0);
  return buf;
}

// Pseudo thread ids for the tracks that are not threads.
constexpr int64_t kPhaseTrack = 1'000'000'001;
constexpr int64_t kStepTrack = 1'000'000'002;
constexpr int64_t kKernelTrackBase = 2'000'000'000;  // + the stream

}  // namespace

void writeChromeTrace(const Recording& rec, const Timeline& timeline, int64_t startTsNs,
                      const std::string& processName,
                      const std::function<void(std::string_view)>& write,
                      size_t maxCounterSamples) {
  std::string buf;
  bool first = true;
  auto event = [&](const std::string& e) {
    buf += first ? "\n" : ",\n";
    buf += e;
    first = false;
    if (buf.size() > (1u << 20)) {
      write(buf);
      buf.clear();
    }
  };
  buf = "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [";
  event("{\"ph\": \"M\", \"pid\": 1, \"name\": \"process_name\", \"args\": {\"name\": \"" +
        jsonEscape(processName) + "\"}}");
  event("{\"ph\": \"M\", \"pid\": 1, \"tid\": " + std::to_string(kPhaseTrack) +
        ", \"name\": \"thread_name\", \"args\": {\"name\": \"phases\"}}");
  event("{\"ph\": \"M\", \"pid\": 1, \"tid\": " + std::to_string(kStepTrack) +
        ", \"name\": \"thread_name\", \"args\": {\"name\": \"steps\"}}");

  // Counters: the finest level that is small enough.
  const TimelineLevel* level = nullptr;
  for (const TimelineLevel& l : timeline.levels) {
    if (l.samples.size() <= maxCounterSamples) {
      level = &l;
      break;
    }
  }
  if (level != nullptr) {
    for (const TimelineSample& s : level->samples) {
      std::string args;
      for (int c = 0; c < kCategoryCount; ++c) {
        args += std::string(c ? ", " : "") + "\"" +
                std::string(categoryName(kAllCategories[static_cast<size_t>(c)])) +
                "\": " + std::to_string(s.last[c + 1]);
      }
      event("{\"ph\": \"C\", \"pid\": 1, \"name\": \"memory (bytes)\", \"ts\": " +
            micros(s.lastTsNs - startTsNs) + ", \"args\": {" + args + "}}");
    }
  }
  auto complete = [&](const std::string& name, int64_t tid, int64_t begin, int64_t end,
                      const char* cat) {
    event("{\"ph\": \"X\", \"pid\": 1, \"tid\": " + std::to_string(tid) + ", \"name\": \"" +
          jsonEscape(name) + "\", \"cat\": \"" + cat + "\", \"ts\": " + micros(begin - startTsNs) +
          ", \"dur\": " + micros(end - begin) + "}");
  };
  for (const ScopeInterval& s : rec.scopes) {
    if (s.endSeq != kOpenSeq) complete(s.name, s.threadId, s.beginTsNs, s.endTsNs, "module");
  }
  for (const ScopeInterval& s : rec.ops) {
    if (s.endSeq != kOpenSeq) complete(s.name, s.threadId, s.beginTsNs, s.endTsNs, "op");
  }
  // Kernels on tracks of their own: their thread id is the GPU stream.
  for (const ScopeInterval& s : rec.kernels) {
    if (s.endSeq != kOpenSeq)
      complete(s.name, kKernelTrackBase + s.threadId, s.beginTsNs, s.endTsNs, "kernel");
  }
  for (const PhaseInterval& p : rec.phases) {
    if (p.endSeq != kOpenSeq) {
      complete(std::string(phaseName(p.phase)), kPhaseTrack, p.beginTsNs, p.endTsNs, "phase");
    }
  }
  for (const StepInterval& s : rec.steps) {
    if (s.endSeq != kOpenSeq) {
      complete("step " + std::to_string(s.step), kStepTrack, s.beginTsNs, s.endTsNs, "step");
    }
  }
  buf += "\n]}\n";
  write(buf);
}

}  // namespace tidemark::core
