#include "src/advisor/solvers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "src/advisor/simulator.h"
#include "src/advisor/stage_choices.h"

namespace tidemark::core {

const char* strategyName(Strategy s) {
  switch (s) {
    case Strategy::kStoreAll:
      return "store-all";
    case Strategy::kCheckpointAll:
      return "checkpoint-all";
    case Strategy::kSqrtN:
      return "sqrt-n";
    case Strategy::kGreedy:
      return "greedy";
    case Strategy::kOptimal:
      return "optimal";
  }
  return "?";
}

absl::StatusOr<Strategy> parseStrategy(std::string_view name) {
  for (Strategy s : {Strategy::kStoreAll, Strategy::kCheckpointAll, Strategy::kSqrtN,
                     Strategy::kGreedy, Strategy::kOptimal})
    if (name == strategyName(s)) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown strategy '", std::string(name),
                   "' (store-all, checkpoint-all, sqrt-n, greedy, optimal)"));
}

ChainPlan storeAllPlan(const ChainProfile& profile) {
  ChainPlan plan;
  for (int i = 0; i < profile.size(); ++i) plan.segments.push_back({i, i, SegmentMode::kStore});
  return plan;
}

ChainPlan checkpointAllPlan(const ChainProfile& profile) {
  ChainPlan plan;
  for (int i = 0; i < profile.size(); ++i)
    plan.segments.push_back(
        {i, i, profile.stages[i].checkpointable ? SegmentMode::kRecompute : SegmentMode::kStore});
  return plan;
}

namespace {

// Builds a plan from cut decisions over the runs of checkpointable stages: closeBefore(i, len)
// says whether stage i starts a new segment when the open one has len stages. The last segment
// of the last run is stored, as torch's checkpoint_sequential does.
template <typename CloseBefore>
ChainPlan segmentRuns(const ChainProfile& profile, CloseBefore closeBefore) {
  ChainPlan plan;
  const int n = profile.size();
  int i = 0;
  while (i < n) {
    if (!profile.stages[i].checkpointable) {
      plan.segments.push_back({i, i, SegmentMode::kStore});
      ++i;
      continue;
    }
    int first = i;
    while (i < n && profile.stages[i].checkpointable) {
      if (i > first && (!profile.stages[i].linked || closeBefore(first, i))) {
        plan.segments.push_back({first, i - 1, SegmentMode::kRecompute});
        first = i;
      }
      ++i;
    }
    plan.segments.push_back({first, i - 1, SegmentMode::kRecompute});
  }
  // The last recomputed segment would be re-run right after its own forward: store it instead.
  for (auto it = plan.segments.rbegin(); it != plan.segments.rend(); ++it) {
    if (it->mode == SegmentMode::kRecompute) {
      it->mode = SegmentMode::kStore;
      // A stored segment is the same as one stored segment per stage; keep plans in that shape.
      std::vector<Segment> split;
      for (int s = it->first; s <= it->last; ++s) split.push_back({s, s, SegmentMode::kStore});
      const auto at = plan.segments.erase(std::next(it).base());
      plan.segments.insert(at, split.begin(), split.end());
      break;
    }
  }
  return plan;
}

int64_t stageStoreBytes(const ChainProfile& p, int i) {
  return p.inBytes(i) + p.stages[i].savedBytes;
}

}  // namespace

ChainPlan sqrtNPlan(const ChainProfile& profile) {
  int c = 0;
  for (const Stage& s : profile.stages) c += s.checkpointable ? 1 : 0;
  const int len = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(c)))));
  return segmentRuns(profile, [&](int first, int i) { return i - first >= len; });
}

ChainPlan greedyPlan(const ChainProfile& profile, int64_t thresholdBytes) {
  return segmentRuns(profile, [&](int first, int i) {
    int64_t sum = 0;
    for (int s = first; s <= i; ++s) sum += stageStoreBytes(profile, s);
    return sum > thresholdBytes;
  });
}

