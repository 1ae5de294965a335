#include "src/advisor/chain_from_recording.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/advisor/simulator.h"
#include "src/advisor/stage_times.h"
#include "src/core/breakdown.h"

namespace tidemark::core {

namespace {

constexpr std::string_view kSavedSuffix = ":saved";
constexpr std::string_view kBackwardSuffix = " [backward]";

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// "TinyGPT.blocks.3" -> ("TinyGPT.blocks", 3).
bool splitIndexed(std::string_view name, std::string* prefix, int* index) {
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot + 1 >= name.size()) return false;
  int v = 0;
  for (size_t i = dot + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > 1'000'000) return false;
    v = v * 10 + (name[i] - '0');
  }
  *prefix = std::string(name.substr(0, dot));
  *index = v;
  return true;
}

// A stretch of the recording in sequence order and time.
struct Window {
  uint64_t beginSeq = 0;
  uint64_t endSeq = 0;
  int64_t beginTsNs = 0;
  int64_t endTsNs = 0;
  bool valid = false;
  void cover(const Interval& iv) {
    if (!valid) {
      *this = {iv.beginSeq, iv.endSeq, iv.beginTsNs, iv.endTsNs, true};
      return;
    }
    beginSeq = std::min(beginSeq, iv.beginSeq);
    endSeq = std::max(endSeq, iv.endSeq);
    beginTsNs = std::min(beginTsNs, iv.beginTsNs);
    endTsNs = std::max(endTsNs, iv.endTsNs);
  }
};

Window windowOf(const Interval& iv) {
  return {iv.beginSeq, iv.endSeq, iv.beginTsNs, iv.endTsNs, true};
}

// The indexed module scopes (<prefix>.<n>) of one forward, the first call of each name, by
// prefix, each group in the order it ran.
using Groups = std::map<std::string, std::vector<const ScopeInterval*>>;

bool isAncestorName(std::string_view ancestor, std::string_view name) {
  return name.size() > ancestor.size() && name.substr(0, ancestor.size()) == ancestor &&
         name[ancestor.size()] == '.';
}

// Whether the glob `pattern` (* any run of characters, ? one) matches all of text.
bool globMatches(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// The chain the forward suggests: groups of blocks at one depth, called one after the other —
// with nothing in between but the entries of their containers (a ResNet's layer1.0, layer1.1,
// layer2.0, ... layer4.1: one chain over four containers), or with other modules in between
// when they are of the same model (a T5's encoder.block.* and decoder.block.*: its encoder's
// final norm and its decoder's embedding run between them; such a stage is not linked to the one
// before when its input was made there, see Stage::linked) —, the run whose blocks take the most
// forward time. Its groups' prefixes, in the order they ran; none when no run has two blocks.
// `scopes`: every scope of the forward (each call, ops too), by beginSeq.
std::vector<std::string> suggestedChain(const Groups& groups,
                                        const std::vector<const ScopeInterval*>& scopes) {
  struct Run {
    std::vector<std::string> prefixes;
    const ScopeInterval* last = nullptr;
    int depth = 0;
    size_t blocks = 0;
    int64_t ns = 0;
  };
  std::vector<std::pair<const ScopeInterval*, const std::string*>> firsts;
  for (const auto& [prefix, members] : groups) {
    bool usable = true;
    for (size_t i = 0; i < members.size() && usable; ++i)
      usable = members[i]->depth == members.front()->depth &&
               (i == 0 || members[i]->beginSeq >= members[i - 1]->endSeq);
    if (usable) firsts.emplace_back(members.front(), &prefix);
  }
  std::sort(firsts.begin(), firsts.end(),
            [](const auto& a, const auto& b) { return a.first->beginSeq < b.first->beginSeq; });
  // Nothing but the next group's containers begins between two groups of a run.
  auto cleanGap = [&](const ScopeInterval* last, const ScopeInterval* next) {
    auto it =
        std::lower_bound(scopes.begin(), scopes.end(), last->endSeq,
                         [](const ScopeInterval* s, uint64_t seq) { return s->beginSeq < seq; });
    for (; it != scopes.end() && (*it)->beginSeq < next->beginSeq; ++it)
      if ((*it)->threadId == next->threadId && !isAncestorName((*it)->name, next->name))
        return false;
    return true;
  };
  std::vector<Run> runs;
  for (const auto& [first, prefix] : firsts) {
    const std::vector<const ScopeInterval*>& members = groups.at(*prefix);
    Run* run = nullptr;
    const auto root = [](std::string_view name) { return name.substr(0, name.find('.')); };
    for (Run& r : runs)
      if (r.depth == first->depth && r.last->endSeq <= first->beginSeq &&
          (cleanGap(r.last, first) || root(r.last->name) == root(first->name)))
        run = &r;
    if (run == nullptr) {
      runs.emplace_back();
      run = &runs.back();
      run->depth = first->depth;
    }
    run->prefixes.push_back(*prefix);
    run->last = members.back();
    run->blocks += members.size();
    for (const ScopeInterval* m : members) run->ns += m->endTsNs - m->beginTsNs;
  }
  const Run* best = nullptr;
  for (const Run& r : runs)
    if (r.blocks >= 2 && (best == nullptr || r.ns > best->ns)) best = &r;
  return best == nullptr ? std::vector<std::string>{} : best->prefixes;
}

// The highest total of the blocks born in [w.beginSeq, w.endSeq) that pass `keep`, counting each
// until it is freed (inside the window) or to the window's end; the blocks of `freedEarly` are
// counted as freed by `freedAt` at the latest.
template <typename Keep>
int64_t bornInsidePeak(const Recording& rec, const Window& w, Keep keep,
                       const std::set<int>& freedEarly = {}, uint64_t freedAt = kOpenSeq) {
  std::vector<std::pair<uint64_t, int64_t>> edges;
  auto it = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), w.beginSeq,
                             [](const Block& b, uint64_t seq) { return b.allocSeq < seq; });
  for (; it != rec.blocks.end() && it->allocSeq < w.endSeq; ++it) {
    const int j = static_cast<int>(it - rec.blocks.begin());
    if (!keep(j)) continue;
    edges.push_back({it->allocSeq, static_cast<int64_t>(it->sizeBytes)});
    const uint64_t freeSeq = freedEarly.count(j)
                                 ? std::min(it->freeSeq, std::max(freedAt, it->allocSeq + 1))
                                 : it->freeSeq;
    if (freeSeq < w.endSeq) edges.push_back({freeSeq, -static_cast<int64_t>(it->sizeBytes)});
  }
  std::sort(edges.begin(), edges.end());
  int64_t live = 0, peak = 0;
  for (const auto& [seq, delta] : edges) {
    live += delta;
    peak = std::max(peak, live);
  }
  return peak;
}

// The blocks of a recomputation that are its forward's `output` made again. A recomputation replays
// the forward's work, allocation for allocation: the blocks of `output` are matched by their place
// among the blocks born in each window (those that pass `keep`), counted from the start where both
// windows hold as many, else from the end (where a block's output is made), and by their size.
template <typename Keep>
std::set<int> remadeOutput(const Recording& rec, const Window& forward, const Window& rerun,
                           const std::set<int>& output, Keep keep) {
  auto bornIn = [&](const Window& w) {
    std::vector<int> js;
    auto it = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), w.beginSeq,
                               [](const Block& b, uint64_t seq) { return b.allocSeq < seq; });
    for (; it != rec.blocks.end() && it->allocSeq < w.endSeq; ++it) {
      const int j = static_cast<int>(it - rec.blocks.begin());
      if (keep(j)) js.push_back(j);
    }
    return js;
  };
  const std::vector<int> made = bornIn(forward), remade = bornIn(rerun);
  std::set<int> out;
  const bool fromStart = made.size() == remade.size();
  for (size_t k = 0; k < made.size(); ++k) {
    if (!output.count(made[k])) continue;
    const size_t fromEnd = made.size() - k;
    if (!fromStart && fromEnd > remade.size()) continue;
    const int j = fromStart ? remade[k] : remade[remade.size() - fromEnd];
    if (rec.blocks[j].sizeBytes == rec.blocks[made[k]].sizeBytes) out.insert(j);
  }
  return out;
}

