#include "src/advisor/stage_times.h"

#include <algorithm>
#include <functional>
#include <set>

namespace tidemark::core {
namespace {

// What a run costs a typical step: the mean of the runs, leaving out stalls (beyond 4x the
// median: a collection, a thread put off the core). Not the median: on a busy machine a block
// runs now fast, now slow, and a plan's recomputation per step is a sum of such runs, whose
// median the sum of medians falls short of by a fifth (measured, docs/plan-format.md).
int64_t typical(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  const int64_t median = v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
  int64_t sum = 0, n = 0;
  for (int64_t x : v) {
    if (x > 4 * median) break;
    sum += x;
    ++n;
  }
  return n > 0 ? sum / n : median;
}

// Calls run(scope, step index, re-run?) for every closed module scope of the steady steps that
// ran inside a forward or a recompute phase (the recording sorted by sequence number).
void eachRun(const Recording& rec,
             const std::function<void(const ScopeInterval&, int, bool)>& run) {
  std::vector<const StepInterval*> steps;
  for (const StepInterval& s : rec.steps)
    if (s.endSeq != kOpenSeq) steps.push_back(&s);
  if (steps.size() > 1) steps.erase(steps.begin());
  std::vector<std::vector<const PhaseInterval*>> forwards(steps.size()), recomputes(steps.size());
  auto stepOf = [&](uint64_t seq) -> int {
    auto it = std::upper_bound(steps.begin(), steps.end(), seq,
                               [](uint64_t q, const StepInterval* s) { return q < s->beginSeq; });
    if (it == steps.begin() || !(*(it - 1))->contains(seq)) return -1;
    return static_cast<int>(it - 1 - steps.begin());
  };
  for (const PhaseInterval& ph : rec.phases) {
    if (ph.endSeq == kOpenSeq) continue;
    const int t = stepOf(ph.beginSeq);
    if (t < 0) continue;
    if (ph.phase == Phase::kForward) forwards[t].push_back(&ph);
    if (ph.phase == Phase::kRecompute) recomputes[t].push_back(&ph);
  }
  auto inside = [](const std::vector<const PhaseInterval*>& phases, const ScopeInterval& sc) {
    return std::any_of(phases.begin(), phases.end(), [&](const PhaseInterval* ph) {
      return ph->beginSeq <= sc.beginSeq && sc.endSeq <= ph->endSeq;
    });
  };
  for (const ScopeInterval& sc : rec.scopes) {
    if (sc.endSeq == kOpenSeq) continue;
    const int t = stepOf(sc.beginSeq);
    if (t < 0) continue;
    if (inside(recomputes[t], sc)) {
      run(sc, t, true);
    } else if (inside(forwards[t], sc)) {
      run(sc, t, false);
    }
  }
}

}  // namespace

void addRecordedReruns(const Recording& rec, RerunSamples* into) {
  eachRun(rec, [&](const ScopeInterval& sc, int, bool rerun) {
    if (!rerun) return;
    std::vector<int64_t>& runs = (*into)[sc.name];
    if (runs.size() < kMaxRerunSamples) runs.push_back(sc.endTsNs - sc.beginTsNs);
  });
}

std::map<std::string, ModuleTimes> moduleTimesOverSteps(const Recording& rec,
                                                        const std::vector<std::string>& names,
                                                        const RerunSamples* rerunsFrom) {
  const std::set<std::string> wanted(names.begin(), names.end());
  // Per module: per step, its first forward; every re-run; the steps that re-ran it.
  std::map<std::string, std::map<int, int64_t>> forwardOf;
  RerunSamples reruns;
  std::map<std::string, std::set<int>> rerunSteps;
  eachRun(rec, [&](const ScopeInterval& sc, int t, bool rerun) {
    if (!wanted.count(sc.name)) return;
    const int64_t ns = sc.endTsNs - sc.beginTsNs;
    if (rerun) {
      reruns[sc.name].push_back(ns);
      rerunSteps[sc.name].insert(t);
    } else {
      forwardOf[sc.name].emplace(t, ns);  // the first call of the step (scopes come in order)
    }
  });
  std::map<std::string, ModuleTimes> out;
  for (const std::string& name : wanted) {
    ModuleTimes& m = out[name];
    std::vector<int64_t> fwd;
    for (const auto& [t, ns] : forwardOf[name])
      if (!rerunSteps[name].count(t)) fwd.push_back(ns);
    if (!fwd.empty()) {
      m.forwards = static_cast<int>(fwd.size());
      m.forwardNs = typical(fwd);
    }
    const std::vector<int64_t>* r = &reruns[name];
    if (rerunsFrom != nullptr) {
      auto there = rerunsFrom->find(name);
      if (there != rerunsFrom->end() && !there->second.empty()) r = &there->second;
    }
    if (!r->empty()) {
      m.reruns = static_cast<int>(r->size());
      m.rerunNs = typical(*r);
    }
  }
  return out;
}

double rerunOverForward(const std::map<std::string, ModuleTimes>& times) {
  int64_t forward = 0, rerun = 0;
  for (const auto& [name, m] : times) {
    if (m.forwards == 0 || m.reruns == 0) continue;
    forward += m.forwardNs;
    rerun += m.rerunNs;
  }
  return forward > 0 ? static_cast<double>(rerun) / static_cast<double>(forward) : 0.0;
}

}  // namespace tidemark::core