ChainPlan greedySearchPlan(const ChainProfile& profile, int64_t budgetBytes) {
  int64_t smallest = std::numeric_limits<int64_t>::max(), total = 0;
  for (int i = 0; i < profile.size(); ++i) {
    smallest = std::min(smallest, stageStoreBytes(profile, i));
    total += stageStoreBytes(profile, i);
  }
  // Chen's search: a few passes of b = sqrt(x * y / 2) from the plan's inter-segment bytes x and
  // largest segment y, then a spread of thresholds between the smallest stage and everything.
  std::vector<int64_t> thresholds;
  double b = static_cast<double>(std::max<int64_t>(1, total));
  for (int pass = 0; pass < 3; ++pass) {
    const ChainPlan plan = greedyPlan(profile, static_cast<int64_t>(b));
    int64_t x = 0, y = 0;
    for (const Segment& seg : plan.segments) {
      x += profile.inBytes(seg.first);
      int64_t inside = 0;
      for (int s = seg.first; s <= seg.last; ++s) inside += stageStoreBytes(profile, s);
      y = std::max(y, inside);
    }
    thresholds.push_back(static_cast<int64_t>(b));
    b = std::sqrt(static_cast<double>(x) * static_cast<double>(y) / 2.0);
  }
  constexpr int kSpread = 48;
  const double lo = static_cast<double>(std::max<int64_t>(1, smallest));
  const double hi = static_cast<double>(std::max<int64_t>(1, total));
  for (int k = 0; k <= kSpread; ++k)
    thresholds.push_back(static_cast<int64_t>(lo * std::pow(hi / lo, k / double(kSpread))));

  std::optional<ChainPlan> best;
  SimResult bestSim;
  bool bestFits = false;
  for (int64_t t : thresholds) {
    ChainPlan plan = greedyPlan(profile, t);
    const SimResult sim = simulate(profile, plan);
    const bool fits = sim.peakBytes <= budgetBytes;
    const bool better = !best || (fits && !bestFits) ||
                        (fits && bestFits && sim.extraNs < bestSim.extraNs) ||
                        (!fits && !bestFits && sim.peakBytes < bestSim.peakBytes);
    if (better) {
      best = std::move(plan);
      bestSim = sim;
      bestFits = fits;
    }
  }
  return *best;
}

OptimalChainSolver::OptimalChainSolver(const ChainProfile& profile, int64_t maxBudgetBytes)
    : m_profile(profile), m_maxBudget(maxBudgetBytes) {
  const ChainProfile& p = profile;
  const int n = p.size();
  // Headroom above static that a plan may need: entries needing more are never read back.
  const int64_t cap = maxBudgetBytes == std::numeric_limits<int64_t>::max()
                          ? maxBudgetBytes
                          : std::max<int64_t>(-1, maxBudgetBytes - p.staticBytes);
  m_front.assign(n + 1, {});
  // minNeed[i]: the least headroom stages i.. need at all (the first entry of an uncapped
  // front), kept for every stage so that the least feasible budget is exact under a cap too.
  std::vector<int64_t> minNeed(n + 1);
  // After the last stage: the chain's output and the gradient that starts the backward.
  minNeed[n] = 2 * p.outBytes(n - 1) + p.endOutsideBytes;
  if (minNeed[n] <= cap) m_front[n].push_back({minNeed[n], 0, 0, n, -1, false, false});

  std::vector<FrontEntry> candidates;
  int64_t leastNeed = 0;
  // Appends the candidates of one choice: the choice needs `local` above what earlier stages
  // keep, keeps `kept` through the forward and adds `extra`, then the stages from `next` run
  // with `kept` less headroom.
  auto addChoice = [&](int64_t local, int64_t kept, int64_t extra, int next, int option,
                       bool recompute, bool offload) {
    leastNeed = std::min(leastNeed, std::max(local, kept + minNeed[next]));
    if (local > cap) return;
    const Front& rest = m_front[next];
    // Entries of `rest` whose need fits under local collapse into the cheapest of them.
    size_t k = 0;
    while (k + 1 < rest.size() && kept + rest[k + 1].need <= local) ++k;
    // rest ascends in need: past the cap nothing more fits.
    for (; k < rest.size() && kept + rest[k].need <= cap; ++k)
      candidates.push_back({std::max(local, kept + rest[k].need), rest[k].cost + extra, kept, next,
                            option, recompute, offload});
  };

  std::vector<StageChoice> stored;
  for (int i = n - 1; i >= 0; --i) {
    candidates.clear();
    leastNeed = std::numeric_limits<int64_t>::max();
    // Stored, with all activations or with one of the stage's options.
    storedChoices(p, i, &stored);
    for (const StageChoice& c : stored)
      addChoice(c.local, c.kept, c.extraNs, i + 1, c.option, false, c.offload);
    // Recomputed segments [i, k].
    RecomputedSegment segment(p, i);
    for (int k = i; extends(p, i, k); ++k) {
      const StageChoice c = segment.grow();
      addChoice(c.local, c.kept, c.extraNs, k + 1, -1, true, false);
      // A longer segment needs at least as much (local only grows with k), and its input as
      // kept does not change: past the cap and past the least need already found, it is of no use.
      if (c.local > cap && c.local >= leastNeed) break;
    }
    minNeed[i] = leastNeed;
    lowerEnvelope(&candidates, &m_front[i]);
  }
  m_minFeasibleBudget = std::max(p.floorBytes, p.staticBytes + minNeed[0]);
}