// The ops whose outputs the "matmul" policy keeps (as the recording names them; the adapter's
// policy names the same ops as torch's dispatcher sees them).
bool isSavePolicyOp(const std::string& name) {
  static const std::set<std::string> kOps = {"aten::mm",
                                             "aten::addmm",
                                             "aten::bmm",
                                             "aten::baddbmm",
                                             "aten::convolution",
                                             "aten::_scaled_dot_product_flash_attention",
                                             "aten::_scaled_dot_product_flash_attention_for_cpu",
                                             "aten::_scaled_dot_product_efficient_attention",
                                             "aten::_scaled_dot_product_cudnn_attention"};
  return kOps.count(name) > 0;
}

// One call of a compute-heavy op in a block's forward, as torch's selective activation
// checkpointing counts it: by op and occurrence (a call inside another such call is part of it).
struct KeptOpCall {
  std::string op;  // the dispatcher's name, without "aten::"
  int occurrence = 0;
  int64_t ns = 0;
  int64_t bytes = 0;  // its outputs that outlive it (less the stage's output)
};

// The op-level options of a block whose forward ran as `run` on `thread` (ops: the compute-heavy
// op scopes by begin): all its calls kept ("keep matmul outputs"), and up to three prefixes of
// the calls ordered by time per byte kept. Each keeps less than the stage saves by at least 5 %.
template <typename TensorLevel>
std::vector<StageOption> opLevelOptions(const Recording& rec,
                                        const std::vector<const ScopeInterval*>& ops,
                                        const Window& run, uint32_t thread,
                                        const std::set<int>& output, TensorLevel isTensorLevel,
                                        int64_t forwardNs, int64_t savedBytes) {
  std::vector<KeptOpCall> calls;
  std::map<std::string, int> occurrences;
  uint64_t coveredUntil = 0;
  std::set<int> keptBlocks;
  auto o =
      std::lower_bound(ops.begin(), ops.end(), run.beginSeq,
                       [](const ScopeInterval* op, uint64_t seq) { return op->beginSeq < seq; });
  for (; o != ops.end() && (*o)->beginSeq < run.endSeq; ++o) {
    const ScopeInterval& op = **o;
    if (op.threadId != thread || op.endSeq > run.endSeq) continue;
    if (op.beginSeq >= coveredUntil) {  // an outermost call: one the policy sees
      std::string name = op.name.rfind("aten::", 0) == 0 ? op.name.substr(6) : op.name;
      const int occurrence = occurrences[name]++;
      calls.push_back({std::move(name), occurrence, op.endTsNs - op.beginTsNs, 0});
      coveredUntil = op.endSeq;
    }
    // Its outputs: what it allocated that outlives it (the block's output is the next stage's
    // input, kept anyway).
    auto b = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), op.beginSeq,
                              [](const Block& blk, uint64_t seq) { return blk.allocSeq < seq; });
    for (; b != rec.blocks.end() && b->allocSeq < op.endSeq; ++b) {
      const int j = static_cast<int>(b - rec.blocks.begin());
      if (!isTensorLevel(j) || b->freeSeq < op.endSeq || output.count(j) ||
          !keptBlocks.insert(j).second)
        continue;
      calls.back().bytes += static_cast<int64_t>(b->sizeBytes);
    }
  }
  std::vector<StageOption> out;
  auto offer = [&](const std::vector<size_t>& kept, std::string name, std::string policy) {
    int64_t bytes = 0, ns = 0;
    for (size_t c : kept) {
      bytes += calls[c].bytes;
      ns += calls[c].ns;
    }
    if (ns <= 0 || bytes >= savedBytes || (savedBytes - bytes) * 20 < savedBytes) return;
    StageOption opt;
    opt.name = std::move(name);
    opt.savedBytes = bytes;
    opt.recomputeNs = std::max<int64_t>(0, forwardNs - ns);
    opt.policy = std::move(policy);
    out.push_back(std::move(opt));
  };
  std::vector<size_t> all(calls.size());
  for (size_t c = 0; c < calls.size(); ++c) all[c] = c;
  offer(all, "keep matmul outputs", kSavePolicyMatmul);
  // Free calls (nothing kept) first, then by time per byte, most first.
  std::vector<size_t> order = all;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const KeptOpCall& x = calls[a];
    const KeptOpCall& y = calls[b];
    if ((x.bytes == 0) != (y.bytes == 0)) return x.bytes == 0;
    return static_cast<double>(x.ns) * static_cast<double>(y.bytes) >
           static_cast<double>(y.ns) * static_cast<double>(x.bytes);
  });
  size_t free = 0;
  while (free < order.size() && calls[order[free]].bytes == 0) ++free;
  const size_t costly = order.size() - free;
  std::set<size_t> lengths;  // how many costly calls a prefix keeps: 1 .. costly - 1
  for (size_t q = 1; q <= 3 && costly > 1; ++q)
    lengths.insert(std::clamp<size_t>((costly * q + 2) / 4, 1, costly - 1));
  for (size_t k : lengths) {
    std::vector<size_t> kept(order.begin(), order.begin() + static_cast<long>(free + k));
    std::sort(kept.begin(), kept.end());  // in the forward's order
    std::string policy = absl::StrCat(kSavePolicyMatmul, ":");
    for (size_t c = 0; c < kept.size(); ++c)
      absl::StrAppend(&policy, c > 0 ? "," : "", calls[kept[c]].op, "#", calls[kept[c]].occurrence);
    offer(kept, absl::StrCat("keep ", kept.size(), " of ", calls.size(), " matmul outputs"),
          std::move(policy));
  }
  return out;
}

// A selective option of a recorded stage, as the store-all recording shows it: the blocks it
// would not keep and the child module that would regenerate them.
struct OptionFacts {
  std::vector<int> dropped;
  std::string child;
  Window childForward;
};

// The highest total, over a stage's backward window `w`, of the activations it kept (`kept`, each
// until it is freed) and the blocks born inside the window that pass `born`: as recorded (first),
// and as it would be had the stage not kept `dropped` until `regenerateSeq`, where re-running the
// child's forward adds `transient` (its forward's own peak) on top of what is live then.
template <typename Born>
std::pair<int64_t, int64_t> backwardPeaks(const Recording& rec, const Window& w,
                                          const std::vector<int>& kept, Born born,
                                          const std::vector<int>& dropped, uint64_t regenerateSeq,
                                          int64_t transient) {
  struct Edge {
    uint64_t seq;
    int64_t recorded;
    int64_t regenerated;
  };
  std::vector<Edge> edges;
  const std::set<int> drop(dropped.begin(), dropped.end());
  int64_t recorded = 0, regenerated = 0;
  for (int j : kept) {
    const Block& b = rec.blocks[j];
    if (b.allocSeq >= w.beginSeq || b.freeSeq <= w.beginSeq) continue;
    const auto size = static_cast<int64_t>(b.sizeBytes);
    const bool isDropped = drop.count(j) > 0;
    recorded += size;
    if (!isDropped) regenerated += size;
    if (isDropped && b.freeSeq > regenerateSeq) edges.push_back({regenerateSeq, 0, size});
    if (b.freeSeq < w.endSeq)
      edges.push_back(
          {b.freeSeq, -size, isDropped && b.freeSeq <= regenerateSeq ? int64_t{0} : -size});
  }
  auto it = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), w.beginSeq,
                             [](const Block& b, uint64_t seq) { return b.allocSeq < seq; });
  for (; it != rec.blocks.end() && it->allocSeq < w.endSeq; ++it) {
    if (!born(static_cast<int>(it - rec.blocks.begin()))) continue;
    const auto size = static_cast<int64_t>(it->sizeBytes);
    edges.push_back({it->allocSeq, size, size});
    if (it->freeSeq < w.endSeq) edges.push_back({it->freeSeq, -size, -size});
  }
  std::stable_sort(edges.begin(), edges.end(),
                   [](const Edge& a, const Edge& b) { return a.seq < b.seq; });
  int64_t peakRecorded = recorded, peakRegenerated = regenerated;
  bool rerun = false;
  for (const Edge& e : edges) {
    if (!rerun && e.seq >= regenerateSeq) {
      peakRegenerated = std::max(peakRegenerated, regenerated + transient);
      rerun = true;
    }
    recorded += e.recorded;
    regenerated += e.regenerated;
    peakRecorded = std::max(peakRecorded, recorded);
    peakRegenerated = std::max(peakRegenerated, regenerated);
  }
  if (!rerun) peakRegenerated = std::max(peakRegenerated, regenerated + transient);
  return {peakRecorded, peakRegenerated};
}

