#include "src/core/peak.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <unordered_map>

namespace tidemark::core {

namespace {

const std::string kNoName;

// For a block allocated outside any module scope (parameters, gradients, optimizer state), the
// module its tag names: "TinyGPT.blocks.0.attn.qkv.weight.exp_avg" -> "TinyGPT.blocks.0.attn.qkv".
// Parameter-derived names end in the parameter's name and the state's key, which hold no dot.
std::string ownerModule(const std::string& tagName) {
  if (tagName.empty()) return "(no module)";
  const size_t colon = tagName.find(':');
  std::string path = colon == std::string::npos ? tagName : tagName.substr(0, colon);
  if (colon != std::string::npos) return path.empty() ? "(no module)" : path;
  // Drop the trailing components that are not modules: the parameter, then a .grad or state key.
  for (const char* suffix : {".grad", ".exp_avg_sq", ".exp_avg", ".step", ".momentum_buffer"}) {
    const std::string s(suffix);
    if (path.size() > s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0) {
      path.resize(path.size() - s.size());
      break;
    }
  }
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? "(no module)" : path.substr(0, dot);
}

void fillItems(const Recording& rec, const std::vector<BlockCategory>& cats, PeakReport& report,
               size_t topItems) {
  const uint64_t seq = report.state.seq;
  struct ModuleSum {
    int64_t bytes = 0;
    int64_t blocks = 0;
    std::array<int64_t, kCategoryCount> byCategory{};
  };
  std::map<std::string, ModuleSum> modules;
  std::vector<PeakItem> tensors;
  // One sweep in sequence order over the scopes' begins and ends and the blocks live at the
  // peak, with a stack of open scopes per thread: each block's module is the top of its
  // thread's stack when it was allocated.
  struct Boundary {
    uint64_t seq;
    bool begin;
    size_t scope;
  };
  std::vector<Boundary> bounds;
  bounds.reserve(rec.scopes.size() * 2);
  for (size_t i = 0; i < rec.scopes.size(); ++i) {
    bounds.push_back({rec.scopes[i].beginSeq, true, i});
    if (rec.scopes[i].endSeq != kOpenSeq) bounds.push_back({rec.scopes[i].endSeq, false, i});
  }
  std::sort(bounds.begin(), bounds.end(),
            [](const Boundary& a, const Boundary& b) { return a.seq < b.seq; });
  std::unordered_map<uint32_t, std::vector<size_t>> open;
  size_t next = 0;
  for (size_t i = 0; i < rec.blocks.size(); ++i) {
    const Block& b = rec.blocks[i];
    if (b.allocSeq > seq) break;  // blocks are sorted by allocSeq
    if (b.freeSeq <= seq) continue;
    for (; next < bounds.size() && bounds[next].seq <= b.allocSeq; ++next) {
      const ScopeInterval& sc = rec.scopes[bounds[next].scope];
      auto& stack = open[sc.threadId];
      if (bounds[next].begin) {
        stack.push_back(bounds[next].scope);
      } else {
        auto it = std::find(stack.rbegin(), stack.rend(), bounds[next].scope);
        if (it != stack.rend()) stack.erase(std::next(it).base());
      }
    }
    const auto size = static_cast<int64_t>(b.sizeBytes);
    const auto& stack = open[b.threadId];
    const std::string& tagName =
        cats[i].tagIndex >= 0 ? rec.tags[static_cast<size_t>(cats[i].tagIndex)].name : kNoName;
    ModuleSum& m = modules[stack.empty() ? ownerModule(tagName) : rec.scopes[stack.back()].name];
    m.bytes += size;
    m.blocks += 1;
    m.byCategory[categoryIndex(cats[i].category)] += size;
    PeakItem t;
    t.name = cats[i].tagIndex >= 0 ? rec.tags[static_cast<size_t>(cats[i].tagIndex)].name : "";
    if (t.name.empty()) t.name = "block@0x" + [](uint64_t a) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(a));
      return std::string(buf);
    }(b.address);
    t.category = cats[i].category;
    t.rule = cats[i].rule;
    t.bytes = size;
    t.blocks = 1;
    tensors.push_back(std::move(t));
  }
  auto larger = [](const PeakItem& a, const PeakItem& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  };
  const size_t nt = std::min(topItems, tensors.size());
  std::partial_sort(tensors.begin(), tensors.begin() + static_cast<long>(nt), tensors.end(), larger);
  tensors.resize(nt);
  report.tensors = std::move(tensors);
  for (const auto& [name, sum] : modules) {
    PeakItem m;
    m.name = name;
    m.bytes = sum.bytes;
    m.blocks = sum.blocks;
    const auto top = std::max_element(sum.byCategory.begin(), sum.byCategory.end());
    m.category = kAllCategories[static_cast<size_t>(top - sum.byCategory.begin())];
    report.modules.push_back(std::move(m));
  }
  std::sort(report.modules.begin(), report.modules.end(), larger);
  if (report.modules.size() > topItems) report.modules.resize(topItems);
}

}  // namespace

std::vector<PeakReport> computePeaks(const Recording& rec, const std::vector<BlockCategory>& cats,
                                     const LivenessReplay& replay, size_t topItems) {
  std::vector<PeakReport> out;
  PeakReport whole;
  whole.state = replay.peak();
  out.push_back(whole);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const StepInterval& s : rec.steps) ranges.emplace_back(s.beginSeq, s.endSeq);
  const std::vector<MemoryState> stepPeaks = replay.peaks(ranges);
  for (size_t i = 0; i < rec.steps.size(); ++i) {
    PeakReport r;
    r.step = rec.steps[i].step;
    r.state = stepPeaks[i];
    out.push_back(r);
  }
  for (PeakReport& r : out) {
    if (const PhaseInterval* p = rec.phaseAt(r.state.seq)) r.phase = std::string(phaseName(p->phase));
    if (const ScopeInterval* s = rec.scopeAt(r.state.seq)) r.scope = s->name;
  }
  // What is live, by module and tensor, for the peak of the whole recording.
  fillItems(rec, cats, out.front(), topItems);
  return out;
}

}  // namespace tidemark::core