std::vector<ParetoPoint> OptimalChainSolver::curve() const {
  return curveOfFront(m_front[0], m_profile, m_maxBudget);
}

std::optional<ChainPlan> OptimalChainSolver::planFor(int64_t budgetBytes) const {
  return readPlan(
      m_profile, budgetBytes, m_maxBudget, [&](int i) -> const Front& { return m_front[i]; },
      [](const FrontEntry&, int64_t, Segment*) {});
}

int64_t extraTimeLowerBound(const ChainProfile& p, int64_t budgetBytes) {
  const int n = p.size();
  int64_t storeAllEnd = p.staticBytes + 2 * p.outBytes(n - 1) + p.endOutsideBytes;
  for (int i = 0; i < n; ++i) storeAllEnd += stageStoreBytes(p, i);
  int64_t deficit = storeAllEnd - budgetBytes;
  if (deficit <= 0) return 0;
  // Each stage: at most `bytes` dropped, at no less than `rate` ns per byte.
  struct Item {
    double rate;
    int64_t bytes;
  };
  std::vector<Item> items;
  for (int i = 0; i < n; ++i) {
    const Stage& s = p.stages[i];
    int64_t bytes = 0;
    double rate = std::numeric_limits<double>::infinity();
    auto consider = [&](int64_t dropped, int64_t ns) {
      if (dropped <= 0) return;
      bytes = std::max(bytes, dropped);
      rate = std::min(rate, static_cast<double>(ns) / static_cast<double>(dropped));
    };
    if (s.checkpointable) consider(stageStoreBytes(p, i), s.rerunCostNs());
    if (p.offloadBytesPerSecond > 0)
      consider(stageStoreBytes(p, i), p.offloadNs(stageStoreBytes(p, i)));
    for (const StageOption& o : s.options) consider(s.savedBytes - o.savedBytes, o.recomputeNs);
    if (bytes > 0) items.push_back({rate, bytes});
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.rate < b.rate; });
  double bound = 0;
  for (const Item& it : items) {
    const int64_t take = std::min(it.bytes, deficit);
    bound += it.rate * static_cast<double>(take);
    deficit -= take;
    if (deficit == 0) break;
  }
  // Rounded down so that rounding never lifts the bound above the optimum.
  return static_cast<int64_t>(std::floor(bound));
}

}  // namespace tidemark::core