// 9. Times from every steady step, not the one modelled (moduleTimesOverSteps): a stage's forward
// is its forwards' (its re-runs' when the recording never ran it otherwise: a job planned from
// its start); what a plan's re-run of it costs is its recorded re-runs' when it has
// some (rerunsFrom's, when given: another recording of the job, under a plan), else its forward
// times the re-run/forward ratio of the blocks that have both, when one is known. A child
// option re-runs the child: the same for the child. An op-level option re-runs the block less
// its kept ops: its recorded re-runs under that policy when there are some; else its share of the
// block's recorded forward, corrected by what the block's re-runs under its other policies showed
// that share leaves out (selective checkpointing's own work at every op of the block, the same
// whichever calls it keeps), else by the other blocks' corrections relative to their re-runs.
void calibrateTimes(const Recording& rec, const RerunSamples* rerunsFrom,
                    const PlannedPolicies* policies, ChainProfile* p) {
  std::vector<std::string> names;
  for (const Stage& s : p->stages) {
    names.push_back(s.name);
    for (const StageOption& o : s.options)
      if (o.policy.empty()) names.insert(names.end(), o.recompute.begin(), o.recompute.end());
  }
  const std::map<std::string, ModuleTimes> times =
      moduleTimesOverSteps(rec, names, rerunsFrom, policies);
  const double ratio = rerunOverForward(times);
  auto rerunOf = [&](const std::string& name, int64_t forwardNs) -> int64_t {
    const ModuleTimes& m = times.at(name);
    if (m.reruns > 0) return m.rerunNs;
    return ratio > 0 ? std::llround(static_cast<double>(forwardNs) * ratio) : 0;
  };
  // Per stage, the correction its op-level re-runs measured.
  std::vector<std::optional<double>> correction(p->stages.size());
  double relative = 0;  // the measured corrections over their blocks' re-runs, summed
  int measured = 0;
  for (size_t i = 0; i < p->stages.size(); ++i) {
    Stage& s = p->stages[i];
    const ModuleTimes& m = times.at(s.name);
    const int64_t stepNs = s.forwardNs;  // the modelled step's own
    if (m.forwards > 0) {
      s.forwardNs = m.forwardNs;
    } else if (m.reruns > 0) {
      s.forwardNs = m.rerunNs;
    }
    s.rerunNs = rerunOf(s.name, s.forwardNs);
    double missed = 0;
    int policiesRun = 0;
    for (StageOption& o : s.options) {
      if (o.policy.empty() && o.recompute.size() == 1) {
        const ModuleTimes& c = times.at(o.recompute[0]);
        const int64_t forward = c.forwards > 0 ? c.forwardNs : o.recomputeNs;
        const int64_t rerun = rerunOf(o.recompute[0], forward);
        o.recomputeNs = rerun > 0 ? rerun : forward;
        continue;
      }
      // Its share of the block's re-run; an op-level option's, of the block's recorded forward:
      // under selective checkpointing every op of the re-run pays torch's dispatch mode and the
      // policy, as every op of a forward recorded with op scopes paid the op observer, which a
      // whole re-run does not (docs/plan-format.md, bench/op_option_times.py).
      const int64_t of = o.policy.empty() ? s.rerunCostNs() : s.forwardNs;
      if (stepNs > 0)
        o.recomputeNs = std::llround(static_cast<double>(o.recomputeNs) * static_cast<double>(of) /
                                     static_cast<double>(stepNs));
      if (o.policy.empty()) continue;
      if (auto run = m.policyRerunNs.find(o.policy); run != m.policyRerunNs.end()) {
        missed += static_cast<double>(run->second - o.recomputeNs);
        ++policiesRun;
      }
    }
    if (policiesRun > 0 && s.rerunCostNs() > 0) {
      correction[i] = missed / policiesRun;
      relative += *correction[i] / static_cast<double>(s.rerunCostNs());
      ++measured;
    }
  }
  for (size_t i = 0; i < p->stages.size(); ++i) {
    Stage& s = p->stages[i];
    const ModuleTimes& m = times.at(s.name);
    const double add = correction[i]  ? *correction[i]
                       : measured > 0 ? relative / measured * static_cast<double>(s.rerunCostNs())
                                      : 0.0;
    for (StageOption& o : s.options) {
      if (o.policy.empty()) continue;
      if (auto run = m.policyRerunNs.find(o.policy); run != m.policyRerunNs.end()) {
        o.recomputeNs = run->second;
      } else {
        o.recomputeNs =
            std::max<int64_t>(0, std::llround(static_cast<double>(o.recomputeNs) + add));
      }
    }
  }
}

}  // namespace

