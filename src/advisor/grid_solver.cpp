#include "src/advisor/grid_solver.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <exception>
#include <latch>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>

#include "src/advisor/simulator.h"
#include "src/advisor/stage_choices.h"

namespace tidemark::core {

namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
// m_choice codes: kNone nothing fits; >= 0 a recomputed segment of (code >> 1) + 1 stages; <= -2
// the stage stored with storedChoices()'s choice (-2 - code) >> 1. The low bit says where the
// choice's tail was read: at the grid value rounded down (0), or at the one above it (1), taken
// when the plan there still fits exactly.
constexpr int32_t kNone = -1;
int32_t segmentCode(int stages, bool above) { return (stages - 1) << 1 | int32_t{above}; }
int32_t storedCode(size_t choice, bool above) {
  return -2 - (static_cast<int32_t>(choice) << 1 | int32_t{above});
}

int64_t floorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceilDiv(int64_t a, int64_t b) { return -floorDiv(-a, b); }

// For each grid value x: the segment ends k still open to a segment that starts at the stage
// being solved, each with prefixNs(k) + (the cost of stages k + 1 .. at headroom x) and the exact
// need of that tail's plan. Ends grow towards the bottom; values strictly decrease towards it, so
// the least value over ends <= r is the deepest entry with an end <= r. Most stacks hold one or
// two entries: the bottom kInline of every stack lie side by side in one array (a pass walks the
// grid values in order), the rest in a vector of the grid value's own. kNeed: the entries carry
// their tail's exact need (the plans' pass); the bound's pass has none to carry, and its entries
// are two thirds the size.
template <bool kNeed>
struct SegmentEnd {
  int64_t value;
  int32_t end;
  int64_t need;
};
template <>
struct SegmentEnd<false> {
  int64_t value;
  int32_t end;
  static constexpr int64_t need = 0;
};

template <bool kNeed>
class SegmentEndStacks {
 public:
  using End = SegmentEnd<kNeed>;

  explicit SegmentEndStacks(int width)
      : m_inline(static_cast<size_t>(width) * kInline), m_size(width, 0), m_spill(width) {}

  void clear(int x) {
    if (m_size[x] > kInline) m_spill[x].clear();
    m_size[x] = 0;
  }
  void push(int x, int32_t k, int64_t v, int64_t need) {
    if (v >= kInf) return;
    int s = m_size[x];
    if (s > kInline) {
      std::vector<End>& spill = m_spill[x];
      while (!spill.empty() && spill.back().value >= v) spill.pop_back();
      s = kInline + static_cast<int>(spill.size());
      if (!spill.empty()) {
        spill.push_back(make(v, k, need));
        m_size[x] = s + 1;
        return;
      }
    }
    End* bottom = &m_inline[static_cast<size_t>(x) * kInline];
    while (s > 0 && bottom[s - 1].value >= v) --s;
    if (s < kInline)
      bottom[s] = make(v, k, need);
    else
      m_spill[x].push_back(make(v, k, need));
    m_size[x] = s + 1;
  }
  // The least value over ends <= r at grid value x (nullptr when none).
  const End* leastUpTo(int x, int32_t r) const {
    const int s = m_size[x];
    if (s == 0) return nullptr;
    if (at(x, 0).end <= r) return &at(x, 0);  // every end within reach
    int lo = 1, hi = s;                       // the first entry with an end <= r
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (at(x, mid).end > r)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo == s ? nullptr : &at(x, lo);
  }

 private:
  static constexpr int kInline = 2;
  static End make(int64_t v, int32_t k, int64_t need) {
    if constexpr (kNeed)
      return {v, k, need};
    else
      return {v, k};
  }
  const End& at(int x, int d) const {
    return d < kInline ? m_inline[static_cast<size_t>(x) * kInline + d] : m_spill[x][d - kInline];
  }
  std::vector<End> m_inline;
  std::vector<int> m_size;
  std::vector<std::vector<End>> m_spill;
};

}  // namespace

