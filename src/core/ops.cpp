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
}  // namespace

std::vector<OpStat> moduleTimes(const Recording& rec) {
  std::map<std::string, OpStat> byName;
  addTimes(rec.scopes, false, false, byName);
  addTimes(rec.ops, true, false, byName);
  addTimes(rec.kernels, false, true, byName);
  std::vector<OpStat> out;
  out.reserve(byName.size());
  for (auto& [key, o] : byName) out.push_back(std::move(o));
  std::sort(out.begin(), out.end(), [](const OpStat& a, const OpStat& b) {
    return a.totalNs != b.totalNs ? a.totalNs > b.totalNs : a.name < b.name;
  });
  return out;
}

}  // namespace tidemark::core
