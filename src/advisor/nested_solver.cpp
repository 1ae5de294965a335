#include "src/advisor/nested_solver.h"

#include <algorithm>
#include <limits>

#include "src/advisor/stage_choices.h"

namespace tidemark::core {

namespace {

// Above any real need; sums of two stay far from overflow.
constexpr int64_t kUnreachable = std::numeric_limits<int64_t>::max() / 4;

}  // namespace

NestedChainSolver::NestedChainSolver(const ChainProfile& profile, int64_t maxBudgetBytes)
    : m_profile(profile), m_n(profile.size()), m_maxBudget(maxBudgetBytes) {
  const ChainProfile& p = profile;
  const int n = m_n;
  // Headroom above static that a plan may need: entries needing more are never read back (a
  // part's need is above what is kept below it, itself at least 0).
  const int64_t cap = maxBudgetBytes == std::numeric_limits<int64_t>::max()
                          ? maxBudgetBytes
                          : std::max<int64_t>(-1, maxBudgetBytes - p.staticBytes);
  m_top.assign(n + 1, {});
  m_rerun.assign(static_cast<size_t>(n) * n, {});
  m_inside.assign(static_cast<size_t>(n) * (n + 1), {});
  // The least need of each front, uncapped, so that the least feasible budget is exact under a
  // cap too.
  std::vector<int64_t> minTop(n + 1, kUnreachable);
  std::vector<int64_t> minRerun(static_cast<size_t>(n) * n, kUnreachable);
  std::vector<int64_t> minInside(static_cast<size_t>(n) * (n + 1), kUnreachable);
  auto rerunAt = [&](int i, int q) -> Front& { return m_rerun[i * n + q]; };
  auto insideAt = [&](int q, int i) -> Front& { return m_inside[q * (n + 1) + i]; };
  std::vector<int64_t> forwardSum(n + 1, 0);  // forward times' prefix sums
  for (int i = 0; i < n; ++i) forwardSum[i + 1] = forwardSum[i] + p.stages[i].rerunCostNs();

  std::vector<FrontEntry> candidates;
  // The candidates of a stored stage: it needs `local` above what is kept below it, keeps `kept`
  // while the parts from `next` on run, adds `extra`; `rest` is the front from `next`.
  auto addChoice = [&](int64_t local, int64_t kept, int64_t extra, int next, int option,
                       bool offload, const Front& rest) {
    if (local > cap) return;
    // Entries of `rest` whose need fits under local collapse into the cheapest of them.
    size_t k = 0;
    while (k + 1 < rest.size() && kept + rest[k + 1].need <= local) ++k;
    for (; k < rest.size() && kept + rest[k].need <= cap; ++k)
      candidates.push_back({std::max(local, kept + rest[k].need), rest[k].cost + extra, kept, next,
                            option, false, offload});
  };
  // The candidates of a recomputed segment whose re-run has the front `rerunFront`: it needs
  // `forward` for its first run and each entry's need for its re-run, keeps `kept` while the
  // parts from `next` on run (`rest`). Both are step functions of the headroom x (the cheapest
  // entry within it), so the least cost within x is rerunCost(x) + restCost(x - kept): one
  // candidate per step of either, O(|rerunFront| + |rest|), not every pair.
  auto addSegment = [&](int64_t forward, const Front& rerunFront, int64_t kept, int next,
                        const Front& rest) {
    if (rerunFront.empty() || rest.empty()) return;
    auto localOf = [&](size_t a) { return std::max(forward, rerunFront[a].need); };
    size_t a = 0, b = 0;
    int64_t x = std::max(localOf(0), kept + rest[0].need);
    while (x <= cap) {
      while (a + 1 < rerunFront.size() && localOf(a + 1) <= x) ++a;
      while (b + 1 < rest.size() && kept + rest[b + 1].need <= x) ++b;
      candidates.push_back({x, rerunFront[a].cost + rest[b].cost, kept, next, -1, true, false});
      int64_t step = std::numeric_limits<int64_t>::max();
      if (a + 1 < rerunFront.size()) step = std::min(step, localOf(a + 1));
      if (b + 1 < rest.size()) step = std::min(step, kept + rest[b + 1].need);
      if (step == std::numeric_limits<int64_t>::max()) break;
      x = step;
    }
  };
  auto settle = [&](Front* out) { lowerEnvelope(&candidates, out); };

  // Re-runs, by their last stage q: the parts i..q of a re-run of a segment ending at q, and the
  // re-run of [i, q] itself. Every segment ending before q is solved by then.
  for (int q = 0; q < n; ++q) {
    const int64_t gradient = p.outBytes(q);  // the segment's incoming gradient, live throughout
    insideAt(q, q + 1) = {{0, 0, 0, q + 1, -1, false, false}};
    minInside[q * (n + 1) + q + 1] = 0;
    for (int i = q; i >= 0 && p.stages[i].checkpointable && (i == q || p.stages[i + 1].linked);
         --i) {
      const Stage& s = p.stages[i];
      const int64_t in = p.inBytes(i);
      // Stage i stored: run again keeping everything, then its backward.
      const int64_t storedLocal = std::max(
          in + s.forwardWorkingBytes + s.outputBytes + gradient + s.recomputeOutside(),
          in + s.savedBytes + s.outputBytes + s.backwardWorkingBytes + in + s.backwardOutsideBytes);
      addChoice(storedLocal, in + s.savedBytes, 0, i + 1, -1, false, insideAt(q, i + 1));
      int64_t least = std::max(storedLocal, in + s.savedBytes + minInside[q * (n + 1) + i + 1]);
      // An inner segment [i, r]: run without keeping anything but its input, then re-run at its
      // backward as R(i, r) says.
      int64_t forward = 0;
      bool wholeNeeded = true;
      for (int r = i; r <= q; ++r) {
        const Stage& t = p.stages[r];
        forward =
            std::max(forward, (r > i ? in : 0) + p.inBytes(r) + t.checkpointedForwardWorking() +
                                  t.outputBytes + gradient + t.recomputeOutside());
        if (r == q) break;
        addSegment(forward, rerunAt(i, r), in, r + 1, insideAt(q, r + 1));
        least = std::min(
            least, std::max({forward, minRerun[i * n + r], in + minInside[q * (n + 1) + r + 1]}));
        // A longer inner segment needs at least `forward`: past the cap and the least need
        // found, it is of no use (nor is the whole segment below).
        if (forward > cap && forward >= least) {
          wholeNeeded = false;
          break;
        }
      }
      // R(i, q): the parts above, plus the re-run's own forward time.
      Front& whole = rerunAt(i, q);
      settle(&whole);
      for (FrontEntry& e : whole) e.cost += forwardSum[q + 1] - forwardSum[i];
      minRerun[i * n + q] = least;
      // Inside a longer segment ending at q, [i, q] may also be an inner segment.
      for (const FrontEntry& e : whole) candidates.push_back(e);
      for (FrontEntry& c : candidates) c.cost -= forwardSum[q + 1] - forwardSum[i];
      if (wholeNeeded) {
        addSegment(forward, whole, in, q + 1, insideAt(q, q + 1));
        least = std::min(least, std::max(forward, minRerun[i * n + q]));
      }
      settle(&insideAt(q, i));
      minInside[q * (n + 1) + i] = least;
    }
  }

  // The top level: stages stored (with or without an option) or recomputed segments [i, k],
  // each re-run as R(i, k).
  minTop[n] = 2 * p.outBytes(n - 1) + p.endOutsideBytes;
  if (minTop[n] <= cap) m_top[n].push_back({minTop[n], 0, 0, n, -1, false, false});
  std::vector<StageChoice> stored;
  for (int i = n - 1; i >= 0; --i) {
    int64_t least = kUnreachable;
    storedChoices(p, i, &stored);
    for (const StageChoice& c : stored) {
      addChoice(c.local, c.kept, c.extraNs, i + 1, c.option, c.offload, m_top[i + 1]);
      least = std::min(least, std::max(c.local, c.kept + minTop[i + 1]));
    }
    const int64_t in = p.inBytes(i);
    int64_t forward = 0;
    for (int k = i; extends(p, i, k); ++k) {
      const Stage& t = p.stages[k];
      forward = std::max(forward, (k > i ? in : 0) + p.inBytes(k) + t.checkpointedForwardWorking() +
                                      t.outputBytes + t.forwardOutsideBytes);
      addSegment(forward, rerunAt(i, k), in, k + 1, m_top[k + 1]);
      least = std::min(least, std::max({forward, minRerun[i * n + k], in + minTop[k + 1]}));
      if (forward > cap && forward >= least) break;
    }
    settle(&m_top[i]);
    minTop[i] = least;
  }
  m_minFeasibleBudget = std::max(p.floorBytes, p.staticBytes + minTop[0]);
}

std::vector<ParetoPoint> NestedChainSolver::curve() const {
  return curveOfFront(m_top[0], m_profile, m_maxBudget);
}

std::vector<Segment> NestedChainSolver::readRerun(int i, int q, int64_t h) const {
  std::vector<Segment> parts;
  const FrontEntry* e = cheapestWithin(rerun(i, q), h);
  int at = i;
  while (e != nullptr) {
    Segment part{at, e->next - 1, e->mode()};
    if (e->recompute) part.inner = readRerun(at, e->next - 1, h);
    parts.push_back(std::move(part));
    h -= e->kept;
    at = e->next;
    e = at > q ? nullptr : cheapestWithin(inside(q, at), h);
  }
  // Every stage stored is the one-level re-run: said by no inner plan.
  const bool allStored = std::all_of(
      parts.begin(), parts.end(), [](const Segment& s) { return s.mode == SegmentMode::kStore; });
  if (allStored || at != q + 1) return {};
  return parts;
}

std::optional<ChainPlan> NestedChainSolver::planFor(int64_t budgetBytes) const {
  return readPlan(
      m_profile, budgetBytes, m_maxBudget, [&](int i) -> const Front& { return m_top[i]; },
      [&](const FrontEntry& e, int64_t headroom, Segment* seg) {
        if (e.recompute) seg->inner = readRerun(seg->first, seg->last, headroom);
      });
}

}  // namespace tidemark::core
