#include "src/importers/kineto_trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace tidemark::core {

namespace {

using nlohmann::json;

// A string field, or "" when absent or of another type (files are not trusted).
std::string str(const json& e, const char* key) {
  auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Microseconds (Chrome trace "ts"/"dur") to nanoseconds; false for what no trace can hold
// (beyond a hundred years from the epoch, negative durations, NaN).
bool toNs(const json& us, int64_t* ns) {
  const double v = us.get<double>() * 1000.0;
  if (!(v > -3.2e18 && v < 3.2e18)) return false;
  *ns = static_cast<int64_t>(std::llround(v));
  return true;
}

int64_t intArg(const json& args, const char* key, int64_t fallback) {
  auto it = args.find(key);
  if (it == args.end()) return fallback;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number()) {
    // Doubles beyond what an int64 holds (or NaN) are not numbers this file can mean.
    const double d = it->get<double>();
    return d > -9e18 && d < 9e18 ? static_cast<int64_t>(d) : fallback;
  }
  return fallback;
}

bool isOpCategory(const std::string& cat) {
  return cat == "cpu_op" || cat == "Operator" || cat == "operator";
}
bool isKernelCategory(const std::string& cat) { return cat == "kernel" || cat == "Kernel"; }

// A scope with its place in time; begins and ends are emitted from these.
struct Span {
  int64_t beginNs = 0;
  int64_t endNs = 0;
  uint32_t thread = 0;
  bool kernel = false;
  bool module = false;
  std::string name;
};

struct Sortable {
  int64_t tsNs;
  int rank;       // at one moment: ends (0), then begins (1), then memory (2)
  int64_t order;  // ends: later begin first; begins: longer first; memory: file order
  ImportEvent event;
};

}  // namespace

