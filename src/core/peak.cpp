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
  // An imported block's "[rule] function (file.py:line)": the code that allocated it, where the
  // recording has no modules (a memory snapshot); a rule alone names none.
  if (tagName.front() == '[') {
    const size_t close = tagName.find("] ");
    return close == std::string::npos ? "(no module)" : tagName.substr(close + 2);
  }
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

// Walks scopes in sequence order with a stack of open scopes per thread, answering "which scope
// of this thread was innermost at seq" for increasing seq.
class ScopeSweep {
 public:
  explicit ScopeSweep(const std::vector<ScopeInterval>& scopes) : m_scopes(scopes) {
    m_bounds.reserve(scopes.size() * 2);
    for (size_t i = 0; i < scopes.size(); ++i) {
      m_bounds.push_back({scopes[i].beginSeq, true, i});
      if (scopes[i].endSeq != kOpenSeq) m_bounds.push_back({scopes[i].endSeq, false, i});
    }
    std::sort(m_bounds.begin(), m_bounds.end(),
              [](const Boundary& a, const Boundary& b) { return a.seq < b.seq; });
  }

  // The innermost scope of `thread` open at seq, or nullptr. Calls must not decrease seq.
  const ScopeInterval* innermostAt(uint32_t thread, uint64_t seq) {
    for (; m_next < m_bounds.size() && m_bounds[m_next].seq <= seq; ++m_next) {
      const Boundary& bd = m_bounds[m_next];
      auto& stack = m_open[m_scopes[bd.scope].threadId];
      if (bd.begin) {
        stack.push_back(bd.scope);
      } else {
        auto it = std::find(stack.rbegin(), stack.rend(), bd.scope);
        if (it != stack.rend()) stack.erase(std::next(it).base());
      }
    }
    const auto& stack = m_open[thread];
    return stack.empty() ? nullptr : &m_scopes[stack.back()];
  }

 private:
  struct Boundary {
    uint64_t seq;
    bool begin;
    size_t scope;
  };
  const std::vector<ScopeInterval>& m_scopes;
  std::vector<Boundary> m_bounds;
  std::unordered_map<uint32_t, std::vector<size_t>> m_open;
  size_t m_next = 0;
};

bool larger(const PeakItem& a, const PeakItem& b) {
  return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
}

// The groups as items, largest first, at most topItems; a group's category is its largest.
std::vector<PeakItem> topGroups(const std::map<std::string, GroupSum>& groups, size_t topItems) {
  std::vector<PeakItem> out;
  for (const auto& [name, sum] : groups) {
    PeakItem m;
    m.name = name;
    m.bytes = sum.bytes;
    m.blocks = sum.blocks;
    const auto top = std::max_element(sum.byCategory.begin(), sum.byCategory.end());
    m.category = kAllCategories[static_cast<size_t>(top - sum.byCategory.begin())];
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(), larger);
  if (out.size() > topItems) out.resize(topItems);
  return out;
}

}  // namespace

void fillItems(const Recording& rec, const std::vector<BlockCategory>& cats, PeakReport& report,
               size_t topItems) {
  const uint64_t seq = report.state.seq;
  PeakItemsBuilder items(!rec.ops.empty());
  ScopeSweep moduleSweep(rec.scopes);
  ScopeSweep opSweep(rec.ops);
  auto liveAt = [seq](const Block& b) { return b.allocSeq <= seq && seq < b.freeSeq; };
  // A segment holds what its live tensors leave: its slack.
  std::unordered_map<size_t, int64_t> carved;
  for (size_t i = 0; i < rec.blocks.size() && rec.blocks[i].allocSeq <= seq; ++i) {
    if (cats[i].segment >= 0 && liveAt(rec.blocks[i]))
      carved[static_cast<size_t>(cats[i].segment)] += static_cast<int64_t>(rec.blocks[i].sizeBytes);
  }
  for (size_t i = 0; i < rec.blocks.size(); ++i) {
    const Block& b = rec.blocks[i];
    if (b.allocSeq > seq) break;  // blocks are sorted by allocSeq
    if (!liveAt(b)) continue;
    auto c = carved.find(i);
    const int64_t size = static_cast<int64_t>(b.sizeBytes) - (c == carved.end() ? 0 : c->second);
    const ScopeInterval* module = moduleSweep.innermostAt(b.threadId, b.allocSeq);
    const ScopeInterval* op = opSweep.innermostAt(b.threadId, b.allocSeq);
    const std::string& tagName =
        cats[i].tagIndex >= 0 ? rec.tags[static_cast<size_t>(cats[i].tagIndex)].name : kNoName;
    items.add(module ? &module->name : nullptr, op ? &op->name : nullptr, tagName, b.address, size,
              cats[i].category, cats[i].rule);
  }
  items.finish(report, topItems);
}

void PeakItemsBuilder::add(const std::string* moduleScope, const std::string* opScope,
                           const std::string& tagName, uint64_t address, int64_t size, Category c,
                           CategoryRule rule) {
  m_modules[moduleScope ? *moduleScope : ownerModule(tagName)].add(size, c);
  if (m_withOps) m_ops[opScope ? *opScope : std::string("(no op)")].add(size, c);
  PeakItem t;
  if (!tagName.empty()) {
    t.name = tagName;
  } else {
    char buf[40];
    std::snprintf(buf, sizeof buf, "block@0x%llx", static_cast<unsigned long long>(address));
    t.name = buf;
  }
  t.category = c;
  t.rule = rule;
  t.bytes = size;
  t.blocks = 1;
  t.address = address;
  m_tensors.push_back(std::move(t));
  // Only the largest are reported: keep the list short as it grows.
  if (m_tensors.size() >= 2 * kKeepTensors) {
    std::nth_element(m_tensors.begin(), m_tensors.begin() + kKeepTensors, m_tensors.end(), larger);
    m_tensors.resize(kKeepTensors);
  }
}

void PeakItemsBuilder::finish(PeakReport& report, size_t topItems) {
  const size_t nt = std::min(topItems, m_tensors.size());
  std::partial_sort(m_tensors.begin(), m_tensors.begin() + static_cast<long>(nt), m_tensors.end(),
                    larger);
  m_tensors.resize(nt);
  report.tensors = std::move(m_tensors);
  report.modules = topGroups(m_modules, topItems);
  report.ops = topGroups(m_ops, topItems);
}

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
    if (const PhaseInterval* p = rec.phaseAt(r.state.seq))
      r.phase = std::string(phaseName(p->phase));
    if (const ScopeInterval* s = rec.scopeAt(r.state.seq)) r.scope = s->name;
  }
  // What is live, by module and tensor, for the peak of the whole recording.
  fillItems(rec, cats, out.front(), topItems);
  return out;
}

}  // namespace tidemark::core