int GridChainSolver::Grid::at(int stage, int64_t headroom) const {
  if (headroom < 0) return -1;
  const int64_t y = headroom - offset[stage];
  int64_t g;
  if (down)
    g = y < 0 ? -1 : y / step;
  else
    g = y <= 0 ? 0 : (y + step - 1) / step;
  return static_cast<int>(std::min<int64_t>(g, points - 1));
}

int64_t GridChainSolver::Grid::shift(int stage, int64_t kept) const {
  const int64_t d = offset[stage] - kept - offset[stage + 1];
  return down ? floorDiv(d, step) : ceilDiv(d, step);
}

int64_t GridChainSolver::Grid::shiftAnyStage(int stage, int64_t kept) const {
  return down ? floorDiv(offset[stage] - kept - (step - 1), step)
              : ceilDiv(offset[stage] - kept, step);
}

namespace {

// A grid of `points` values `step` apart. Stage i's values are offset so that storing stage i
// leads exactly onto stage i + 1's: a run of stored stages is not rounded, only the choices that
// keep less than storing.
GridChainSolver::Grid makeGrid(const ChainProfile& p, const std::vector<int64_t>& storeNeed,
                               int64_t step, int points, bool down) {
  GridChainSolver::Grid grid;
  grid.step = step;
  grid.points = points;
  grid.down = down;
  grid.offset.assign(p.size() + 1, 0);
  for (int i = 0; i < p.size(); ++i) {
    const int64_t kept = p.inBytes(i) + p.stages[i].savedBytes;
    grid.offset[i + 1] = ((grid.offset[i] - kept) % step + step) % step;
  }
  grid.top.resize(p.size() + 1);
  for (int i = 0; i <= p.size(); ++i) {
    const int64_t y = storeNeed[i] - grid.offset[i];
    grid.top[i] = static_cast<int>(std::min<int64_t>(points - 1, y <= 0 ? 0 : ceilDiv(y, step)));
  }
  return grid;
}

// The headroom storing every stage from i on takes (i = n: the end of the forward alone); it
// only grows towards the chain's start. *mostChoices: the most stored choices a stage has.
std::vector<int64_t> storeAllNeeds(const ChainProfile& p, size_t* mostChoices) {
  const int n = p.size();
  std::vector<int64_t> need(n + 1);
  need[n] = 2 * p.outBytes(n - 1) + p.endOutsideBytes;
  std::vector<StageChoice> stored;
  *mostChoices = 0;
  for (int i = n - 1; i >= 0; --i) {
    storedChoices(p, i, &stored);
    need[i] = std::max(stored[0].local, stored[0].kept + need[i + 1]);
    *mostChoices = std::max(*mostChoices, stored.size());
  }
  return need;
}

// What a pass leaves at stage 0: the cost at each grid value and, conservatively, the exact need
// of the plan behind it (the headroom it takes above static: its peak less static).
struct PassResult {
  std::vector<int64_t> cost;
  std::vector<int64_t> need;
};

// One pass of the recurrence on the grid: the cost of stages i.. at every grid value of stage i,
// i from the last stage to the first; `choice` (when given) gets every stage's choices, row i at
// rowStart[i], up to the stage's top. A row is computed up to its top only: above it storing
// every stage from i on fits, at no cost (its need storeNeed[i]), which is what a read there
// finds.
//
// Conservatively (kDown) each cell also carries the exact need of its plan: a choice's need is the
// larger of its own and what it keeps plus its tail's. The tail is read at the grid value rounded
// down, which always fits, and at the one above it, taken when cheaper and its plan's exact need
// still fits: rounding then loses nothing where the plan above had room to spare.
template <bool kDown>
PassResult solveOnGrid(const ChainProfile& p, const GridChainSolver::Grid& grid,
                       const std::vector<int64_t>& storeNeed, GridChainSolver::ChoiceTable* choice,
                       const std::vector<size_t>& rowStart, int threads) {
  const int n = p.size();
  const int width = grid.points;
  // Row i + 1 (the next values) and row i, in turn: rows[i & 1] is row i's.
  std::vector<int64_t> rows[2] = {std::vector<int64_t>(width), std::vector<int64_t>(width)};
  // Their plans' exact needs (conservatively; the bound carries none).
  const int needWidth = kDown ? width : 0;
  std::vector<int64_t> needs[2] = {std::vector<int64_t>(needWidth),
                                   std::vector<int64_t>(needWidth)};
  const int64_t endNeed = storeNeed[n];
  for (int g = 0; g <= grid.top[n]; ++g) {
    rows[n & 1][g] = grid.value(n, g) >= endNeed ? 0 : kInf;
    if constexpr (kDown) needs[n & 1][g] = endNeed;
  }
  std::vector<int64_t> prefixNs(n + 1, 0);  // prefixNs[k + 1]: forward time of stages 0..k
  for (int k = 0; k < n; ++k) prefixNs[k + 1] = prefixNs[k] + p.stages[k].rerunCostNs();
  SegmentEndStacks<kDown> ends(width);
  const std::vector<int64_t> gradientAhead = leastOutputAhead(p);
  if (choice != nullptr) choice->assign(rowStart[n], kNone);

  // A stage is two phases, each split between the threads by grid value: the next row read
  // from this one (past its own top it costs nothing) and the segment ends pushed; then this
  // row. Each thread works on its own values, the phases apart (a barrier).
  std::barrier sync(threads);
  std::latch started(1);
  int active = threads;  // the threads that run: set before `started` opens
  std::atomic<bool> failed{false};
  std::vector<std::exception_ptr> errors(threads);
  const auto part = [&active](int thread, int last) {  // [begin, end) of 0 .. last
    const int64_t count = int64_t{last} + 1;
    return std::pair<int, int>(static_cast<int>(count * thread / active),
                               static_cast<int>(count * (thread + 1) / active));
  };
  const auto work = [&](int thread) {
    started.wait();
    std::vector<StageChoice> stored;
    std::vector<int64_t> segmentLocal;  // the need of segment [i, i + j]
    // Non-decreasing in j, for the search of segment ends: down, the most of segmentLocal up to
    // j (a segment is taken only where every shorter one fits: plans that fit); up, the least any
    // segment from [i, i + j] on needs (every segment that may fit is taken: a bound). A
    // segment's need itself may fall as it grows (its last stage's gradient is held through its
    // re-run).
    std::vector<int64_t> segmentReach;
    // Down: the least any segment from [i, i + j] on needs, as up. A segment past the first that
    // does not fit may fit (a smaller last gradient): the cheapest end up to there is taken too
    // when its own need fits.
    std::vector<int64_t> segmentWide;
    std::vector<int64_t> shifts;
    int filled = grid.top[n];  // the next row holds values up to here
    for (int i = n - 1; i >= 0 && !failed.load(std::memory_order_relaxed); --i) {
      std::vector<int64_t>& next = rows[(i + 1) & 1];
      std::vector<int64_t>& nextNeed = needs[(i + 1) & 1];
      std::vector<int64_t>& cur = rows[i & 1];
      std::vector<int64_t>& curNeed = needs[i & 1];
      // This row's values, and the next row's read from it (up to one value above this row's
      // top, where a choice keeping less than storing may read). Rows only grow towards the
      // chain's start, so a stack above the last row's reach is still empty.
      const int top = grid.top[i];
      const int reads = std::min(width - 1, top + 1);
      try {
        const auto [xBegin, xEnd] = part(thread, reads);
        for (int x = std::max(filled + 1, xBegin); x < xEnd; ++x) {
          next[x] = 0;
          if constexpr (kDown) nextNeed[x] = storeNeed[i + 1];
        }
        const bool checkpointable = p.stages[i].checkpointable;
        // Segments that start before a stage that cannot be recomputed end before it, and so
        // do those that start before a stage not linked to the one before it.
        const bool endsHere = i + 1 < n && !p.stages[i + 1].linked;
        for (int x = xBegin; x < xEnd; ++x) {
          if (checkpointable) {
            if (endsHere) ends.clear(x);
            ends.push(x, i, next[x] >= kInf ? kInf : prefixNs[i + 1] + next[x],
                      kDown ? nextNeed[x] : 0);
          } else {
            ends.clear(x);
          }
        }
        // (Each thread its own copy of the stage's choices: cheaper than a third barrier.)
        storedChoices(p, i, &stored);
        segmentLocal.clear();
        segmentReach.clear();
        segmentWide.clear();
        if (checkpointable) {
          RecomputedSegment segment(p, i);
          int64_t most = 0;
          for (int k = i; extends(p, i, k); ++k) {
            const int64_t local = segment.grow().local;
            most = std::max(most, local);
            const int64_t wide = segment.leastNeedFromHereOn(gradientAhead[k]);
            // It only grows, and no value of the row fits.
            if (wide > grid.value(i, top)) break;
            segmentLocal.push_back(local);
            segmentReach.push_back(kDown ? most : wide);
            if constexpr (kDown) segmentWide.push_back(wide);
          }
        }
      } catch (...) {
        errors[thread] = std::current_exception();
        failed = true;
      }
      sync.arrive_and_wait();
      if (failed.load()) break;
      try {
        const int64_t in = p.inBytes(i);
        size_t fitting = 0;  // segments [i, i + fitting - 1] fit under the grid value
        size_t mayFit = 0;   // down: segments past those may, up to [i, i + mayFit - 1]
        const size_t row = choice != nullptr ? rowStart[i] : 0;
        // Where each choice reads the next values: value g of stage i at g + shift (Grid::at and
        // atAnyStage without a division per value).
        shifts.clear();
        for (const StageChoice& c : stored) shifts.push_back(grid.shift(i, c.kept));
        const int64_t segmentShift = grid.shiftAnyStage(i, in);
        const auto [gBegin, gEnd] = part(thread, top);
        for (int g = gBegin; g < gEnd; ++g) {
          const int64_t h = grid.offset[i] + static_cast<int64_t>(g) * grid.step;
          int64_t best = kInf, bestNeed = 0;
          int32_t code = kNone;
          // The tail at grid value x of the next stage (or of any stage, for a segment) for a
          // choice with this cost, local need and kept bytes: taken when cheaper and, above the
          // rounded value, when it fits.
          const auto consider = [&](int64_t cost, int64_t local, int64_t kept, int64_t tailNeed,
                                    int32_t choiceCode) {
            if (cost >= best) return;
            const int64_t need = kDown ? std::max(local, kept + tailNeed) : 0;
            if (kDown && need > h) return;
            best = cost;
            bestNeed = need;
            code = choiceCode;
          };
          for (size_t k = 0; k < stored.size(); ++k) {
            const StageChoice& c = stored[k];
            if (c.local > h || h < c.kept) continue;
            if constexpr (kDown) {
              const int64_t raw = g + shifts[k];
              if (raw >= width - 1) {
                if (next[width - 1] < kInf)
                  consider(next[width - 1] + c.extraNs, c.local, c.kept, nextNeed[width - 1],
                           storedCode(k, false));
                continue;
              }
              if (raw >= 0 && next[raw] < kInf)
                consider(next[raw] + c.extraNs, c.local, c.kept, nextNeed[raw],
                         storedCode(k, false));
              if (raw + 1 >= 0 && next[raw + 1] < kInf)
                consider(next[raw + 1] + c.extraNs, c.local, c.kept, nextNeed[raw + 1],
                         storedCode(k, true));
            } else {
              const int x = grid.shifted(g, shifts[k]);
              if (x >= 0 && next[x] < kInf)
                consider(next[x] + c.extraNs, c.local, c.kept, 0, storedCode(k, false));
            }
          }
          while (fitting < segmentReach.size() && segmentReach[fitting] <= h) ++fitting;
          if constexpr (kDown)
            while (mayFit < segmentWide.size() && segmentWide[mayFit] <= h) ++mayFit;
          if ((fitting > 0 || mayFit > 0) && h >= in) {
            const int32_t reach = i + static_cast<int32_t>(fitting) - 1;
            const int32_t wideReach = i + static_cast<int32_t>(mayFit) - 1;
            const auto segmentAt = [&](int64_t x, bool above) {
              if (fitting > 0) {
                const auto* e = ends.leastUpTo(static_cast<int>(x), reach);
                if (e != nullptr)
                  consider(e->value - prefixNs[i], segmentLocal[e->end - i], in, e->need,
                           segmentCode(e->end - i + 1, above));
              }
              // Down, past them: the cheapest end up to the longest that may fit, taken when its
              // plan fits (a cheaper shorter end that does not fit hides the longer ones that it
              // is cheaper than: a plan may be missed there, never one taken that does not fit).
              if (kDown && wideReach > reach) {
                const auto* e = ends.leastUpTo(static_cast<int>(x), wideReach);
                if (e != nullptr && e->end > reach)
                  consider(e->value - prefixNs[i], segmentLocal[e->end - i], in, e->need,
                           segmentCode(e->end - i + 1, above));
              }
            };
            if constexpr (kDown) {
              const int64_t raw = g + segmentShift;
              if (raw >= width - 1) {
                segmentAt(width - 1, false);
              } else {
                if (raw >= 0) segmentAt(raw, false);
                if (raw + 1 >= 0) segmentAt(raw + 1, true);
              }
            } else {
              const int x = grid.shifted(g, segmentShift);
              if (x >= 0) segmentAt(x, false);
            }
          }
          cur[g] = best;
          if constexpr (kDown) curNeed[g] = bestNeed;
          if (choice != nullptr) choice->set(row + g, code);
        }
      } catch (...) {
        errors[thread] = std::current_exception();
        failed = true;
      }
      filled = top;
      sync.arrive_and_wait();
    }
  };
  // The other threads; those that could not be started leave the barrier, and the values are
  // shared among those that run (this one alone, at worst).
  std::vector<std::thread> helpers;
  try {
    for (int t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  } catch (const std::system_error&) {
  }
  active = 1 + static_cast<int>(helpers.size());
  for (int t = active; t < threads; ++t) sync.arrive_and_drop();
  started.count_down();
  work(0);
  for (std::thread& t : helpers) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<int64_t>& first = rows[0];
  std::vector<int64_t>& firstNeed = needs[0];
  for (int x = grid.top[0] + 1; x < width; ++x) {
    first[x] = 0;
    if constexpr (kDown) firstNeed[x] = storeNeed[0];
  }
  return {std::move(first), std::move(firstNeed)};
}

}  // namespace

GridChainSolver::GridChainSolver(const ChainProfile& profile, int rangePoints, int threads)
    : m_profile(profile) {
  const ChainProfile& p = profile;
  const int n = p.size();
  m_minFeasibleBudget = OptimalChainSolver(p, 0).minFeasibleBudget();
  const ChainPlan storeAll = storeAllPlan(p);
  const SimResult storeAllSim = simulate(p, storeAll);
  // The grid spans every headroom a stage can be asked for: storing all of stages i.. needs no
  // more than storing all of the chain, the top value.
  const int64_t top = std::max<int64_t>(0, storeAllSim.peakBytes - p.staticBytes);
  const int64_t range =
      std::max<int64_t>(1, storeAllSim.peakBytes - std::max(m_minFeasibleBudget, p.staticBytes));
  // The plans' grid: rangePoints values across the range, fewer when the plans' table would
  // pass its bounds. The bound's grid has no table: it is finer, as far as its pass's cells allow.
  // A row holds a stage's values up to its store-all need (Grid::top), at most need / step + 2
  // of them: the rows' values in all are at most the needs' sum / step + 2 per stage.
  size_t choices = 0;  // the most stored choices a stage has
  const std::vector<int64_t> storeNeed = storeAllNeeds(p, &choices);
  __int128 needSum = 0;
  for (int i = 0; i < n; ++i) needSum += storeNeed[i];
  const int64_t points = std::max(1, rangePoints);
  const auto stepFor = [&](int64_t rangeValues, int64_t maxValues, int64_t maxCells) {
    int64_t step = std::max<int64_t>(1, (range + rangeValues - 1) / rangeValues);
    if (top / step + 1 > maxValues) step = (top + maxValues - 2) / (maxValues - 1);
    const int64_t spare = maxCells - 2 * (int64_t{n} + 1);
    if (spare <= 0) return std::max<int64_t>(1, top);
    const __int128 least = (needSum + spare - 1) / spare;
    return least > step ? static_cast<int64_t>(std::min<__int128>(least, top + 1)) : step;
  };
  // The table's codes fit in 2 bytes when the longest segment's and the last stored choice's do.
  m_choice.wide = segmentCode(std::max(1, n), true) > std::numeric_limits<int16_t>::max() ||
                  storedCode(choices, true) < std::numeric_limits<int16_t>::min();
  m_step = stepFor(points, kMaxGridPoints, kMaxTableBytes / (m_choice.wide ? 4 : 2));
  m_grid = static_cast<int>((top + m_step - 1) / m_step);
  m_down = makeGrid(p, storeNeed, m_step, m_grid + 1, /*down=*/true);
  m_rowStart.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) m_rowStart[i + 1] = m_rowStart[i] + m_down.top[i] + 1;
  const int64_t boundStep =
      std::min(m_step, stepFor(points * kBoundRefinement, kMaxBoundPoints,
                               std::min(kMaxBoundCells, kBoundCellsPerStage * std::max(1, n))));
  m_up = makeGrid(p, storeNeed, boundStep, static_cast<int>((top + boundStep - 1) / boundStep) + 1,
                  /*down=*/false);
  // The passes in turn, each shared among the processors (kMaxThreads at most) when it is
  // long enough to gain from it.
  const auto threadsFor = [threads](const Grid& grid) {
    if (threads > 0) return threads;
    int64_t cells = 0;
    for (int top : grid.top) cells += top + 1;
    const int cpus = static_cast<int>(std::thread::hardware_concurrency());
    return cells < kCellsPerThread ? 1 : std::clamp(cpus, 1, kMaxThreads);
  };
  const PassResult upper =
      solveOnGrid<true>(p, m_down, storeNeed, &m_choice, m_rowStart, threadsFor(m_down));
  m_lower = solveOnGrid<false>(p, m_up, storeNeed, nullptr, {}, threadsFor(m_up)).cost;

