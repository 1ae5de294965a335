#include "src/advisor/grid_solver.h"

#include <algorithm>
#include <limits>

#include "src/advisor/simulator.h"
#include "src/advisor/stage_choices.h"

namespace tidemark::core {

namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
// m_choice codes: >= 0 a recomputed segment of code + 1 stages; kStored the stage with all its
// activations; kOption0 - o with option o; kOffloaded the stage offloaded; kNone nothing fits.
constexpr int32_t kNone = -1;
constexpr int32_t kStored = -2;
constexpr int32_t kOption0 = -3;
constexpr int32_t kOffloaded = std::numeric_limits<int32_t>::min();

int64_t floorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceilDiv(int64_t a, int64_t b) { return -floorDiv(-a, b); }

// For one grid value x: the segment ends k still open to a segment that starts at the stage being
// solved, each with prefixNs(k) + (the cost of stages k + 1 .. at headroom x). Ends grow towards
// the bottom; values strictly decrease towards it, so the least value over ends <= r is the
// deepest entry with an end <= r.
struct SegmentEnds {
  std::vector<int32_t> end;
  std::vector<int64_t> value;

  void push(int32_t k, int64_t v) {
    if (v >= kInf) return;
    while (!value.empty() && value.back() >= v) {
      value.pop_back();
      end.pop_back();
    }
    end.push_back(k);
    value.push_back(v);
  }
  void clear() {
    end.clear();
    value.clear();
  }
  // The least value over ends <= r and its end (kInf when none).
  std::pair<int64_t, int32_t> leastUpTo(int32_t r) const {
    if (end.empty()) return {kInf, -1};
    if (end.front() <= r) return {value.front(), end.front()};  // every end within reach
    const auto it = std::partition_point(end.begin(), end.end(), [r](int32_t e) { return e > r; });
    if (it == end.end()) return {kInf, -1};
    const size_t j = static_cast<size_t>(it - end.begin());
    return {value[j], end[j]};
  }
};

}  // namespace

int64_t GridChainSolver::Grid::value(int stage, int g) const {
  return offset[stage] + static_cast<int64_t>(g) * step;
}

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

int GridChainSolver::Grid::shifted(int g, int64_t shift) const {
  const int64_t x = g + shift;
  if (x < 0) return down ? -1 : 0;
  return static_cast<int>(std::min<int64_t>(x, points - 1));
}

namespace {

// One pass of the recurrence on the grid: the cost of stages i.. at every grid value of stage i,
// i from the last stage to the first. Returns stage 0's costs; `choice` (when given) gets every
// stage's choices.
std::vector<int64_t> solveOnGrid(const ChainProfile& p, const GridChainSolver::Grid& grid,
                                 std::vector<int32_t>* choice) {
  const int n = p.size();
  const int width = grid.points;
  std::vector<int64_t> next(width), cur(width);
  const int64_t endNeed = 2 * p.outBytes(n - 1) + p.endOutsideBytes;
  for (int g = 0; g < width; ++g) next[g] = grid.value(n, g) >= endNeed ? 0 : kInf;
  std::vector<int64_t> prefixNs(n + 1, 0);  // prefixNs[k + 1]: forward time of stages 0..k
  for (int k = 0; k < n; ++k) prefixNs[k + 1] = prefixNs[k] + p.stages[k].rerunCostNs();
  const int64_t top = grid.value(0, width - 1);
  std::vector<SegmentEnds> ends(width);
  std::vector<StageChoice> stored;
  std::vector<int64_t> segmentLocal;  // the need of segment [i, i + j]
  std::vector<int64_t> shifts;
  if (choice != nullptr) choice->assign(static_cast<size_t>(n) * width, kNone);

  for (int i = n - 1; i >= 0; --i) {
    const bool checkpointable = p.stages[i].checkpointable;
    // Segments that start before a stage that cannot be recomputed end before it, and so do
    // those that start before a stage not linked to the one before it.
    const bool endsHere = i + 1 < n && !p.stages[i + 1].linked;
    for (int x = 0; x < width; ++x) {
      if (checkpointable) {
        if (endsHere) ends[x].clear();
        ends[x].push(i, next[x] >= kInf ? kInf : prefixNs[i + 1] + next[x]);
      } else {
        ends[x].clear();
      }
    }
    storedChoices(p, i, &stored);
    segmentLocal.clear();
    if (checkpointable) {
      RecomputedSegment segment(p, i);
      for (int k = i; extends(p, i, k); ++k) {
        const int64_t local = segment.grow().local;
        if (local > top + grid.step) break;  // it only grows
        segmentLocal.push_back(local);
      }
    }
    const int64_t in = p.inBytes(i);
    size_t fitting = 0;  // segments [i, i + fitting - 1] fit under the grid value
    int32_t* row = choice != nullptr ? choice->data() + static_cast<size_t>(i) * width : nullptr;
    // Where each choice reads the next values: value g of stage i at g + shift (Grid::at and
    // atAnyStage without a division per value).
    shifts.clear();
    for (const StageChoice& c : stored) shifts.push_back(grid.shift(i, c.kept));
    const int64_t segmentShift = grid.shiftAnyStage(i, in);
    for (int g = 0; g < width; ++g) {
      const int64_t h = grid.value(i, g);
      int64_t best = kInf;
      int32_t code = kNone;
      for (size_t k = 0; k < stored.size(); ++k) {
        const StageChoice& c = stored[k];
        if (c.local > h || h < c.kept) continue;
        const int x = grid.shifted(g, shifts[k]);
        if (x < 0 || next[x] >= kInf) continue;
        if (next[x] + c.extraNs < best) {
          best = next[x] + c.extraNs;
          code = c.offload ? kOffloaded : c.option < 0 ? kStored : kOption0 - c.option;
        }
      }
      while (fitting < segmentLocal.size() && segmentLocal[fitting] <= h) ++fitting;
      if (fitting > 0 && h >= in) {
        const int x = grid.shifted(g, segmentShift);
        if (x >= 0) {
          const auto [value, end] = ends[x].leastUpTo(i + static_cast<int32_t>(fitting) - 1);
          if (value < kInf && value - prefixNs[i] < best) {
            best = value - prefixNs[i];
            code = end - i;
          }
        }
      }
      cur[g] = best;
      if (row != nullptr) row[g] = code;
    }
    std::swap(cur, next);
  }
  return next;
}

}  // namespace