absl::StatusOr<RecordedChain> chainFromRecording(const Recording& rec,
                                                 const std::vector<BlockCategory>& categories,
                                                 int64_t stepNo, std::string_view blocksPrefix,
                                                 int64_t firstPlannedStep,
                                                 const RerunSamples* rerunTimesFrom,
                                                 const PlannedPolicies* plannedPolicies) {
  // 1. The step.
  const StepInterval* step = nullptr;
  if (stepNo > 0) {
    step = rec.findStep(stepNo);
    if (step == nullptr)
      return absl::NotFoundError(absl::StrCat("the session has no step ", stepNo));
    if (step->endSeq == kOpenSeq)
      return absl::FailedPreconditionError(absl::StrCat("step ", stepNo, " did not finish"));
  } else {
    // The last complete step with a forward and a backward (a capture schedule's summarized
    // steps have none: the last one recorded in detail), else the last complete one. Among
    // those, one without recomputation when there is one, and one before the first plan the job
    // applied (firstPlannedStep): a job planned in mid-run (tidemark apply) is modelled from its
    // steps before the plan, which show every block's activations.
    std::vector<uint8_t> seen(rec.steps.size(), 0);  // 1 forward, 2 backward, 4 recomputation
    for (const PhaseInterval& ph : rec.phases) {
      if (ph.phase != Phase::kForward && ph.phase != Phase::kBackward &&
          ph.phase != Phase::kRecompute)
        continue;
      auto it =
          std::upper_bound(rec.steps.begin(), rec.steps.end(), ph.beginSeq,
                           [](uint64_t seq, const StepInterval& s) { return seq < s.beginSeq; });
      if (it == rec.steps.begin() || !(it - 1)->contains(ph.beginSeq)) continue;
      seen[static_cast<size_t>(it - 1 - rec.steps.begin())] |= ph.phase == Phase::kForward    ? 1
                                                               : ph.phase == Phase::kBackward ? 2
                                                                                              : 4;
    }
    // Steps under a plan the job applied are no candidates (when any step ran before it).
    auto before = [&](const StepInterval& s) {
      return firstPlannedStep <= 0 || s.step < firstPlannedStep;
    };
    bool anyBefore = false;
    for (const StepInterval& s : rec.steps)
      anyBefore = anyBefore || (before(s) && s.endSeq != kOpenSeq);
    auto candidate = [&](size_t i) {
      return rec.steps[i].endSeq != kOpenSeq && (!anyBefore || before(rec.steps[i]));
    };
    for (size_t i = rec.steps.size(); i-- > 0 && step == nullptr;)
      if (candidate(i) && seen[i] == 3) step = &rec.steps[i];
    for (size_t i = rec.steps.size(); i-- > 0 && step == nullptr;)
      if (candidate(i) && (seen[i] & 3) == 3) step = &rec.steps[i];
    for (size_t i = rec.steps.size(); i-- > 0 && step == nullptr;)
      if (candidate(i)) step = &rec.steps[i];
    if (step == nullptr)
      return absl::FailedPreconditionError(
          "the session has no complete training step (the advisor needs one forward, backward "
          "and optimizer step recorded with the adapter)");
  }

  // 2. Its phases: the outermost forward and backward, and every recomputation.
  const PhaseInterval* fwd = nullptr;
  const PhaseInterval* bwd = nullptr;
  std::vector<const PhaseInterval*> recomputes;
  for (const PhaseInterval& ph : rec.phases) {
    if (!step->contains(ph.beginSeq) || ph.endSeq == kOpenSeq) continue;
    if (ph.phase == Phase::kForward && fwd == nullptr) fwd = &ph;
    if (ph.phase == Phase::kBackward && bwd == nullptr) bwd = &ph;
    if (ph.phase == Phase::kRecompute) recomputes.push_back(&ph);
  }
  if (fwd == nullptr || bwd == nullptr)
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step->step,
                     " has no forward and backward phases (record with the PyTorch "
                     "adapter: tidemark run adds it)"));
  auto inRecompute = [&](uint64_t seq) {
    for (const PhaseInterval* r : recomputes)
      if (r->contains(seq)) return true;
    return false;
  };

  // 3. The blocks: module scopes <prefix>.<n> of the forward (first call of each name), of the
  // prefixes named (a list, or glob patterns) or of the chain the forward suggests.
  // The scopes of a forward on the host (each call; firstOnly: the first call of each name), by
  // beginSeq.
  auto scopesIn = [&](const PhaseInterval* ph, bool firstOnly) {
    std::vector<const ScopeInterval*> out;
    std::set<std::string_view> seen;
    for (const ScopeInterval& sc : rec.scopes) {
      if (!ph->contains(sc.beginSeq) || sc.endSeq == kOpenSeq || sc.isKernel ||
          inRecompute(sc.beginSeq))
        continue;
      if (!firstOnly || seen.insert(sc.name).second) out.push_back(&sc);
    }
    std::sort(out.begin(), out.end(), [](const ScopeInterval* a, const ScopeInterval* b) {
      return a->beginSeq < b->beginSeq;
    });
    return out;
  };
  auto groupsOf = [&](const std::vector<const ScopeInterval*>& scopes) {
    Groups groups;
    for (const ScopeInterval* sc : scopes) {
      std::string prefix;
      int index = 0;
      if (!sc->isOp && splitIndexed(sc->name, &prefix, &index)) groups[prefix].push_back(sc);
    }
    return groups;
  };
  std::vector<const ScopeInterval*> forwardScopes = scopesIn(fwd, true);
  Groups groups = groupsOf(forwardScopes);
  std::vector<std::string> chosen;
  if (blocksPrefix.empty()) {
    chosen = suggestedChain(groups, scopesIn(fwd, false));
    if (chosen.empty())
      return absl::NotFoundError(
          absl::StrCat("no repeated blocks (modules named <prefix>.0, <prefix>.1, ...) in step ",
                       step->step, "'s forward; name them with --blocks PREFIX"));
  } else {
    for (std::string_view rest = blocksPrefix; !rest.empty();) {
      const size_t comma = std::min(rest.find(','), rest.size());
      std::string item(rest.substr(0, comma));
      rest.remove_prefix(std::min(comma + 1, rest.size()));
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (item.empty()) continue;
      const bool pattern = item.find_first_of("*?") != std::string_view::npos;
      bool matched = false;
      for (const auto& [prefix, members] : groups) {
        if (pattern ? !globMatches(item, prefix) : prefix != item) continue;
        matched = true;
        if (std::find(chosen.begin(), chosen.end(), prefix) == chosen.end())
          chosen.push_back(prefix);
      }
      if (!matched) {
        std::string known;
        for (const auto& [prefix, members] : groups)
          absl::StrAppend(&known, known.empty() ? "" : ", ", prefix);
        return absl::NotFoundError(
            absl::StrCat("no modules named ", item, ".<n> in step ", step->step,
                         "'s forward (indexed modules: ", known.empty() ? "none" : known, ")"));
      }
    }
  }
  // In the order they ran (the chain's name lists them so).
  std::sort(chosen.begin(), chosen.end(), [&](const std::string& a, const std::string& b) {
    return groups.at(a).front()->beginSeq < groups.at(b).front()->beginSeq;
  });
  const std::set<std::string> chosenSet(chosen.begin(), chosen.end());
  // The chain's blocks in one forward, in the order they ran.
  auto blocksIn = [&](const std::vector<const ScopeInterval*>& scopes) {
    std::vector<const ScopeInterval*> out;
    for (const ScopeInterval* sc : scopes) {
      std::string prefix;
      int index = 0;
      if (!sc->isOp && splitIndexed(sc->name, &prefix, &index) && chosenSet.count(prefix) != 0)
        out.push_back(sc);
    }
    return out;
  };
  std::vector<const ScopeInterval*> forward = blocksIn(forwardScopes);
  // A step of several micro-batches (gradient accumulation: the blocks run forward and backward
  // k times before one optimizer step) is modelled from its last one: the gradients the others
  // accumulated are held all through it, so its peak is the step's; its times count k times.
  int microBatches = 1;
  const uint64_t firstForwardBegins = fwd->beginSeq;
  {
    const std::string firstBlock = forward.front()->name;
    auto runsFirstBlock = [&](const PhaseInterval& ph) {
      for (const ScopeInterval& sc : rec.scopes)
        if (sc.name == firstBlock && ph.contains(sc.beginSeq) && !inRecompute(sc.beginSeq))
          return true;
      return false;
    };
    const PhaseInterval* last = fwd;
    for (const PhaseInterval& ph : rec.phases) {
      if (ph.phase != Phase::kForward || &ph == fwd || !step->contains(ph.beginSeq) ||
          ph.endSeq == kOpenSeq || ph.beginSeq < fwd->endSeq || !runsFirstBlock(ph))
        continue;
      ++microBatches;
      if (ph.beginSeq > last->beginSeq) last = &ph;
    }
    if (last != fwd) {
      const PhaseInterval* after = nullptr;
      for (const PhaseInterval& ph : rec.phases)
        if (ph.phase == Phase::kBackward && step->contains(ph.beginSeq) && ph.endSeq != kOpenSeq &&
            ph.beginSeq >= last->endSeq && (after == nullptr || ph.beginSeq < after->beginSeq))
          after = &ph;
      if (after != nullptr) {
        fwd = last;
        bwd = after;
        std::vector<const PhaseInterval*> inside;
        for (const PhaseInterval* r : recomputes)
          if (r->beginSeq >= fwd->beginSeq && r->beginSeq < bwd->endSeq) inside.push_back(r);
        recomputes.swap(inside);
        forward = blocksIn(scopesIn(fwd, true));
      } else {
        microBatches = 1;
      }
    }
  }
  const std::string chainName = absl::StrJoin(chosen, ",");
  // Blocks called more than once in the forward modelled (siamese or shared blocks): the chain
  // takes each once (its first call's place and times, the saved bytes of all its calls).
  std::vector<std::string> repeated;
  {
    std::map<std::string_view, int> calls;
    for (const ScopeInterval& sc : rec.scopes)
      if (fwd->contains(sc.beginSeq) && sc.endSeq != kOpenSeq && !sc.isOp && !sc.isKernel &&
          !inRecompute(sc.beginSeq))
        ++calls[sc.name];
    for (const ScopeInterval* b : forward)
      if (calls[b->name] > 1) repeated.push_back(absl::StrCat(b->name, " (", calls[b->name], ")"));
  }
  const int n = static_cast<int>(forward.size());
  for (int i = 1; i < n; ++i)
    if (forward[i]->beginSeq < forward[i - 1]->endSeq)
      return absl::FailedPreconditionError(
          absl::StrCat("the blocks ", chainName, " nest or overlap (", forward[i - 1]->name,
                       " and ", forward[i]->name, "); name other blocks with --blocks PREFIX"));
  std::unordered_map<std::string, int> stageOf;
  for (int i = 0; i < n; ++i) stageOf[forward[i]->name] = i;
  // The stage a module belongs to: a block itself or anything under it.
  auto stageOfModule = [&](std::string_view module) -> int {
    for (;;) {
      auto it = stageOf.find(std::string(module));
      if (it != stageOf.end()) return it->second;
      const size_t dot = module.rfind('.');
      if (dot == std::string_view::npos) return -1;
      module = module.substr(0, dot);
    }
  };

  // 4. Blocks the recording recomputed: their scope again inside a recompute phase.
  std::vector<Window> recomputeRun(n);
  // The scope of the run that stored each block's activations: its forward, or its recompute.
  std::vector<const ScopeInterval*> runScope(forward);
  // A block whose module's forward runs under the checkpoint, its call outside it (`transformers`
  // layers since 5.0: the module's hooks stay out of the checkpoint), is re-run without a scope
  // of its own: a recomputation holding scopes under one block only, none of the block itself,
  // is that block's re-run, the phase its window (a stand-in scope, one level above the
  // outermost it holds).
  struct RerunFacts {
    int stage = -1;
    bool mixed = false;
    int depth = std::numeric_limits<int>::max();
    std::vector<std::pair<int, const ScopeInterval*>> scopes;  // the block's, with their depth
  };
  std::vector<RerunFacts> reruns(recomputes.size());
  for (const ScopeInterval& sc : rec.scopes) {
    if (!step->contains(sc.beginSeq) || sc.endSeq == kOpenSeq || !inRecompute(sc.beginSeq))
      continue;
    auto it = stageOf.find(sc.name);
    if (it != stageOf.end() && !recomputeRun[it->second].valid) {
      recomputeRun[it->second] = windowOf(sc);
      runScope[it->second] = &sc;
    }
    // (Modules of no model, named by their class, belong to whichever block runs them.)
    const int i = sc.isOp || sc.isKernel ? -1 : stageOfModule(sc.name);
    if (i < 0) continue;
    for (size_t k = 0; k < recomputes.size(); ++k) {
      const PhaseInterval& r = *recomputes[k];
      if (!r.contains(sc.beginSeq) || sc.threadId != r.threadId) continue;
      RerunFacts& f = reruns[k];
      if (it != stageOf.end() || (f.stage >= 0 && f.stage != i)) f.mixed = true;
      f.stage = i;
      f.depth = std::min(f.depth, sc.depth);
      f.scopes.push_back({sc.depth, &sc});
    }
  }
  // A recomputation of some of the block's children only is not the block's: a plan's selective
  // option checkpoints one child (the block stays stored, with what it kept), where the block's
  // forward re-run calls every child its forward called.
  auto runsEveryChild = [&](const RerunFacts& f) {
    std::set<std::string_view> ran, called;
    for (const auto& [depth, sc] : f.scopes)
      if (depth == f.depth) ran.insert(sc->name);
    const ScopeInterval& b = *forward[f.stage];
    const std::string prefix = b.name + ".";
    auto c =
        std::lower_bound(rec.scopes.begin(), rec.scopes.end(), b.beginSeq,
                         [](const ScopeInterval& x, uint64_t seq) { return x.beginSeq < seq; });
    for (; c != rec.scopes.end() && c->beginSeq < b.endSeq; ++c)
      if (c->threadId == b.threadId && !c->isOp && !c->isKernel && c->depth == b.depth + 1 &&
          c->name.compare(0, prefix.size(), prefix) == 0)
        called.insert(c->name);
    return std::includes(ran.begin(), ran.end(), called.begin(), called.end());
  };
  std::deque<ScopeInterval> standIns;
  for (size_t k = 0; k < recomputes.size(); ++k) {
    const RerunFacts& f = reruns[k];
    if (f.mixed || f.stage < 0 || recomputeRun[f.stage].valid || !runsEveryChild(f)) continue;
    ScopeInterval& sc = standIns.emplace_back();
    static_cast<Interval&>(sc) = *recomputes[k];
    sc.name = forward[f.stage]->name;
    sc.threadId = recomputes[k]->threadId;
    sc.depth = f.depth - 1;
    recomputeRun[f.stage] = windowOf(sc);
    runScope[f.stage] = &sc;
  }

  // 5. What each block saved for backward: tags "<module>:saved" joined to blocks on address.
  std::unordered_map<uint64_t, std::vector<int>> byAddress;
  for (int j = 0; j < static_cast<int>(rec.blocks.size()); ++j)
    byAddress[rec.blocks[j].address].push_back(j);
  auto blockAt = [&](uint64_t address, uint64_t seq) -> int {
    auto it = byAddress.find(address);
    if (it == byAddress.end()) return -1;
    for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) {
      const Block& b = rec.blocks[*r];
      if (b.allocSeq <= seq) return seq < b.freeSeq ? *r : -1;
    }
    return -1;
  };
  std::vector<std::set<int>> saved(n);
  // Who saved each block (-1: a module outside the chain). A block's output is often saved by its
  // own last op and by the next block's first one.
  std::unordered_map<int, std::set<int>> savers;
  std::unordered_map<int, std::vector<std::string>> saverModules;  // block -> saving modules
  for (const Tag& t : rec.tags) {
    if (!step->contains(t.seq) || (microBatches > 1 && t.seq < fwd->beginSeq)) continue;
    if (t.category != Category::kActivation && t.category != Category::kRecomputed) continue;
    if (!endsWith(t.name, kSavedSuffix)) continue;
    const int i =
        stageOfModule(std::string_view(t.name).substr(0, t.name.size() - kSavedSuffix.size()));
    const int j = blockAt(t.address, t.seq);
    if (j < 0) continue;
    savers[j].insert(i);
    saverModules[j].push_back(t.name.substr(0, t.name.size() - kSavedSuffix.size()));
    if (i >= 0) saved[i].insert(j);
  }
  auto savedElsewhere = [&](int j, int stage) {
    auto it = savers.find(j);
    if (it == savers.end()) return false;
    for (int s : it->second)
      if (s != stage) return true;
    return false;
  };

  // 6. Backward windows: the "<module> [backward]" scopes of each block, less recomputation.
  std::vector<Window> backward(n);
  std::vector<int64_t> backwardNs(n, 0);
  std::map<std::string, uint64_t> backwardBegin;  // module -> its first backward scope
  for (const ScopeInterval& sc : rec.scopes) {
    if (!bwd->contains(sc.beginSeq) || sc.endSeq == kOpenSeq || !endsWith(sc.name, kBackwardSuffix))
      continue;
    backwardBegin.emplace(sc.name.substr(0, sc.name.size() - kBackwardSuffix.size()), sc.beginSeq);
    const int i =
        stageOfModule(std::string_view(sc.name).substr(0, sc.name.size() - kBackwardSuffix.size()));
    if (i < 0) continue;
    backward[i].cover(sc);
    int64_t ns = sc.endTsNs - sc.beginTsNs;
    for (const PhaseInterval* r : recomputes) {
      const int64_t overlap =
          std::min(sc.endTsNs, r->endTsNs) - std::max(sc.beginTsNs, r->beginTsNs);
      if (overlap > 0) ns -= overlap;
    }
    backwardNs[i] += std::max<int64_t>(0, ns);
  }
  // A block recomputed by torch's non-reentrant checkpoint leaves no backward scope (its saved
  // tensors go to the checkpoint's hooks, not the adapter's): its backward is from its
  // recomputation until another block's backward or recomputation begins (or the backward ends).
  std::vector<bool> inferredBackward(n, false);
  for (int i = 0; i < n; ++i) {
    if (backward[i].valid || !recomputeRun[i].valid) continue;
    inferredBackward[i] = true;
    const PhaseInterval* r = nullptr;
    for (const PhaseInterval* c : recomputes)
      if (c->contains(recomputeRun[i].beginSeq) && (r == nullptr || c->beginSeq > r->beginSeq))
        r = c;
    Window w{recomputeRun[i].beginSeq, bwd->endSeq, recomputeRun[i].beginTsNs, bwd->endTsNs, true};
    const uint64_t after = r != nullptr ? r->endSeq : recomputeRun[i].endSeq;
    for (int j = 0; j < n; ++j) {
      for (const Window* other : {&backward[j], &recomputeRun[j]}) {
        if (j == i || !other->valid || other->beginSeq < after || other->beginSeq >= w.endSeq)
          continue;
        w.endSeq = other->beginSeq;
        w.endTsNs = other->beginTsNs;
      }
    }
    backward[i] = w;
  }

  // 7. The stages. Sizes are the framework's (tensors); a caching allocator's segments holding
  // them are not counted again (their slack is memory outside the chain).
  auto isTensorLevel = [&](int j) {
    return categories[static_cast<size_t>(j)].rule != CategoryRule::kAllocatorSegment;
  };
  RecordedChain out;
  out.step = step->step;
  out.blocksPrefix = chainName;
  if (!repeated.empty()) {
    const size_t shown = std::min<size_t>(repeated.size(), 4);
    out.warnings.push_back(absl::StrCat(
        "blocks called more than once in one forward (",
        absl::StrJoin(repeated.begin(), repeated.begin() + static_cast<long>(shown), ", "),
        repeated.size() > shown ? absl::StrCat(" and ", repeated.size() - shown, " more") : "",
        " calls): the chain model takes each block once (siamese or shared blocks are not "
        "modelled yet), so the predicted peak and time may not hold"));
  }
  ChainProfile& p = out.profile;
  p.name = chainName;
  std::vector<int64_t> inputSaved(n, 0);
  std::vector<std::vector<int>> kept(n);  // the blocks of each stage's savedBytes
  std::vector<std::vector<OptionFacts>> optionFacts(n);
  // Op scopes (a recording made with them: torch 2, `tidemark run --ops`) by their begin.
  std::vector<const ScopeInterval*> opsByBegin;
  for (const ScopeInterval& op : rec.ops)
    if (op.endSeq != kOpenSeq && isSavePolicyOp(op.name)) opsByBegin.push_back(&op);
  std::sort(
      opsByBegin.begin(), opsByBegin.end(),
      [](const ScopeInterval* a, const ScopeInterval* b) { return a->beginSeq < b->beginSeq; });
  for (int i = 0; i < n; ++i) {
    const ScopeInterval& f = *forward[i];
    // The run that stored the block's activations: its forward, or its recomputation.
    const Window run = recomputeRun[i].valid ? recomputeRun[i] : windowOf(f);
    Stage s;
    s.name = f.name;
    s.forwardNs = f.endTsNs - f.beginTsNs;
    s.backwardNs = backwardNs[i];
    // Linked to the stage before unless the forward's thread made a tensor between the two (a
    // pooling, a residual added outside the blocks, another stack's embedding): then the stage's
    // input is that tensor, not the previous stage's output, and no recomputed segment may run
    // from one into the other.
    if (i > 0) {
      const ScopeInterval& before = *forward[i - 1];
      auto b = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), before.endSeq,
                                [](const Block& blk, uint64_t seq) { return blk.allocSeq < seq; });
      for (; b != rec.blocks.end() && b->allocSeq < f.beginSeq && s.linked; ++b)
        s.linked =
            !(b->threadId == f.threadId && isTensorLevel(static_cast<int>(b - rec.blocks.begin())));
    }
    // The output: born in the forward, alive after it, and either not saved by the stage or
    // saved by someone else as well (the next stage saves its input).
    std::set<int> output;
    auto it = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), f.beginSeq,
                               [](const Block& b, uint64_t seq) { return b.allocSeq < seq; });
    for (; it != rec.blocks.end() && it->allocSeq < f.endSeq; ++it) {
      const int j = static_cast<int>(it - rec.blocks.begin());
      if (!isTensorLevel(j)) continue;
      if (it->freeSeq >= f.endSeq && (!saved[i].count(j) || savedElsewhere(j, i))) {
        output.insert(j);
        s.outputBytes += static_cast<int64_t>(it->sizeBytes);
      }
    }
    // A recomputation whose saved tensors went to the checkpoint's own hooks (torch 2's
    // non-reentrant checkpoint keeps them from the hooks in scope: no tags): what it kept for the
    // backward is what it made that lives on into the block's backward (its output is dropped
    // before).
    // (Who saved each of them is not known then: no selective options below.)
    const bool savedUntagged =
        recomputeRun[i].valid && std::none_of(saved[i].begin(), saved[i].end(), [&](int j) {
          return rec.blocks[j].allocSeq >= run.beginSeq && rec.blocks[j].allocSeq < run.endSeq;
        });
    if (savedUntagged) {
      // A recomputation that torch stopped once it had what the backward needs (an exception
      // from the op that made the last of it) frees that op's temporaries as the exception
      // unwinds, after the run's end and before the backward allocates anything: not kept.
      auto after = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), run.endSeq,
                                    [](const Block& b, uint64_t seq) { return b.allocSeq < seq; });
      const uint64_t nextAlloc = after != rec.blocks.end() ? after->allocSeq : kOpenSeq;
      auto r = std::lower_bound(rec.blocks.begin(), rec.blocks.end(), run.beginSeq,
                                [](const Block& b, uint64_t seq) { return b.allocSeq < seq; });
      for (; r != rec.blocks.end() && r->allocSeq < run.endSeq; ++r) {
        const int j = static_cast<int>(r - rec.blocks.begin());
        if (isTensorLevel(j) &&
            r->freeSeq >= (backward[i].valid ? backward[i].beginSeq : run.endSeq) &&
            !(r->freeSeq >= run.endSeq && r->freeSeq < nextAlloc) &&
            categories[static_cast<size_t>(j)].category == Category::kRecomputed)
          saved[i].insert(j);
      }
    }
    // Saved activations, less the output: the model counts that as the next stage's input. A
    // recomputed block's output made again is its output too (saved by the next block of a
    // segment the job re-ran, or by its own last op; its forward's output is what the block
    // after it saved): counted as saved, it inflated every plan that stores the block by it.
    const std::set<int> remade = recomputeRun[i].valid
                                     ? remadeOutput(rec, windowOf(f), run, output, isTensorLevel)
                                     : std::set<int>{};
    for (int j : saved[i]) {
      const Block& b = rec.blocks[j];
      if (b.allocSeq < run.beginSeq) {
        inputSaved[i] += static_cast<int64_t>(b.sizeBytes);
      } else if (!output.count(j) && !remade.count(j)) {
        s.savedBytes += static_cast<int64_t>(b.sizeBytes);
        kept[i].push_back(j);
      }
    }
    s.forwardWorkingBytes =
        std::max<int64_t>(0, bornInsidePeak(rec, run, isTensorLevel) - s.outputBytes);
    // A block the recording ran under a checkpoint: its forward's working there (less than a
    // stored run's: it kept nothing for its backward).
    if (recomputeRun[i].valid)
      s.checkpointedForwardWorkingBytes =
          std::max<int64_t>(0, bornInsidePeak(rec, windowOf(f), isTensorLevel) - s.outputBytes);
    // Selective options: checkpoint one child module of the block. It drops what the child
    // alone saved of the activations born inside it, and re-runs the child's forward. (Not known
    // where the savers are not: every activation born in a child looked like the child's alone,
    // and plans that re-ran a child measured up to 6.5 % above their prediction.)
    std::set<std::string> seenChildren;
    const std::string childPrefix = s.name + ".";
    for (const ScopeInterval& c : rec.scopes) {
      if (savedUntagged) break;
      if (c.beginSeq < run.beginSeq || c.beginSeq >= run.endSeq || c.endSeq == kOpenSeq ||
          c.depth != runScope[i]->depth + 1 ||
          c.name.compare(0, childPrefix.size(), childPrefix) != 0 ||
          !seenChildren.insert(c.name).second)
        continue;
      int64_t dropped = 0;
      OptionFacts facts{{}, c.name, windowOf(c)};
      for (int j : saved[i]) {
        const Block& b = rec.blocks[j];
        if (output.count(j) || remade.count(j) || b.allocSeq < c.beginSeq || b.allocSeq >= c.endSeq)
          continue;
        bool onlyChild = true;
        for (const std::string& m : saverModules[j])
          onlyChild =
              onlyChild && (m == c.name || m.compare(0, c.name.size() + 1, c.name + ".") == 0);
        if (onlyChild) {
          dropped += static_cast<int64_t>(b.sizeBytes);
          facts.dropped.push_back(j);
        }
      }
      // Worth an option only when it drops a real share of the block's activations.
      if (dropped > 0 && dropped * 20 >= s.savedBytes) {
        s.options.push_back({"recompute " + c.name.substr(childPrefix.size()),
                             s.savedBytes - dropped,
                             c.endTsNs - c.beginTsNs,
                             {c.name}});
        optionFacts[i].push_back(std::move(facts));
      }
    }
    // Op-level options: keep the outputs of the block's compute-heavy ops (matrix products,
    // convolutions, attention kernels) and re-run the rest at its backward — torch 2's selective
    // activation checkpointing. "keep matmul outputs" keeps them all (the "matmul" policy); the
    // others keep some of the calls, named by op and occurrence ("matmul:addmm#0,bmm#1"), those
    // that save the most time per byte kept first. A kept output is kept whether or not the
    // backward needs it; the block's forward re-runs less the kept calls.
    if (!opsByBegin.empty() && runScope[i] == forward[i]) {
      for (StageOption& opt : opLevelOptions(rec, opsByBegin, run, f.threadId, output,
                                             isTensorLevel, s.forwardNs, s.savedBytes)) {
        s.options.push_back(std::move(opt));
        optionFacts[i].push_back({});  // its transients: the model's defaults
      }
    }
    p.stages.push_back(std::move(s));
  }
  for (int i = 0; i < n && !out.onDevice; ++i)
    for (int j : kept[i]) out.onDevice = out.onDevice || rec.blocks[j].device >= 0;
  p.inputBytes = inputSaved[0] > 0 ? inputSaved[0] : p.stages[0].outputBytes;
  // Blocks recomputed by one recomputation (a plan's or the job's multi-block segment).
  auto recomputationOf = [&](int i) -> const PhaseInterval* {
    for (const PhaseInterval* r : recomputes)
      if (recomputeRun[i].valid && r->contains(recomputeRun[i].beginSeq)) return r;
    return nullptr;
  };
  // Such a segment re-run by torch 2's non-reentrant checkpoint: its blocks have no backward
  // scopes, and the window from each one's recomputation on (step 6) spans the backward of the
  // blocks after it in the segment, their activations held (a segment's first block had them
  // all outside the chain: +4.2 % on the convnet's checkpoint_sequential). A block's backward is
  // over when the last of what it kept is freed (the checkpoint lets go of each recomputed
  // tensor as the backward takes it); it begins where the next block's ends, or where the
  // recomputation does.
  for (int i = n - 1; i >= 0; --i) {
    const PhaseInterval* r = recomputationOf(i);
    if (!inferredBackward[i] || kept[i].empty() || r == nullptr ||
        !((i > 0 && recomputationOf(i - 1) == r) || (i + 1 < n && recomputationOf(i + 1) == r)))
      continue;
    Window w{r->endSeq, 0, r->endTsNs, 0, true};
    if (i + 1 < n && inferredBackward[i + 1] && recomputationOf(i + 1) == r)
      w = {backward[i + 1].endSeq, 0, backward[i + 1].endTsNs, 0, true};
    for (int j : kept[i]) {
      const Block& b = rec.blocks[j];
      if (b.freeSeq != kOpenSeq && b.freeSeq >= w.endSeq) {
        w.endSeq = b.freeSeq + 1;
        w.endTsNs = b.freeTsNs;
      }
    }
    if (w.endSeq > w.beginSeq && w.endSeq <= backward[i].endSeq) backward[i] = w;
  }
  for (int i = 0; i < n; ++i) {
    if (!backward[i].valid) continue;
    auto bornInBackward = [&](int j) {
      return isTensorLevel(j) && !inRecompute(rec.blocks[j].allocSeq) &&
             categories[j].category != Category::kGradient;
    };
    Stage& s = p.stages[i];
    s.backwardWorkingBytes =
        std::max<int64_t>(0, bornInsidePeak(rec, backward[i], bornInBackward) - p.inBytes(i));
    // An option's forward: the child frees what it does not keep when it ends.
    for (size_t k = 0; k < s.options.size(); ++k) {
      const OptionFacts& facts = optionFacts[i][k];
      if (runScope[i] != forward[i] || !s.options[k].policy.empty()) continue;
      const std::set<int> dropped(facts.dropped.begin(), facts.dropped.end());
      const Window run = windowOf(*forward[i]);
      s.options[k].forwardWorkingBytes = std::max<int64_t>(
          0, s.forwardWorkingBytes -
                 (bornInsidePeak(rec, run, isTensorLevel) -
                  bornInsidePeak(rec, run, isTensorLevel, dropped, facts.childForward.endSeq)));
    }
    // An option's backward: what the recording shows, less the dropped activations until the
    // child's backward begins, where its forward re-runs. The model's figure moves by as much as
    // that curve's peak does (the model keeps a stage's activations whole through its backward).
    for (size_t k = 0; k < s.options.size(); ++k) {
      const OptionFacts& facts = optionFacts[i][k];
      if (!s.options[k].policy.empty()) continue;  // an op-level option: the defaults
      // The child's backward begins with its own scope's or with any of its descendants'
      // (a container such as nn.Sequential has none of its own).
      uint64_t begin = kOpenSeq;
      for (auto it = backwardBegin.lower_bound(facts.child);
           it != backwardBegin.end() && it->first.compare(0, facts.child.size(), facts.child) == 0;
           ++it) {
        if (it->first.size() == facts.child.size() || it->first[facts.child.size()] == '.')
          begin = std::min(begin, it->second);
      }
      if (begin < backward[i].beginSeq || begin >= backward[i].endSeq || runScope[i] != forward[i])
        continue;  // not seen, or the recording already recomputed the block: not known
      const auto [recorded, regenerated] =
          backwardPeaks(rec, backward[i], kept[i], bornInBackward, facts.dropped, begin,
                        bornInsidePeak(rec, facts.childForward, isTensorLevel));
      s.options[k].backwardWorkingBytes =
          std::max<int64_t>(0, s.backwardWorkingBytes + (s.savedBytes - s.options[k].savedBytes) -
                                   (recorded - regenerated));
    }
  }

  // 8. Calibration: what the chain does not explain at each moment of the recorded schedule is
  // memory outside the chain; its least value is static, the rest per stage.
  // Blocks recomputed by one recomputation are one segment.
  for (int i = 0; i < n; ++i) {
    if (i > 0 && recomputationOf(i) != nullptr && recomputationOf(i) == recomputationOf(i - 1)) {
      out.recordedPlan.segments.back().last = i;
      continue;
    }
    out.recordedPlan.segments.push_back(
        {i, i, recomputeRun[i].valid ? SegmentMode::kRecompute : SegmentMode::kStore});
  }
  // What the step leaves to the steps after it is there from their start: the optimizer state
  // an optimizer makes at its first step (Adam's moments), gradients that zero_grad keeps
  // (set_to_none=False) — born in the step and still held when the next step begins. A step
  // that made them (the first) is calibrated as the later ones run, with them held from its
  // start, so that a plan made from it fits them; its own recorded peak stays as measured.
  const LivenessReplay replay(rec, categories);
  // The last step recorded has no next one to tell: its gradients may be freed by a zero_grad
  // that never came (set_to_none), so only optimizer state counts there.
  const size_t stepIndex = static_cast<size_t>(step - rec.steps.data());
  const bool hasNext = stepIndex + 1 < rec.steps.size();
  const uint64_t nextBegins = hasNext ? rec.steps[stepIndex + 1].beginSeq : step->endSeq;
  Recording carried;  // the blocks only: all a replay reads
  for (size_t j = 0; j < rec.blocks.size(); ++j) {
    const Block& b = rec.blocks[j];
    const Category c = categories[j].category;
    if (b.allocSeq <= step->beginSeq || b.allocSeq >= step->endSeq || b.freeSeq <= nextBegins ||
        (c != Category::kOptimizerState && (c != Category::kGradient || !hasNext)))
      continue;
    if (carried.blocks.empty()) carried.blocks = rec.blocks;
    carried.blocks[j].allocSeq = step->beginSeq;
  }
  const std::optional<LivenessReplay> carriedReplay =
      carried.blocks.empty() ? std::nullopt
                             : std::optional<LivenessReplay>(std::in_place, carried, categories);
  const LivenessReplay& calibration = carriedReplay ? *carriedReplay : replay;
  auto measured = [&](const Window& w) {
    return calibration.peak(w.beginSeq, w.endSeq).trackedBytes;
  };
  const SimResult model = simulate(p, out.recordedPlan, /*keepPoints=*/true);
  // The end of the forward begins as the last block's forward ends (the layers after the chain
  // run their forward then: a language model's head and its logits; before, they were in no
  // moment, and a Llama's step peaked there, 1.1 % above the model) and lasts until the last
  // block's backward begins, or a recomputation does (a last block the recording checkpointed is
  // recomputed first; that is the model's recompute moment, not the end of the forward): the loss
  // and the layers after the chain run their backward then, with every activation still kept.
  uint64_t endOfForwardEnd = backward[n - 1].valid ? backward[n - 1].beginSeq : fwd->endSeq + 1;
  for (const PhaseInterval* r : recomputes)
    if (r->beginSeq >= fwd->endSeq) endOfForwardEnd = std::min(endOfForwardEnd, r->beginSeq);
  std::vector<int64_t> resForward(n, 0), resBackward(n, std::numeric_limits<int64_t>::min());
  std::vector<int64_t> resRecompute(n, std::numeric_limits<int64_t>::min());
  int64_t resEnd = 0;
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const SimPoint& pt : model.points) {
    int64_t m = 0;
    switch (pt.phase) {
      case SimPhase::kForward:
        m = measured(windowOf(*forward[pt.stage]));
        break;
      case SimPhase::kEndOfForward:
        m = calibration.peak(forward[n - 1]->endSeq, endOfForwardEnd).trackedBytes;
        break;
      case SimPhase::kRecompute:
        m = measured(recomputeRun[pt.stage]);
        break;
      case SimPhase::kBackward:
        // A block whose backward has no window (no scope, and not recomputed: it saved nothing
        // the adapter saw) was not measured there: no residual (taken for nothing outside the
        // chain, it put static at 0).
        if (!backward[pt.stage].valid) continue;
        m = measured(backward[pt.stage]);
        break;
      case SimPhase::kOutside:
        continue;
    }
    const int64_t live = pt.liveBytes;
    const int64_t residual = m - live;
    least = std::min(least, residual);
    if (pt.phase == SimPhase::kForward) resForward[pt.stage] = residual;
    if (pt.phase == SimPhase::kEndOfForward) resEnd = residual;
    if (pt.phase == SimPhase::kBackward)
      resBackward[pt.stage] = std::max(resBackward[pt.stage], residual);
    // A block the recording recomputed: what lies outside the chain while it runs again is its
    // own term (a reentrant checkpoint's nested backward, the loss's gradients not yet freed),
    // not the backward's; the backward's is measured in its own window. One with no backward
    // window has the recomputation's for both.
    if (pt.phase == SimPhase::kRecompute) {
      resRecompute[pt.stage] = std::max(resRecompute[pt.stage], residual);
      if (!backward[pt.stage].valid)
        resBackward[pt.stage] = std::max(resBackward[pt.stage], residual);
    }
  }
  p.staticBytes = std::max<int64_t>(0, least);
  for (int i = 0; i < n; ++i) {
    p.stages[i].forwardOutsideBytes = std::max<int64_t>(0, resForward[i] - p.staticBytes);
    p.stages[i].backwardOutsideBytes = std::max<int64_t>(0, resBackward[i] - p.staticBytes);
    if (resRecompute[i] != std::numeric_limits<int64_t>::min())
      p.stages[i].recomputeOutsideBytes = std::max<int64_t>(0, resRecompute[i] - p.staticBytes);
  }
  p.endOutsideBytes = std::max<int64_t>(0, resEnd - p.staticBytes);
  // The step away from forward and backward: before the forward, after the backward.
  p.floorBytes = std::max(calibration.peak(step->beginSeq, firstForwardBegins).trackedBytes,
                          calibration.peak(bwd->endSeq, step->endSeq).trackedBytes);
  out.measuredPeakBytes = replay.peak(step->beginSeq, step->endSeq).trackedBytes;
  if (carriedReplay)
    out.carriedPeakBytes = carriedReplay->peak(step->beginSeq, step->endSeq).trackedBytes;
  calibrateTimes(rec, rerunTimesFrom, plannedPolicies, &p);

  out.measuredStepNs = step->endTsNs - step->beginTsNs;
  // Every micro-batch runs the blocks (and a plan's recomputation) once.
  for (Stage& st : p.stages) {
    st.forwardNs *= microBatches;
    st.backwardNs *= microBatches;
    for (StageOption& o : st.options) o.recomputeNs *= microBatches;
  }
  out.endOfForwardNs = fwd->endTsNs;
  for (int i = 0; i < n; ++i) {
    out.forwardEndNs.push_back(forward[i]->endTsNs);
    const Window& w = backward[i].valid ? backward[i] : windowOf(*bwd);
    out.backwardBeginNs.push_back(w.beginTsNs);
    out.backwardMidNs.push_back(w.beginTsNs + (w.endTsNs - w.beginTsNs) / 2);
  }
  if (absl::Status s = validateProfile(p); !s.ok()) return s;
  return out;
}

}  // namespace tidemark::core