  // The curve: the plan read at each grid value where the conservative cost falls, at its exact
  // peak (static and its need, which may be below the grid value, or the floor), and storing
  // everything.
  std::vector<Point> found;
  int64_t last = kInf;
  for (int g = 0; g <= m_grid; ++g) {
    if (upper.cost[g] >= last) continue;
    last = upper.cost[g];
    found.push_back({std::max(p.floorBytes, p.staticBytes + upper.need[g]), upper.cost[g], g});
  }
  found.push_back({storeAllSim.peakBytes, storeAllSim.extraNs, -1});
  std::sort(found.begin(), found.end(), [](const Point& a, const Point& b) {
    return a.budgetBytes != b.budgetBytes ? a.budgetBytes < b.budgetBytes : a.extraNs < b.extraNs;
  });
  for (const Point& pt : found)
    if (m_points.empty() || pt.extraNs < m_points.back().extraNs) m_points.push_back(pt);

  // The bound: a budget b in (bound grid value g - 1, g] (above static) has an optimum no
  // cheaper than the optimistic cost at g; the first curve point as cheap lies at most epsilon
  // above b.
  for (int g = 0; g < m_up.points; ++g) {
    if (m_lower[g] >= kInf) continue;
    int64_t from = m_minFeasibleBudget;
    if (g > 0) from = std::max(from, p.staticBytes + (g - 1) * m_up.step + 1);
    if (from > p.staticBytes + g * m_up.step) continue;
    const auto it = std::partition_point(m_points.begin(), m_points.end(),
                                         [&](const Point& pt) { return pt.extraNs > m_lower[g]; });
    // Storing everything costs nothing: some point always qualifies.
    m_epsilonBytes = std::max(m_epsilonBytes, it->budgetBytes - from);
  }
}