GridChainSolver::GridChainSolver(const ChainProfile& profile, int rangePoints)
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
  m_step = std::max<int64_t>(1, (range + std::max(1, rangePoints) - 1) / std::max(1, rangePoints));
  const int64_t maxPoints =
      std::min<int64_t>(kMaxGridPoints, std::max<int64_t>(2, kMaxCells / std::max(1, n)));
  if (top / m_step + 1 > maxPoints) m_step = (top + maxPoints - 2) / (maxPoints - 1);
  m_grid = static_cast<int>((top + m_step - 1) / m_step);
  // Stage i's grid values are offset so that storing stage i leads exactly onto stage i + 1's:
  // a run of stored stages is not rounded, only the choices that keep less than storing.
  Grid grid;
  grid.step = m_step;
  grid.points = m_grid + 1;
  grid.offset.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    const int64_t kept = p.inBytes(i) + p.stages[i].savedBytes;
    grid.offset[i + 1] = ((grid.offset[i] - kept) % m_step + m_step) % m_step;
  }
  grid.down = true;
  const std::vector<int64_t> upper = solveOnGrid(p, grid, &m_choice);
  m_down = grid;
  grid.down = false;
  m_lower = solveOnGrid(p, grid, nullptr);
  m_up = grid;

  // The curve: the plan read at each grid value where the conservative cost falls, simulated
  // (its true peak may be below the grid value), and storing everything.
  std::vector<Point> found;
  int64_t last = kInf;
  for (int g = 0; g <= m_grid; ++g) {
    if (upper[g] >= last) continue;
    last = upper[g];
    const SimResult sim = simulate(p, planAt(g));
    found.push_back({sim.peakBytes, sim.extraNs, g});
  }
  found.push_back({storeAllSim.peakBytes, storeAllSim.extraNs, -1});
  std::sort(found.begin(), found.end(), [](const Point& a, const Point& b) {
    return a.budgetBytes != b.budgetBytes ? a.budgetBytes < b.budgetBytes : a.extraNs < b.extraNs;
  });
  for (const Point& pt : found)
    if (m_points.empty() || pt.extraNs < m_points.back().extraNs) m_points.push_back(pt);

  // The bound: a budget b in (grid value g - 1, grid value g] (above static) has an optimum no
  // cheaper than the optimistic cost at g; the first curve point as cheap lies at most epsilon
  // above b.
  for (int g = 0; g <= m_grid; ++g) {
    if (m_lower[g] >= kInf) continue;
    int64_t from = m_minFeasibleBudget;
    if (g > 0) from = std::max(from, p.staticBytes + (g - 1) * m_step + 1);
    if (from > p.staticBytes + g * m_step) continue;
    const auto it = std::partition_point(m_points.begin(), m_points.end(),
                                         [&](const Point& pt) { return pt.extraNs > m_lower[g]; });
    // Storing everything costs nothing: some point always qualifies.
    m_epsilonBytes = std::max(m_epsilonBytes, it->budgetBytes - from);
  }
}

ChainPlan GridChainSolver::planAt(int grid) const {
  if (grid < 0) return storeAllPlan(m_profile);
  const ChainProfile& p = m_profile;
  const int width = m_grid + 1;
  ChainPlan plan;
  int i = 0, g = grid;
  // The walk reads the next values where the pass did (Grid::shift, shiftAnyStage).
  while (i < p.size() && g >= 0) {
    const int32_t code = m_choice[static_cast<size_t>(i) * width + g];
    const Stage& s = p.stages[i];
    const int64_t in = p.inBytes(i);
    if (code >= 0) {
      plan.segments.push_back({i, i + code, SegmentMode::kRecompute, -1});
      g = m_down.shifted(g, m_down.shiftAnyStage(i, in));
      i += code + 1;
    } else if (code == kOffloaded) {
      plan.segments.push_back({i, i, SegmentMode::kOffload, -1});
      g = m_down.shifted(g, m_down.shift(i, 0));
      ++i;
    } else if (code == kStored || code <= kOption0) {
      const int o = code == kStored ? -1 : kOption0 - code;
      plan.segments.push_back({i, i, SegmentMode::kStore, o});
      g = m_down.shifted(g, m_down.shift(i, in + (o < 0 ? s.savedBytes : s.options[o].savedBytes)));
      ++i;
    } else {
      break;  // kNone: not reached from a grid value that had a plan
    }
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
  if (budgetBytes - m_profile.staticBytes > static_cast<int64_t>(m_grid) * m_step) return 0;
  return m_lower[g] >= kInf ? std::numeric_limits<int64_t>::max() : m_lower[g];
}

}  // namespace tidemark::core
