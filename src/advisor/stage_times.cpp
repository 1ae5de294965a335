#include "src/advisor/stage_times.h"

#include <algorithm>
#include <functional>
#include <set>
#include <string_view>

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

// Calls run(scope, step, re-run?) for every closed module scope of the steady steps that ran
// inside a forward or a recompute phase (the recording sorted by sequence number).
void eachRun(const Recording& rec,
             const std::function<void(const ScopeInterval&, const StepInterval&, bool)>& run) {
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
      run(sc, *steps[static_cast<size_t>(t)], true);
    } else if (inside(forwards[t], sc)) {
      run(sc, *steps[static_cast<size_t>(t)], false);
    }
  }
}

}  // namespace

std::string PlannedPolicies::at(int64_t step, const std::string& name) const {
  auto it = std::upper_bound(
      fromStep.begin(), fromStep.end(), step,
      [](int64_t s, const std::pair<int64_t, std::map<std::string, std::string>>& e) {
        return s < e.first;
      });
  if (it == fromStep.begin()) return "";
  // The module's own, or its parent's: a module inside a block re-run under a policy re-ran
  // under it too (what it re-ran is the policy's doing, not a whole re-run of it).
  const std::map<std::string, std::string>& policies = (it - 1)->second;
  if (policies.empty()) return "";
  for (std::string_view module = name;;) {
    if (auto p = policies.find(std::string(module)); p != policies.end()) return p->second;
    const size_t dot = module.rfind('.');
    if (dot == std::string_view::npos) return "";
    module = module.substr(0, dot);
  }
}

void addRecordedReruns(const Recording& rec, const PlannedPolicies& policies, RerunSamples* into) {
  eachRun(rec, [&](const ScopeInterval& sc, const StepInterval& step, bool rerun) {
    if (!rerun) return;
    std::vector<int64_t>& runs = (*into)[{sc.name, policies.at(step.step, sc.name)}];
    if (runs.size() < kMaxRerunSamples) runs.push_back(sc.endTsNs - sc.beginTsNs);
  });
}

std::map<std::string, ModuleTimes> moduleTimesOverSteps(const Recording& rec,
                                                        const std::vector<std::string>& names,
                                                        const RerunSamples* rerunsFrom,
                                                        const PlannedPolicies* policies) {
  const std::set<std::string> wanted(names.begin(), names.end());
  // Per module: per step, its first forward; every re-run (by policy); the steps that re-ran it.
  std::map<std::string, std::map<int64_t, int64_t>> forwardOf;
  RerunSamples reruns;
  std::map<std::string, std::set<int64_t>> rerunSteps;
  eachRun(rec, [&](const ScopeInterval& sc, const StepInterval& step, bool rerun) {
    if (!wanted.count(sc.name)) return;
    const int64_t ns = sc.endTsNs - sc.beginTsNs;
    if (rerun) {
      reruns[{sc.name, policies ? policies->at(step.step, sc.name) : ""}].push_back(ns);
      rerunSteps[sc.name].insert(step.step);
    } else {
      forwardOf[sc.name].emplace(step.step, ns);  // the first call of the step (in order)
    }
  });
  // Re-runs recorded elsewhere replace the recording's own, module and policy by module and
  // policy.
  auto samplesOf = [&](const RerunKey& key) -> const std::vector<int64_t>* {
    if (rerunsFrom != nullptr) {
      auto there = rerunsFrom->find(key);
      if (there != rerunsFrom->end() && !there->second.empty()) return &there->second;
    }
    auto here = reruns.find(key);
    return here == reruns.end() || here->second.empty() ? nullptr : &here->second;
  };
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
    if (const std::vector<int64_t>* r = samplesOf({name, ""})) {
      m.reruns = static_cast<int>(r->size());
      m.rerunNs = typical(*r);
    }
    std::set<std::string> policiesRun;
    for (const RerunSamples* from : {rerunsFrom, static_cast<const RerunSamples*>(&reruns)}) {
      if (from == nullptr) continue;
      for (auto it = from->lower_bound({name, ""}); it != from->end() && it->first.first == name;
           ++it)
        if (!it->first.second.empty()) policiesRun.insert(it->first.second);
    }
    for (const std::string& policy : policiesRun)
      if (const std::vector<int64_t>* r = samplesOf({name, policy}))
        m.policyRerunNs[policy] = typical(*r);
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
