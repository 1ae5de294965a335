#include "src/core/ops.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace tidemark::core {

namespace {
void addTimes(const std::vector<ScopeInterval>& scopes, bool isOp, bool isKernel,
              std::map<std::string, OpStat>& byName) {
  // Per thread, the scopes open at the current one's begin (scopes are sorted by beginSeq):
  // the innermost one still open is its parent, whose self time it takes away.
  std::unordered_map<uint32_t, std::vector<const ScopeInterval*>> open;
  std::unordered_map<const ScopeInterval*, int64_t> childNs;
  for (const ScopeInterval& s : scopes) {
    if (s.endSeq == kOpenSeq) continue;
    auto& stack = open[s.threadId];
    while (!stack.empty() && stack.back()->endSeq <= s.beginSeq) stack.pop_back();
    const int64_t dur = s.endTsNs - s.beginTsNs;
    if (!stack.empty()) childNs[stack.back()] += dur;
    stack.push_back(&s);
  }
  for (const ScopeInterval& s : scopes) {
    if (s.endSeq == kOpenSeq) continue;
    OpStat& o = byName[(isKernel ? "2" : isOp ? "1" : "0") + s.name];
    o.name = s.name;
    o.isOp = isOp;
    o.isKernel = isKernel;
    o.calls += 1;
    const int64_t dur = s.endTsNs - s.beginTsNs;
    o.totalNs += dur;
    auto it = childNs.find(&s);
    o.selfNs += dur - (it == childNs.end() ? 0 : it->second);
  }
}
// For each launch, the scope of `scopes` (modules, or ops) innermost on its thread at its moment
// (nullptr: none).
std::unordered_map<uint32_t, const ScopeInterval*> launchingScopes(
    const Recording& rec, const std::vector<ScopeInterval>& all) {
  std::unordered_map<uint32_t, std::vector<const Launch*>> byThread;
  for (const Launch& l : rec.launches) byThread[l.threadId].push_back(&l);
  std::unordered_map<uint32_t, std::vector<const ScopeInterval*>> scopesByThread;
  for (const ScopeInterval& s : all) scopesByThread[s.threadId].push_back(&s);
  std::unordered_map<uint32_t, const ScopeInterval*> out;
  for (auto& [thread, launches] : byThread) {
    std::sort(launches.begin(), launches.end(),
              [](const Launch* a, const Launch* b) { return a->seq < b->seq; });
    const auto& scopes = scopesByThread[thread];  // by beginSeq (sortBySeq)
    std::vector<const ScopeInterval*> open;
    size_t next = 0;
    for (const Launch* l : launches) {
      while (next < scopes.size() && scopes[next]->beginSeq <= l->seq) {
        while (!open.empty() && open.back()->endSeq <= scopes[next]->beginSeq) open.pop_back();
        open.push_back(scopes[next++]);
      }
      while (!open.empty() && open.back()->endSeq <= l->seq) open.pop_back();
      out[l->correlationId] = open.empty() ? nullptr : open.back();
    }
  }
  return out;
}

void attributeKernels(const Recording& rec, std::map<std::string, OpStat>& byName) {
  if (rec.launches.empty()) return;
  const auto modules = launchingScopes(rec, rec.scopes);
  const auto ops = launchingScopes(rec, rec.ops);
  std::map<std::string, std::map<std::string, int64_t>> launchers;  // kernel → module → count
  for (const ScopeInterval& k : rec.kernels) {
    if (k.endSeq == kOpenSeq || k.correlationId == 0) continue;
    if (auto op = ops.find(k.correlationId); op != ops.end() && op->second != nullptr)
      byName["1" + op->second->name].gpuNs += k.endTsNs - k.beginTsNs;
    auto it = modules.find(k.correlationId);
    if (it == modules.end() || it->second == nullptr) continue;
    const ScopeInterval& m = *it->second;
    OpStat& module = byName["0" + m.name];
    module.name = m.name;
    module.gpuNs += k.endTsNs - k.beginTsNs;
    launchers[k.name][m.name] += 1;
  }
  for (const auto& [kernel, counts] : launchers) {
    auto best = std::max_element(counts.begin(), counts.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    byName["2" + kernel].launchedBy = best->first;
  }
}

}  // namespace

std::vector<OpStat> moduleTimes(const Recording& rec) {
  std::map<std::string, OpStat> byName;
  addTimes(rec.scopes, false, false, byName);
  addTimes(rec.ops, true, false, byName);
  addTimes(rec.kernels, false, true, byName);
  attributeKernels(rec, byName);
  std::vector<OpStat> out;
  out.reserve(byName.size());
  for (auto& [key, o] : byName) out.push_back(std::move(o));
  std::sort(out.begin(), out.end(), [](const OpStat& a, const OpStat& b) {
    return a.totalNs != b.totalNs ? a.totalNs > b.totalNs : a.name < b.name;
  });
  return out;
}

}  // namespace tidemark::core