ChainPlan GridChainSolver::planAt(int grid) const {
  if (grid < 0) return storeAllPlan(m_profile);
  const ChainProfile& p = m_profile;
  ChainPlan plan;
  int i = 0, g = grid;
  // The walk reads the next values where the pass did (Grid::shift, shiftAnyStage).
  std::vector<StageChoice> stored;
  while (i < p.size() && g >= 0) {
    if (g > m_down.top[i]) {
      // Above the row's top: this stage and every one after it stored.
      for (; i < p.size(); ++i) plan.segments.push_back({i, i, SegmentMode::kStore});
      break;
    }
    const int32_t code = m_choice.get(m_rowStart[i] + g);
    if (code == kNone) break;  // not reached from a grid value that had a plan
    const int64_t in = p.inBytes(i);
    const bool above = (code >= 0 ? code : -2 - code) & 1;
    int64_t shift = 0;
    if (code >= 0) {
      const int stages = (code >> 1) + 1;
      plan.segments.push_back({i, i + stages - 1, SegmentMode::kRecompute, -1});
      shift = m_down.shiftAnyStage(i, in);
      i += stages;
    } else {
      storedChoices(p, i, &stored);
      const StageChoice& c = stored[static_cast<size_t>((-2 - code) >> 1)];
      plan.segments.push_back(
          {i, i, c.offload ? SegmentMode::kOffload : SegmentMode::kStore, c.option});
      shift = m_down.shift(i, c.kept);
      ++i;
    }
    // Where the pass read the tail: rounded down (clamped at the top), or the value above it.
    const int64_t raw = g + shift;
    g = raw >= m_grid ? m_grid : static_cast<int>(raw) + (above ? 1 : 0);
  }
  return plan;
}

