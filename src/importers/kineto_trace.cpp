#include "src/importers/kineto_trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

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
// (beyond a hundred years from the epoch, NaN). Integer microseconds convert exactly (a double
// holds epoch nanoseconds only to 256 ns); fractional ones as whole microseconds plus the
// fraction's nanoseconds, as exactly as the file's double holds them.
bool toNs(const json& us, int64_t* ns) {
  constexpr int64_t kMaxUs = 3'200'000'000'000'000;
  if (us.is_number_unsigned()) {
    const uint64_t v = us.get<uint64_t>();
    if (v >= static_cast<uint64_t>(kMaxUs)) return false;
    *ns = static_cast<int64_t>(v) * 1000;
    return true;
  }
  if (us.is_number_integer()) {
    const int64_t v = us.get<int64_t>();
    if (v >= kMaxUs || v <= -kMaxUs) return false;
    *ns = v * 1000;
    return true;
  }
  const double v = us.get<double>();
  if (!(v > -3.2e15 && v < 3.2e15)) return false;
  const double whole = std::floor(v);
  *ns = static_cast<int64_t>(whole) * 1000 + std::llround((v - whole) * 1000.0);
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
// An op of autograd's backward: "autograd::engine::evaluate_function: MmBackward0" (newer
// traces), the node itself ("CudnnConvolutionBackward", "ReluBackward1"; 2021 traces), or
// "torch::autograd::AccumulateGrad".
bool isBackwardOp(const std::string& name) {
  if (name.rfind("autograd::engine::evaluate_function: ", 0) == 0) return true;
  if (name.find("AccumulateGrad") != std::string::npos) return true;
  if (name.find("::") != std::string::npos) return false;  // aten::*_backward run inside a node
  size_t end = name.size();
  while (end > 0 && name[end - 1] >= '0' && name[end - 1] <= '9') --end;
  constexpr std::string_view kNode = "Backward";
  return end > kNode.size() && name.compare(end - kNode.size(), kNode.size(), kNode) == 0;
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

struct TimeSpan {
  int64_t beginNs = 0;
  int64_t endNs = 0;
};

// Spans merged into disjoint ones, sorted, for "is this moment inside one".
class SpanSet {
 public:
  explicit SpanSet(std::vector<TimeSpan> spans) {
    std::sort(spans.begin(), spans.end(),
              [](const TimeSpan& a, const TimeSpan& b) { return a.beginNs < b.beginNs; });
    for (const TimeSpan& s : spans) {
      if (!m_spans.empty() && s.beginNs <= m_spans.back().endNs)
        m_spans.back().endNs = std::max(m_spans.back().endNs, s.endNs);
      else
        m_spans.push_back(s);
    }
  }
  // The span holding tsNs (its begin inclusive, end exclusive), or nullptr.
  const TimeSpan* find(int64_t tsNs) const {
    auto it = std::upper_bound(m_spans.begin(), m_spans.end(), tsNs,
                               [](int64_t t, const TimeSpan& s) { return t < s.beginNs; });
    if (it == m_spans.begin()) return nullptr;
    --it;
    return tsNs < it->endNs ? &*it : nullptr;
  }
  bool empty() const { return m_spans.empty(); }

 private:
  std::vector<TimeSpan> m_spans;
};

enum class LoopPhase { kNone, kForward, kBackward, kOptimizer, kZeroGrad };

// What the training loop was doing at each moment, from what the trace says: the CPU's
// ProfilerStep#N annotations, the optimizer's Optimizer.step# / Optimizer.zero_grad#
// annotations and autograd's "autograd::engine::evaluate_function: ..." ops (the backward).
// A step's backward runs from its first backward op to its last; its forward from the step's
// begin to there (the whole step when it has none: a forward-only trace).
struct LoopPhases {
  std::vector<TimeSpan> steps, optimizer, zeroGrad, backward;
  std::map<uint32_t, std::vector<TimeSpan>> accumulateGrad;  // per thread

  struct Resolved {
    SpanSet steps, optimizer, zeroGrad, backwardOps;
    std::map<uint32_t, SpanSet> accumulateGrad;
  };
  Resolved resolve() const {
    Resolved r{SpanSet(steps), SpanSet(optimizer), SpanSet(zeroGrad), SpanSet(backward), {}};
    for (const auto& [thread, spans] : accumulateGrad) r.accumulateGrad.emplace(thread, spans);
    return r;
  }
};

LoopPhase phaseAt(const LoopPhases::Resolved& r, const std::map<int64_t, TimeSpan>& stepBackward,
                  int64_t tsNs) {
  if (r.optimizer.find(tsNs)) return LoopPhase::kOptimizer;
  if (r.zeroGrad.find(tsNs)) return LoopPhase::kZeroGrad;
  if (r.backwardOps.find(tsNs)) return LoopPhase::kBackward;
  const TimeSpan* step = r.steps.find(tsNs);
  if (step == nullptr) return LoopPhase::kNone;
  auto b = stepBackward.find(step->beginNs);
  if (b == stepBackward.end() || tsNs < b->second.beginNs) return LoopPhase::kForward;
  return tsNs < b->second.endNs ? LoopPhase::kBackward : LoopPhase::kNone;
}

// A block's category from when it was allocated and freed (docs in kineto_trace.h).
struct Verdict {
  Category category = Category::kUnknown;
  const char* rule = nullptr;  // nullptr: no tag
};

Verdict classifyBlock(LoopPhase allocated, bool accumulateGrad, bool freed, LoopPhase freedIn,
                      bool sameStep) {
  if (accumulateGrad) return {Category::kGradient, "[AccumulateGrad]"};
  switch (allocated) {
    case LoopPhase::kForward:
      if (freed && freedIn == LoopPhase::kForward && sameStep)
        return {Category::kTemporary, "[forward, freed in forward]"};
      if (freed && freedIn == LoopPhase::kBackward)
        return {Category::kActivation, "[forward, freed in backward]"};
      return {Category::kActivation, "[forward, kept past it]"};
    case LoopPhase::kBackward:
      if (freed && freedIn == LoopPhase::kBackward && sameStep)
        return {Category::kTemporary, "[backward, freed in backward]"};
      return {Category::kGradient, "[backward, kept past it]"};
    case LoopPhase::kOptimizer:
      if (freed && freedIn == LoopPhase::kOptimizer && sameStep)
        return {Category::kTemporary, "[optimizer, freed in it]"};
      return {Category::kOptimizerState, "[optimizer, kept past it]"};
    default:
      return {};
  }
}

// A block allocated before the trace and freed in it: what freed it says what it was.
Verdict classifyBefore(LoopPhase freedIn) {
  switch (freedIn) {
    case LoopPhase::kZeroGrad:
      return {Category::kGradient, "[before the trace, freed by zero_grad]"};
    case LoopPhase::kOptimizer:
      return {Category::kOptimizerState, "[before the trace, replaced by the optimizer]"};
    case LoopPhase::kBackward:
      return {Category::kActivation, "[before the trace, freed in backward]"};
    default:
      return {Category::kUnknown, "[before the trace]"};
  }
}

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
    // "25738" and 25738 name one thread (the 2021 schema writes ops' ids as strings).
    auto str = [](const json* v) {
      if (v == nullptr) return std::string();
      return v->is_string() ? v->get<std::string>() : v->dump();
    };
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
  LoopPhases phases;
  // Memory: allocs and frees in file order, resolved below.
  struct Mem {
    uint32_t thread;
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
      // A size that is not a whole number of bytes an int64 holds is a corrupt event.
      auto b = a->find("Bytes");
      if (b != a->end() && b->is_number() && !b->is_number_integer() &&
          !(b->get<double>() > -9e18 && b->get<double>() < 9e18))
        return absl::InvalidArgumentError(absl::StrCat("trace: absurd [memory] size ", b->dump()));
      const int64_t bytes = intArg(*a, "Bytes", 0);
      if (bytes == 0) continue;
      if (bytes > kMaxImportedBlockBytes || bytes < -kMaxImportedBlockBytes)
        return absl::InvalidArgumentError(
            absl::StrCat("trace: absurd [memory] size ", bytes, " (at most 4 TiB a block)"));
      int64_t tsNs = 0;
      if (!toNs(*tsIt, &tsNs))
        return absl::InvalidArgumentError("trace: a [memory] event has an absurd timestamp");
      memory.push_back({threadOf(e), tsNs, bytes, intArg(*a, "Addr", -1),
                        intArg(*a, "Total Allocated", -1), intArg(*a, "Total Reserved", -1)});
      continue;
    }
    if (str(e, "ph") != "X") continue;
    auto durIt = e.find("dur");
    int64_t durNs = 0;
    // A span longer than a year (or negative, or NaN) is not a span.
    if (durIt != e.end() && durIt->is_number() &&
        (!toNs(*durIt, &durNs) || durNs < 0 || durNs > int64_t{31'600'000} * 1'000'000'000))
      continue;
    const bool op = isOpCategory(cat);
    const bool kernel = isKernelCategory(cat);
    // The CPU's step annotation; its gpu_user_annotation twin spans the step's GPU work.
    const bool gpuSide = cat.rfind("gpu_", 0) == 0;
    const bool step = !gpuSide && name.rfind("ProfilerStep#", 0) == 0;
    // with_modules: "nn.Module: BertModel_0" python_function events are module scopes.
    const bool module = cat == "python_function" && name.rfind("nn.Module: ", 0) == 0;
    // What the training loop was doing: the optimizer's annotations, autograd's backward ops.
    const bool optimizerStep = !gpuSide && name.rfind("Optimizer.step#", 0) == 0;
    const bool zeroGrad = !gpuSide && name.rfind("Optimizer.zero_grad#", 0) == 0;
    const bool backwardOp = op && isBackwardOp(name);
    if (!op && !kernel && !step && !module && !optimizerStep && !zeroGrad) continue;
    Span s;
    if (!toNs(*tsIt, &s.beginNs))
      return absl::InvalidArgumentError(
          absl::StrCat("trace: '", name, "' has an absurd timestamp"));
    s.endNs = s.beginNs + durNs;
    s.thread = threadOf(e);
    if (optimizerStep || zeroGrad) {
      (optimizerStep ? phases.optimizer : phases.zeroGrad).push_back({s.beginNs, s.endNs});
      if (!op) continue;
    }
    if (backwardOp) {
      phases.backward.push_back({s.beginNs, s.endNs});
      if (name.find("AccumulateGrad") != std::string::npos)
        phases.accumulateGrad[s.thread].push_back({s.beginNs, s.endNs});
    }
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
      phases.steps.push_back({s.beginNs, s.endNs});
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

  // What the loop was doing: each step's backward runs from its first backward op to its last.
  const LoopPhases::Resolved loop = phases.resolve();
  std::map<int64_t, TimeSpan> stepBackward;  // merged step's begin -> its backward's extent
  for (const TimeSpan& op : phases.backward) {
    const TimeSpan* step = loop.steps.find(op.beginNs);
    if (step == nullptr) continue;
    auto [it, inserted] = stepBackward.emplace(step->beginNs, op);
    it->second.beginNs = std::min(it->second.beginNs, op.beginNs);
    it->second.endNs = std::max(it->second.endNs, op.endNs);
  }
  auto phaseOf = [&](int64_t tsNs) { return phaseAt(loop, stepBackward, tsNs); };
  auto stepOf = [&](int64_t tsNs) {
    const TimeSpan* step = loop.steps.find(tsNs);
    return step == nullptr ? int64_t{-1} : step->beginNs;
  };

  // Memory blocks: pair allocs and frees; what was there before becomes blocks at the start.
  std::sort(memory.begin(), memory.end(),
            [](const Mem& a, const Mem& b) { return a.tsNs < b.tsNs; });
  const int64_t startNs = memory.empty() ? 0 : memory.front().tsNs - 1000;
  uint64_t nextAddress = uint64_t{1} << 60;  // addresses of our own, for the 2021 schema
  struct Block {
    int64_t order;  // of its alloc among memEvents
    uint32_t thread;
    int64_t allocNs;
    int64_t bytes;
    bool freed = false;
    int64_t freeNs = 0;
  };
  std::vector<Block> blocks;
  std::unordered_map<int64_t, size_t> live;             // address -> its block
  std::map<int64_t, std::vector<uint64_t>> liveBySize;  // 2021 schema: size -> addresses
  struct Before {
    uint64_t address;
    int64_t bytes;
    Verdict verdict;
  };
  std::vector<Before> before;  // blocks freed, never allocated
  int64_t order = 0, allocatedAtStart = -1, maxTotal = -1, maxReserved = -1;
  std::vector<Sortable> memEvents;
  int64_t lastReserved = -1;
  // Repeated events (a trace merged twice, say) would count memory twice: an alloc of an address
  // live with that size, a free of an address already freed; without Addr, the previous event
  // again (same moment, size, thread and Total Allocated). Left out, and said.
  std::unordered_set<int64_t> freedInTrace;
  int64_t repeated = 0;
  const Mem* previous = nullptr;
  for (const Mem& m : memory) {
    const Mem* last = previous;
    previous = &m;
    if (m.addr >= 0) {
      auto l = live.find(m.addr);
      const bool again = m.bytes > 0 ? l != live.end() && blocks[l->second].bytes == m.bytes
                                     : l == live.end() && freedInTrace.count(m.addr) > 0;
      if (again) {
        ++repeated;
        continue;
      }
      if (m.bytes > 0)
        freedInTrace.erase(m.addr);
      else
        freedInTrace.insert(m.addr);
    } else if (last != nullptr && m.totalAllocated >= 0 && m.tsNs == last->tsNs &&
               m.bytes == last->bytes && m.thread == last->thread &&
               m.totalAllocated == last->totalAllocated) {
      ++repeated;
      continue;
    }
    if (allocatedAtStart < 0 && m.totalAllocated >= 0)
      allocatedAtStart = m.totalAllocated - m.bytes;
    maxTotal = std::max(maxTotal, m.totalAllocated);
    maxReserved = std::max(maxReserved, m.totalReserved);
    if (m.totalAllocated >= 0) out.allocatedAtEndBytes = m.totalAllocated;
    ImportEvent ev;
    ev.tsNs = m.tsNs;
    ev.thread = m.thread;  // the thread's open op and module scopes own the block
    ev.device = static_cast<int32_t>(device);
    if (m.bytes > 0) {
      uint64_t address = m.addr >= 0 ? static_cast<uint64_t>(m.addr) : nextAddress++;
      if (m.addr < 0) liveBySize[m.bytes].push_back(address);
      live[static_cast<int64_t>(address)] = blocks.size();
      blocks.push_back({order, m.thread, m.tsNs, m.bytes});
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
      auto it = live.find(static_cast<int64_t>(address));
      if (it == live.end()) {
        before.push_back({address, -m.bytes, classifyBefore(phaseOf(m.tsNs))});
      } else {
        blocks[it->second].freed = true;
        blocks[it->second].freeNs = m.tsNs;
        live.erase(it);
      }
      ev.kind = ImportEvent::Kind::kFree;
      ev.address = address;
    }
    memEvents.push_back({ev.tsNs, 3, 2 * order++, ev});
    if (m.totalReserved >= 0 && m.totalReserved != lastReserved) {
      lastReserved = m.totalReserved;
      ImportEvent c;
      c.kind = ImportEvent::Kind::kCounter;
      c.tsNs = m.tsNs;
      c.name = "reserved_bytes";
      c.value = m.totalReserved;
      memEvents.push_back({c.tsNs, 3, 2 * order++, c});
    }
  }
  if (repeated > 0)
    out.notes.push_back(absl::StrCat(repeated,
                                     " [memory] events repeat the one before them (the same "
                                     "address and size): left out"));
  // Each block's category, from the phases of its alloc and free, tagged right after its alloc.
  {
    std::vector<Sortable> tags;
    size_t e = 0;
    for (const Block& b : blocks) {
      const auto ag = loop.accumulateGrad.find(b.thread);
      const bool accumulate = ag != loop.accumulateGrad.end() && ag->second.find(b.allocNs);
      const Verdict v = classifyBlock(phaseOf(b.allocNs), accumulate, b.freed,
                                      b.freed ? phaseOf(b.freeNs) : LoopPhase::kNone,
                                      b.freed && stepOf(b.allocNs) == stepOf(b.freeNs));
      if (v.rule == nullptr) continue;
      while (memEvents[e].order != 2 * b.order) ++e;
      ImportEvent t = memEvents[e].event;
      t.kind = ImportEvent::Kind::kTag;
      t.category = v.category;
      t.name = v.rule;
      tags.push_back({t.tsNs, 3, 2 * b.order + 1, std::move(t)});
    }
    for (Sortable& t : tags) memEvents.push_back(std::move(t));
  }
  int64_t beforeBytes = 0;
  for (const Before& b : before) beforeBytes += b.bytes;
  // The rest of what Total Allocated says was there at the start: kept throughout, so in a trace
  // of forward passes only (steps, no backward) the model's weights.
  if (allocatedAtStart > beforeBytes) {
    const bool forwardOnly = !loop.steps.empty() && phases.backward.empty();
    before.push_back({nextAddress++, allocatedAtStart - beforeBytes,
                      forwardOnly ? Verdict{Category::kWeight,
                                            "[before the trace, kept: weights "
                                            "of a forward-only trace]"}
                                  : Verdict{Category::kUnknown, "[before the trace]"}});
  }
  int64_t k = 0;
  for (const Before& b : before) {
    ImportEvent a;
    a.kind = ImportEvent::Kind::kAlloc;
    a.tsNs = startNs;
    a.address = b.address;
    a.sizeBytes = static_cast<uint64_t>(b.bytes);
    a.device = static_cast<int32_t>(device);
    ImportEvent t = a;
    t.kind = ImportEvent::Kind::kTag;
    t.category = b.verdict.category;
    t.name = b.verdict.rule;
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
