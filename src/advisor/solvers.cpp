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
  const std::vector<int64_t> gradientAhead = leastOutputAhead(p);
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
      // A longer segment needs at least leastNeedFromHereOn (which only grows with k), and its
      // input as kept does not change: past the cap and past the least need already found, it
      // is of no use.
      const int64_t longer = segment.leastNeedFromHereOn(gradientAhead[k]);
      if (longer > cap && longer >= leastNeed) break;
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

namespace {

// Items of the fractional knapsack, kept in the order of their price per byte: how many bytes
// the stages inserted so far may drop at each price, and what dropping all of them costs, as
// Fenwick trees, so that the least cost of dropping D bytes is one descent.
class DropPrices {
 public:
  explicit DropPrices(std::vector<double> ratesInOrder) : m_rate(std::move(ratesInOrder)) {
    m_bytes.assign(m_rate.size() + 1, 0);
    m_cost.assign(m_rate.size() + 1, 0);
  }
  void add(size_t rank, int64_t bytes) {
    const long double cost = static_cast<long double>(m_rate[rank]) * bytes;
    for (size_t i = rank + 1; i < m_bytes.size(); i += i & (~i + 1)) {
      m_bytes[i] += bytes;
      m_cost[i] += cost;
    }
  }
  // The least cost of dropping `deficit` bytes from the items added, the cheapest first (all of
  // them when they hold less).
  long double cheapest(int64_t deficit) const {
    size_t pos = 0;
    int64_t bytes = 0;
    long double cost = 0;
    size_t step = 1;
    while (step * 2 < m_bytes.size()) step *= 2;
    // The longest prefix of prices whose bytes stay below the deficit.
    for (; step > 0; step /= 2) {
      const size_t next = pos + step;
      if (next < m_bytes.size() && bytes + m_bytes[next] < deficit) {
        pos = next;
        bytes += m_bytes[next];
        cost += m_cost[next];
      }
    }
    if (pos >= m_rate.size()) return cost;  // not enough bytes anywhere: all of them
    // The rest at the next price: an item holds at least that much, or the descent would have
    // passed it.
    return cost + static_cast<long double>(m_rate[pos]) * (deficit - bytes);
  }

 private:
  std::vector<double> m_rate;
  std::vector<int64_t> m_bytes;
  std::vector<long double> m_cost;
};

}  // namespace

int64_t extraTimeLowerBound(const ChainProfile& p, int64_t budgetBytes) {
  const int n = p.size();
  // What each stage can drop of what storing keeps (st_i: input and saved), and its cheapest
  // price per byte: a recomputation drops at most st_i for its re-run time (the segment's first
  // stage keeps its input: less for the same time), an offload st_i for its copies, an option
  // a_i - a_i^k for its re-run.
  std::vector<int64_t> cap(n, 0);
  std::vector<double> rate(n, std::numeric_limits<double>::infinity());
  for (int i = 0; i < n; ++i) {
    const Stage& s = p.stages[i];
    auto consider = [&](int64_t dropped, int64_t ns) {
      if (dropped <= 0) return;
      cap[i] = std::max(cap[i], dropped);
      rate[i] = std::min(rate[i], static_cast<double>(ns) / static_cast<double>(dropped));
    };
    if (s.checkpointable) consider(stageStoreBytes(p, i), s.rerunCostNs());
    if (p.offloadBytesPerSecond > 0)
      consider(stageStoreBytes(p, i), p.offloadNs(stageStoreBytes(p, i)));
    for (const StageOption& o : s.options) consider(s.savedBytes - o.savedBytes, o.recomputeNs);
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return rate[a] < rate[b]; });
  std::vector<size_t> rank(n);
  std::vector<double> rates(n);
  for (int r = 0; r < n; ++r) {
    rank[order[r]] = static_cast<size_t>(r);
    rates[r] = std::isfinite(rate[order[r]]) ? rate[order[r]] : 0;
  }
  DropPrices prices(std::move(rates));

  // Every plan passes through each stage's forward and backward, and the chain's end of forward.
  // At stage t's, it holds S + sum over i < t of what stage i keeps, plus the least stage t
  // itself holds there in any of its modes (its input, saved bytes, output, working set and
  // gradients as docs/chain-model.md schedules them; a recomputed stage's backward holds its
  // segment's re-run stages, never less). So within the budget the stages before t must drop
  // at least (that moment with everything stored) - budget bytes: a knapsack on those stages.
  // The bound is the largest of these.
  long double bound = 0;
  int64_t storedBefore = 0;  // sum of st_i for i < t
  for (int t = 0; t < n; ++t) {
    const Stage& s = p.stages[t];
    const int64_t in = p.inBytes(t);
    // (Inside a recomputed segment the forward's working is the checkpointed one.)
    int64_t forwardWork = std::min(s.forwardWorkingBytes, s.checkpointedForwardWorking());
    int64_t backwardHeld = stageStoreBytes(p, t) + s.backwardWorkingBytes;
    for (const StageOption& o : s.options) {
      forwardWork = std::min(forwardWork, optionForwardWorkingBytes(s, o));
      backwardHeld = std::min(backwardHeld, in + o.savedBytes + optionBackwardWorkingBytes(s, o));
    }
    const int64_t forward = in + forwardWork + s.outputBytes + s.forwardOutsideBytes;
    const int64_t backward = backwardHeld + s.outputBytes + in + s.backwardOutsideBytes;
    const int64_t deficit =
        p.staticBytes + storedBefore + std::max(forward, backward) - budgetBytes;
    if (deficit > 0 && t > 0) bound = std::max(bound, prices.cheapest(deficit));
    if (cap[t] > 0 && std::isfinite(rate[t])) prices.add(rank[t], cap[t]);
    storedBefore += stageStoreBytes(p, t);
  }
  const int64_t endDeficit =
      p.staticBytes + storedBefore + 2 * p.outBytes(n - 1) + p.endOutsideBytes - budgetBytes;
  if (endDeficit > 0) bound = std::max(bound, prices.cheapest(endDeficit));
  // Rounded down: the optimum is a whole number of ns at least the bound, so rounding never
  // lifts the bound above it.
  return static_cast<int64_t>(std::floor(bound));
}

}  // namespace tidemark::core
