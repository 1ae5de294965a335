#include "src/advisor/chain_front.h"

#include <algorithm>

#include "src/advisor/solvers.h"

namespace tidemark::core {

void lowerEnvelope(std::vector<FrontEntry>* candidates, Front* out) {
  std::sort(candidates->begin(), candidates->end(), [](const FrontEntry& a, const FrontEntry& b) {
    if (a.need != b.need) return a.need < b.need;
    if (a.cost != b.cost) return a.cost < b.cost;
    if (a.recompute != b.recompute) return !a.recompute;
    if (a.offload != b.offload) return !a.offload;
    if (a.next != b.next) return a.next < b.next;
    return a.option < b.option;
  });
  out->clear();
  for (const FrontEntry& c : *candidates)
    if (out->empty() || c.cost < out->back().cost) out->push_back(c);
  candidates->clear();
}

const FrontEntry* cheapestWithin(const Front& front, int64_t headroom) {
  auto it = std::upper_bound(front.begin(), front.end(), headroom,
                             [](int64_t h, const FrontEntry& e) { return h < e.need; });
  return it == front.begin() ? nullptr : &*std::prev(it);
}

std::vector<ParetoPoint> curveOfFront(const Front& first, const ChainProfile& profile,
                                      int64_t maxBudgetBytes) {
  std::vector<ParetoPoint> out;
  out.reserve(first.size());
  // Below the floor nothing fits; points under it merge into the cheapest of them at the floor.
  for (const FrontEntry& e : first) {
    const ParetoPoint pt{std::max(profile.floorBytes, profile.staticBytes + e.need), e.cost};
    if (pt.budgetBytes > maxBudgetBytes) break;  // under the floor, above the cap
    while (!out.empty() && out.back().budgetBytes >= pt.budgetBytes) out.pop_back();
    out.push_back(pt);
  }
  return out;
}

}  // namespace tidemark::core