absl::StatusOr<ImportedRecording> importKinetoTrace(std::string_view text) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  const json* events = nullptr;
  if (doc.is_object()) {
    auto it = doc.find("traceEvents");
    if (it != doc.end() && it->is_array()) events = &*it;
  } else if (doc.is_array()) {
    events = &doc;
  }
  if (events == nullptr)
    return absl::InvalidArgumentError("not a Chrome / Kineto trace: no traceEvents list");

  ImportedRecording out;
  out.format = "kineto-trace";
  // Threads: (pid, tid) -> a small number.
  std::map<std::pair<std::string, std::string>, uint32_t> threads;
  auto threadOf = [&](const json& e) {
    auto str = [](const json* v) { return v == nullptr ? std::string() : v->dump(); };
    auto p = e.find("pid");
    auto t = e.find("tid");
    const auto key =
        std::make_pair(str(p == e.end() ? nullptr : &*p), str(t == e.end() ? nullptr : &*t));
    auto [it, inserted] = threads.emplace(key, static_cast<uint32_t>(threads.size() + 1));
    return it->second;
  };

  // Pass 1: which device's memory to take.
  std::map<int64_t, int64_t> memoryPerDevice;  // device (-1: CPU) -> events
  for (const json& e : *events) {
    if (!e.is_object() || str(e, "name") != "[memory]") continue;
    auto a = e.find("args");
    if (a == e.end() || !a->is_object()) continue;
    const int64_t type = intArg(*a, "Device Type", 0);
    const int64_t device = type == 0 ? -1 : intArg(*a, "Device Id", 0);
    ++memoryPerDevice[device];
  }
  // The GPU with the most [memory] events; the CPU when there is none.
  int64_t device = -1;
  int64_t best = 0;
  for (const auto& [d, n] : memoryPerDevice) {
    if (d >= 0 && n > best) {
      device = d;
      best = n;
    }
  }
  if (memoryPerDevice.size() > 1)
    out.notes.push_back(absl::StrCat(
        "memory of ", device < 0 ? std::string("the CPU") : absl::StrCat("device ", device),
        " imported; other devices' [memory] events left out"));

  std::vector<Sortable> all;
  std::vector<Span> spans;
  // Memory: allocs and frees in file order, resolved below.
  struct Mem {
    int64_t tsNs;
    int64_t bytes;
    int64_t addr;  // -1 without Addr
    int64_t totalAllocated;
    int64_t totalReserved;
  };
  std::vector<Mem> memory;
  for (const json& e : *events) {
    if (!e.is_object()) continue;
    const std::string name = str(e, "name");
    auto tsIt = e.find("ts");
    if (tsIt == e.end() || !tsIt->is_number()) continue;
    const std::string cat = str(e, "cat");
    if (name == "[memory]") {
      auto a = e.find("args");
      if (a == e.end() || !a->is_object()) continue;
      const int64_t type = intArg(*a, "Device Type", 0);
      const int64_t dev = type == 0 ? -1 : intArg(*a, "Device Id", 0);
      if (dev != device) continue;
      const int64_t bytes = intArg(*a, "Bytes", 0);
      if (bytes == 0) continue;
      if (bytes > (int64_t{1} << 50) || bytes < -(int64_t{1} << 50))
        return absl::InvalidArgumentError(absl::StrCat("trace: absurd [memory] size ", bytes));
      int64_t tsNs = 0;
      if (!toNs(*tsIt, &tsNs))
        return absl::InvalidArgumentError("trace: a [memory] event has an absurd timestamp");
      memory.push_back({tsNs, bytes, intArg(*a, "Addr", -1), intArg(*a, "Total Allocated", -1),
                        intArg(*a, "Total Reserved", -1)});
      continue;
    }
    if (str(e, "ph") != "X") continue;
    auto durIt = e.find("dur");
    const double dur = durIt != e.end() && durIt->is_number() ? durIt->get<double>() : 0.0;
    // A span longer than a year (or NaN) is not a span.
    if (!(dur >= 0 && dur < 3.2e13)) continue;
    const bool op = isOpCategory(cat);
    const bool kernel = isKernelCategory(cat);
    const bool step = name.rfind("ProfilerStep#", 0) == 0;
    // with_modules: "nn.Module: BertModel_0" python_function events are module scopes.
    const bool module = cat == "python_function" && name.rfind("nn.Module: ", 0) == 0;
    if (!op && !kernel && !step && !module) continue;
    Span s;
    if (!toNs(*tsIt, &s.beginNs))
      return absl::InvalidArgumentError(
          absl::StrCat("trace: '", name, "' has an absurd timestamp"));
    s.endNs = s.beginNs + static_cast<int64_t>(std::llround(dur * 1000.0));
    s.thread = threadOf(e);
    s.kernel = kernel;
    s.module = module;
    s.name = module ? name.substr(11) : name;
    if (step) {
      char* end = nullptr;
      const long long n = std::strtoll(name.c_str() + 13, &end, 10);
      ImportEvent b;
      b.kind = ImportEvent::Kind::kStepBegin;
      b.tsNs = s.beginNs;
      b.step = n;
      ImportEvent en = b;
      en.kind = ImportEvent::Kind::kStepEnd;
      en.tsNs = s.endNs;
      all.push_back({b.tsNs, 1, -(s.endNs - s.beginNs), b});
      all.push_back({en.tsNs, 0, -s.beginNs, en});
      if (!op) continue;  // "ProfilerStep#N" is often a cpu_op too: then also an op
    }
    (module ? out.modules : kernel ? out.kernels : out.ops) += 1;
    spans.push_back(std::move(s));
  }
  for (size_t k = 0; k < spans.size(); ++k) {
    const Span& s = spans[k];
    ImportEvent b;
    b.kind = ImportEvent::Kind::kScopeBegin;
    b.tsNs = s.beginNs;
    b.thread = s.thread;
    b.op = !s.module;
    b.name = s.name;
    ImportEvent en = b;
    en.kind = ImportEvent::Kind::kScopeEnd;
    en.tsNs = s.endNs;
    if (s.kernel) {
      b.kernel = en.kernel = true;
    }
    all.push_back({b.tsNs, 1, -(s.endNs - s.beginNs), b});
    // A span of no length ends after it begins (rank 2), the inner (later) one first.
    if (s.endNs == s.beginNs)
      all.push_back({en.tsNs, 2, -static_cast<int64_t>(k), en});
    else
      all.push_back({en.tsNs, 0, -s.beginNs, en});
  }

  // Memory blocks: pair allocs and frees; what was there before becomes blocks at the start.
  std::sort(memory.begin(), memory.end(),
            [](const Mem& a, const Mem& b) { return a.tsNs < b.tsNs; });
  const int64_t startNs = memory.empty() ? 0 : memory.front().tsNs - 1000;
  uint64_t nextAddress = uint64_t{1} << 60;             // addresses of our own, for the 2021 schema
  std::unordered_map<int64_t, int64_t> live;            // address -> bytes
  std::map<int64_t, std::vector<uint64_t>> liveBySize;  // 2021 schema: size -> addresses
  std::vector<std::pair<uint64_t, int64_t>> before;     // blocks freed, never allocated
  int64_t order = 0, allocatedAtStart = -1, maxTotal = -1, maxReserved = -1;
  std::vector<Sortable> memEvents;
  int64_t lastReserved = -1;
  for (const Mem& m : memory) {
    if (allocatedAtStart < 0 && m.totalAllocated >= 0)
      allocatedAtStart = m.totalAllocated - m.bytes;
    maxTotal = std::max(maxTotal, m.totalAllocated);
    maxReserved = std::max(maxReserved, m.totalReserved);
    ImportEvent ev;
    ev.tsNs = m.tsNs;
    ev.device = static_cast<int32_t>(device);
    if (m.bytes > 0) {
      uint64_t address = m.addr >= 0 ? static_cast<uint64_t>(m.addr) : nextAddress++;
      if (m.addr < 0) liveBySize[m.bytes].push_back(address);
      live[static_cast<int64_t>(address)] = m.bytes;
      ev.kind = ImportEvent::Kind::kAlloc;
      ev.address = address;
      ev.sizeBytes = static_cast<uint64_t>(m.bytes);
    } else {
      uint64_t address = 0;
      if (m.addr >= 0) {
        address = static_cast<uint64_t>(m.addr);
      } else {
        auto it = liveBySize.find(-m.bytes);
        if (it != liveBySize.end() && !it->second.empty()) {
          address = it->second.back();
          it->second.pop_back();
        } else {
          address = nextAddress++;
        }
      }
      if (!live.erase(static_cast<int64_t>(address))) before.push_back({address, -m.bytes});
      ev.kind = ImportEvent::Kind::kFree;
      ev.address = address;
    }
    memEvents.push_back({ev.tsNs, 3, order++, ev});
    if (m.totalReserved >= 0 && m.totalReserved != lastReserved) {
      lastReserved = m.totalReserved;
      ImportEvent c;
      c.kind = ImportEvent::Kind::kCounter;
      c.tsNs = m.tsNs;
      c.name = "reserved_bytes";
      c.value = m.totalReserved;
      memEvents.push_back({c.tsNs, 3, order++, c});
    }
  }
  int64_t beforeBytes = 0;
  for (const auto& [address, bytes] : before) beforeBytes += bytes;
  // The rest of what Total Allocated says was there at the start.
  if (allocatedAtStart > beforeBytes)
    before.push_back({nextAddress++, allocatedAtStart - beforeBytes});
  int64_t k = 0;
  for (const auto& [address, bytes] : before) {
    ImportEvent a;
    a.kind = ImportEvent::Kind::kAlloc;
    a.tsNs = startNs;
    a.address = address;
    a.sizeBytes = static_cast<uint64_t>(bytes);
    a.device = static_cast<int32_t>(device);
    ImportEvent t = a;
    t.kind = ImportEvent::Kind::kTag;
    t.category = Category::kUnknown;
    t.name = "[before the trace]";
    all.push_back({startNs, 3, -1'000'000'000 + k++, a});
    all.push_back({startNs, 3, -1'000'000'000 + k++, t});
  }
  for (Sortable& s : memEvents) all.push_back(std::move(s));
  out.statedPeakBytes = maxTotal;
  out.reservedBytes = maxReserved;
  out.preexistingBytes = std::max<int64_t>(allocatedAtStart, beforeBytes);
  if (memory.empty()) out.notes.push_back("no [memory] events (profile_memory was off)");

  std::stable_sort(all.begin(), all.end(), [](const Sortable& a, const Sortable& b) {
    if (a.tsNs != b.tsNs) return a.tsNs < b.tsNs;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.order < b.order;
  });
  out.events.reserve(all.size());
  for (Sortable& s : all) out.events.push_back(std::move(s.event));
  return out;
}

}  // namespace tidemark::core
