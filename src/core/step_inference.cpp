#include "src/core/step_inference.h"

#include <algorithm>
#include <cmath>

namespace tidemark::core {

namespace {

struct Period {
  double events = 0;  // the period, in events (0: none)
  double correlation = 0;
};

// The period of events[from, end), if they repeat (see the header).
Period findPeriod(const std::vector<TotalPoint>& all, size_t from, double minCorrelation) {
  Period found;
  const size_t count = all.size() - from;
  if (count < 64) return found;
  // The series resampled to at most 4096 points by event index.
  const size_t n = std::min<size_t>(4096, count);
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = all[from + i * count / n].total;
  // Remove the linear trend: memory that only grows (or a slow leak) is not a repetition.
  double sumI = 0;
  double sumX = 0;
  double sumII = 0;
  double sumIX = 0;
  for (size_t i = 0; i < n; ++i) {
    const double fi = static_cast<double>(i);
    sumI += fi;
    sumX += x[i];
    sumII += fi * fi;
    sumIX += fi * x[i];
  }
  const double dn = static_cast<double>(n);
  const double slope = (dn * sumIX - sumI * sumX) / (dn * sumII - sumI * sumI);
  const double intercept = (sumX - slope * sumI) / dn;
  double var = 0;
  double scale = 0;
  for (size_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::abs(x[i]));
    x[i] -= intercept + slope * static_cast<double>(i);
    var += x[i] * x[i];
  }
  // Nothing left once the trend is gone (below a millionth of the signal): no period.
  if (var <= 1e-12 * scale * scale * dn) return found;

  // Autocorrelation, normalised by the overlap, for 2 to 64 repetitions (a period must repeat
  // at least twice to be seen).
  const size_t firstLag = n / 64 + 1;
  std::vector<double> r;  // r[k]: lag firstLag + k
  for (size_t lag = firstLag; lag <= n / 2; ++lag) {
    double c = 0;
    double a2 = 0;
    double b2 = 0;
    for (size_t i = 0; i + lag < n; ++i) {
      c += x[i] * x[i + lag];
      a2 += x[i] * x[i];
      b2 += x[i + lag] * x[i + lag];
    }
    r.push_back(c / std::sqrt(a2 * b2 + 1e-300));
  }
  // A period is a peak of the autocorrelation, past its first fall: at short lags any smooth
  // series correlates with itself (torch 2's per-layer ups and downs, under a slow swell, made 63
  // "steps" of 5 there). Among the peaks, prefer the shortest of near-equal ones (multiples of
  // the period correlate too).
  size_t k = 1;
  while (k < r.size() && r[k] <= r[k - 1]) ++k;  // the first fall ends at a minimum
  size_t bestLag = 0;
  double best = minCorrelation;
  for (; k + 1 < r.size(); ++k) {
    const bool peak = r[k] >= r[k - 1] && r[k] >= r[k + 1];
    if (peak && r[k] > best + 0.02) {
      best = r[k];
      bestLag = firstLag + k;
    }
  }
  if (bestLag == 0) return found;
  found.events = static_cast<double>(bestLag) * static_cast<double>(count) / dn;
  found.correlation = best;
  return found;
}

// The steps of events[from, end), given their period.
std::vector<StepInterval> stepsOf(const std::vector<TotalPoint>& all, size_t from, double period) {
  std::vector<StepInterval> steps;
  // Where in the period memory is lowest (the moment between two steps): fold the series on the
  // period, leaving out the first period (start-up and the first step differ from the rest).
  const size_t p = static_cast<size_t>(period);
  if (p == 0) return steps;
  std::vector<double> folded(p, 0.0);
  std::vector<int> counts(p, 0);
  for (size_t i = from + p; i < all.size(); ++i) {
    folded[(i - from) % p] += all[i].total;
    counts[(i - from) % p] += 1;
  }
  size_t phase = 0;
  for (size_t k = 0; k < p; ++k) {
    if (counts[k] > 0 &&
        (counts[phase] == 0 || folded[k] / counts[k] < folded[phase] / counts[phase])) {
      phase = k;
    }
  }
  // Boundaries near phase + k * period, each the lowest point within a quarter period of it.
  auto lowestIn = [&](double lo, double hi) {
    const size_t a = static_cast<size_t>(std::max(static_cast<double>(from), lo));
    const size_t b = std::min(all.size(), static_cast<size_t>(std::max(0.0, hi)));
    size_t at = a;
    for (size_t i = a; i < b; ++i) {
      if (all[i].total < all[at].total) at = i;
    }
    return at;
  };
  std::vector<size_t> bounds;
  for (double c = static_cast<double>(from + phase);
       c - period / 4 < static_cast<double>(all.size()); c += period) {
    const size_t at = lowestIn(c - period / 4, c + period / 4);
    if (at >= all.size()) break;
    if (!bounds.empty() && static_cast<double>(at - bounds.back()) < period / 2) continue;
    bounds.push_back(at);
  }
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    StepInterval s;
    s.inferred = true;
    s.step = static_cast<int64_t>(i) + 1;
    s.beginSeq = all[bounds[i]].seq + 1;
    s.beginTsNs = all[bounds[i]].ts;
    s.endSeq = all[bounds[i + 1]].seq + 1;
    s.endTsNs = all[bounds[i + 1]].ts;
    steps.push_back(s);
  }
  return steps;
}