std::vector<ParetoPoint> GridChainSolver::curve() const {
  std::vector<ParetoPoint> out;
  out.reserve(m_points.size());
  for (const Point& pt : m_points) out.push_back({pt.budgetBytes, pt.extraNs});
  return out;
}

std::optional<ChainPlan> GridChainSolver::planFor(int64_t budgetBytes) const {
  const auto it = std::partition_point(m_points.begin(), m_points.end(), [&](const Point& pt) {
    return pt.budgetBytes <= budgetBytes;
  });
  if (it == m_points.begin()) return std::nullopt;
  return planAt(std::prev(it)->grid);
}

int64_t GridChainSolver::lowerBoundAt(int64_t budgetBytes) const {
  if (budgetBytes < m_minFeasibleBudget) return std::numeric_limits<int64_t>::max();
  const int g = m_up.at(0, budgetBytes - m_profile.staticBytes);
  if (g < 0) return std::numeric_limits<int64_t>::max();
  // Past the grid's top storing everything fits: nothing to add.
  if (budgetBytes - m_profile.staticBytes > static_cast<int64_t>(m_up.points - 1) * m_up.step)
    return 0;
  return m_lower[g] >= kInf ? std::numeric_limits<int64_t>::max() : m_lower[g];
}

}  // namespace tidemark::core
