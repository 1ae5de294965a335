#include "src/advisor/megatron_flags.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <tuple>

namespace tidemark::core {

namespace {

// The plan with runs of plainly stored stages as one segment each (a stored segment's split
// changes nothing), so that two plans compare by their signatures.
ChainPlan merged(const ChainPlan& plan) {
  ChainPlan out;
  for (const Segment& s : plan.segments) {
    const bool plain = s.mode == SegmentMode::kStore && s.option < 0 && s.inner.empty();
    if (plain && !out.segments.empty()) {
      Segment& last = out.segments.back();
      if (last.mode == SegmentMode::kStore && last.option < 0 && last.inner.empty()) {
        last.last = s.last;
        continue;
      }
    }
    out.segments.push_back(s);
  }
  return out;
}

// The option of a stage that re-runs its attention and nothing else (a child under the stage
// whose path names it: "attn", "attention"; "blocks.3.attn.core" too), or -1.
int attentionOption(const Stage& stage) {
  auto lower = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
  };
  for (size_t k = 0; k < stage.options.size(); ++k) {
    const StageOption& o = stage.options[k];
    if (!o.policy.empty() || o.recompute.size() != 1) continue;
    std::string child = o.recompute.front();
    if (child.rfind(stage.name + ".", 0) == 0) child = child.substr(stage.name.size() + 1);
    child = lower(child);
    if (child.find("attn") != std::string::npos || child.find("attention") != std::string::npos)
      return static_cast<int>(k);
  }
  return -1;
}

}  // namespace

MegatronExport megatronExport(const ChainProfile& profile, int64_t budgetBytes, int64_t marginBytes,
                              const ChainPlan& plan) {
  std::vector<int> layers;  // the checkpointable stages: Megatron's layers
  for (int i = 0; i < profile.size(); ++i)
    if (profile.stages[static_cast<size_t>(i)].checkpointable) layers.push_back(i);
  const int n = static_cast<int>(layers.size());

  std::vector<MegatronChoice> candidates;
  auto add = [&](std::vector<std::string> flags, ChainPlan p) {
    p = merged(p);
    if (!validatePlan(profile, p).ok()) return;  // e.g. a group across a stage not checkpointable
    MegatronChoice c;
    c.flags = std::move(flags);
    c.predicted = simulate(profile, p);
    c.fits = c.predicted.peakBytes <= (c.flags.empty() ? budgetBytes : budgetBytes - marginBytes);
    c.plan = std::move(p);
    candidates.push_back(std::move(c));
  };
  auto stored = [](int i) { return Segment(i, i, SegmentMode::kStore); };

  add({}, ChainPlan{{Segment(0, profile.size() - 1, SegmentMode::kStore)}});
  for (int k = 1; k <= n; ++k) {
    // block: the first k layers each recomputed alone, the others stored.
    ChainPlan block;
    for (int i = 0; i < profile.size(); ++i) {
      const auto at = std::find(layers.begin(), layers.end(), i);
      const bool recompute = at != layers.end() && at - layers.begin() < k;
      block.segments.push_back(recompute ? Segment(i, i, SegmentMode::kRecompute) : stored(i));
    }
    add({"--recompute-granularity full", "--recompute-method block",
         "--recompute-num-layers " + std::to_string(k)},
        block);
    // uniform: the layers in groups of k, each group one recomputed segment.
    ChainPlan uniform;
    int next = 0;  // the next stage to place
    for (int g = 0; g < n; g += k) {
      const int first = layers[static_cast<size_t>(g)];
      const int last = layers[static_cast<size_t>(std::min(g + k, n) - 1)];
      for (; next < first; ++next) uniform.segments.push_back(stored(next));
      uniform.segments.push_back(Segment(first, last, SegmentMode::kRecompute));
      next = last + 1;
    }
    for (; next < profile.size(); ++next) uniform.segments.push_back(stored(next));
    if (k > 1)  // uniform 1 is block n
      add({"--recompute-granularity full", "--recompute-method uniform",
           "--recompute-num-layers " + std::to_string(k)},
          uniform);
  }
  // selective: every layer keeps all but its attention.
  bool everyLayerHasAttention = n > 0;
  ChainPlan selective;
  for (int i = 0; i < profile.size(); ++i) {
    const Stage& s = profile.stages[static_cast<size_t>(i)];
    const int option = s.checkpointable ? attentionOption(s) : -1;
    if (s.checkpointable && option < 0) everyLayerHasAttention = false;
    selective.segments.push_back(Segment(i, i, SegmentMode::kStore, option));
  }
  if (everyLayerHasAttention) add({"--recompute-granularity selective"}, selective);

  MegatronExport out;
  out.candidates = static_cast<int>(candidates.size());
  // Those that fit before those that do not; then the least extra time (then peak) among the
  // first, the least peak among the others.
  auto rank = [](const MegatronChoice& c) {
    return c.fits ? std::make_tuple(0, c.predicted.extraNs, c.predicted.peakBytes)
                  : std::make_tuple(1, c.predicted.peakBytes, int64_t{0});
  };
  const MegatronChoice* best = &*std::min_element(
      candidates.begin(), candidates.end(),
      [&](const MegatronChoice& x, const MegatronChoice& y) { return rank(x) < rank(y); });
  out.best = *best;
  const std::string mine = planSignature(merged(plan));
  for (const MegatronChoice& c : candidates) out.sameAsPlan |= planSignature(c.plan) == mine;
  if (!out.best.flags.empty() && out.best.flags.front() == "--recompute-granularity selective") {
    out.note =
        "Megatron's selective recomputation re-runs the core attention only (not its "
        "projections): it keeps a little more and recomputes a little less than modelled";
  }
  return out;
}

std::string megatronToJson(const MegatronExport& e) {
  std::string flags;
  for (const std::string& f : e.best.flags) flags += (flags.empty() ? "" : " ") + f;
  nlohmann::ordered_json j;
  j["flags"] = flags;
  j["fits"] = e.best.fits;
  j["predicted"] = {{"peak_bytes", e.best.predicted.peakBytes},
                    {"extra_ns", e.best.predicted.extraNs}};
  j["plan"] = planSignature(e.best.plan);
  j["plan_expressible"] = e.sameAsPlan;
  j["candidates"] = e.candidates;
  j["note"] = e.note;
  return j.dump(2) + "\n";
}

}  // namespace tidemark::core