// Where the repetition found in events[from, end) begins: from, moved back a period at a time
// while the period before it has the shape of the one after it (Pearson correlation of the
// totals at least 0.8).
size_t earliestRepetition(const std::vector<TotalPoint>& all, size_t from, double period) {
  const size_t p = static_cast<size_t>(period);
  if (p < 2) return from;
  auto similar = [&](size_t a, size_t b) {  // events [a, a + p) against [b, b + p)
    double ma = 0;
    double mb = 0;
    for (size_t i = 0; i < p; ++i) {
      ma += all[a + i].total;
      mb += all[b + i].total;
    }
    ma /= static_cast<double>(p);
    mb /= static_cast<double>(p);
    double c = 0;
    double va = 0;
    double vb = 0;
    for (size_t i = 0; i < p; ++i) {
      const double da = all[a + i].total - ma;
      const double db = all[b + i].total - mb;
      c += da * db;
      va += da * da;
      vb += db * db;
    }
    return va > 0 && vb > 0 && c / std::sqrt(va * vb) >= 0.8;
  };
  size_t start = from;
  while (start >= p && start + p <= all.size() && similar(start - p, start)) start -= p;
  return start;
}

}  // namespace

bool stepsToInfer(const Recording& recording) {
  return recording.steps.empty() && recording.phases.empty();
}

std::vector<StepInterval> inferSteps(const LivenessReplay& replay, double minCorrelation) {
  std::vector<TotalPoint> events;
  replay.forEachState([&](const MemoryState& s) {
    events.push_back({s.seq, s.tsNs, static_cast<double>(s.trackedBytes)});
  });
  return inferSteps(events, minCorrelation);
}

std::vector<StepInterval> inferSteps(const std::vector<TotalPoint>& events, double minCorrelation) {
  // The whole recording, then its second half, its last quarter, ...: a start-up (imports,
  // building the model, loading data) can make most of a short job's events and hide the steps'
  // repetition. The longest tail that repeats gives the steps (before, the full recording's
  // alone was asked; a shorter tail than needed can repeat at a finer grain: a model's layers).
  for (size_t tail = events.size(); tail >= 64; tail /= 2) {
    const size_t from = events.size() - tail;
    const Period p = findPeriod(events, from, minCorrelation);
    if (p.events > 0) return stepsOf(events, earliestRepetition(events, from, p.events), p.events);
  }
  return {};
}

}  // namespace tidemark::core
