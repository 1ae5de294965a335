#include "src/advisor/plan_json.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace tidemark::core {

using nlohmann::json;

namespace {

// Reads a JSON object field by field, remembering what was read so that leftovers are reported.
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string where) : m_j(j), m_where(std::move(where)) {
    if (!j.is_object()) m_status = absl::InvalidArgumentError(m_where + ": expected an object");
  }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) {
    const json* v = find(key, fallback.has_value());
    if (v == nullptr) return fallback.value_or(0);
    if (!v->is_number_integer()) {
      fail(absl::StrCat(key, " must be an integer"));
      return 0;
    }
    return v->get<int64_t>();
  }
  std::string string(const char* key, std::optional<std::string> fallback = std::nullopt) {
    const json* v = find(key, fallback.has_value());
    if (v == nullptr) return fallback.value_or("");
    if (!v->is_string()) {
      fail(absl::StrCat(key, " must be a string"));
      return {};
    }
    return v->get<std::string>();
  }
  bool boolean(const char* key, bool fallback) {
    const json* v = find(key, true);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      fail(absl::StrCat(key, " must be true or false"));
      return fallback;
    }
    return v->get<bool>();
  }
  std::vector<std::string> strings(const char* key) {
    std::vector<std::string> out;
    const json* v = find(key, true);
    if (v == nullptr) return out;
    if (!v->is_array()) {
      fail(absl::StrCat(key, " must be a list of strings"));
      return out;
    }
    for (const json& s : *v) {
      if (!s.is_string()) {
        fail(absl::StrCat(key, " must be a list of strings"));
        return {};
      }
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  // An array or object field (or nullptr when optional and absent).
  const json* raw(const char* key, bool optional) { return find(key, optional); }

  // The first error, or one naming the keys nobody read.
  absl::Status finish() {
    if (!m_status.ok()) return m_status;
    for (auto it = m_j.begin(); it != m_j.end(); ++it)
      if (!m_read.count(it.key()))
        return absl::InvalidArgumentError(absl::StrCat(m_where, ": unknown key '", it.key(), "'"));
    return absl::OkStatus();
  }
  const absl::Status& status() const { return m_status; }
  void fail(const std::string& what) {
    if (m_status.ok()) m_status = absl::InvalidArgumentError(absl::StrCat(m_where, ": ", what));
  }

 private:
  const json* find(const char* key, bool optional) {
    if (!m_status.ok()) return nullptr;
    m_read.insert(key);
    auto it = m_j.find(key);
    if (it == m_j.end()) {
      if (!optional) fail(absl::StrCat("missing ", key));
      return nullptr;
    }
    return &*it;
  }

  const json& m_j;
  std::string m_where;
  absl::Status m_status;
  std::set<std::string> m_read;
};

absl::StatusOr<json> parseJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  return j;
}

absl::Status checkFormat(ObjectReader& top, const char* format, int version) {
  const std::string f = top.string("format");
  const int64_t v = top.integer("version");
  if (!top.status().ok()) return top.status();
  if (!f.empty() && f != format)
    return absl::InvalidArgumentError(absl::StrCat("format is '", f, "', expected '", format, "'"));
  if (v > version)
    return absl::InvalidArgumentError(
        absl::StrCat(format, " version ", v, " is newer than this tidemark reads (", version, ")"));
  if (v < 1) return absl::InvalidArgumentError(absl::StrCat(format, ": version must be >= 1"));
  return absl::OkStatus();
}

const char* segmentModeName(const Segment& seg) {
  if (seg.option >= 0) return "selective";
  switch (seg.mode) {
    case SegmentMode::kRecompute:
      return "recompute";
    case SegmentMode::kOffload:
      return "offload";
    case SegmentMode::kStore:
      break;
  }
  return "store";
}

json segmentJson(const ChainProfile& p, const Segment& seg) {
  // The input the plan was made for: a job whose blocks now take more (a larger batch or
  // sequence) turns the plan off rather than run past its prediction.
  json s = {{"mode", segmentModeName(seg)},
            {"modules", json::array()},
            {"input_bytes", p.inBytes(seg.first)}};
  for (int i = seg.first; i <= seg.last; ++i) s["modules"].push_back(p.stages[i].name);
  if (seg.option >= 0) {
    const StageOption& o = p.stages[seg.first].options[seg.option];
    s["option"] = o.name;
    s["recompute"] = o.recompute;
    if (!o.policy.empty()) s["policy"] = o.policy;
  }
  if (!seg.inner.empty()) {
    s["inner"] = json::array();
    for (const Segment& part : seg.inner) s["inner"].push_back(segmentJson(p, part));
  }
  return s;
}

// One segment of a plan document; `where` names it in errors; inner segments at most `depth`
// deeper (a document nested past any chain's length is refused, not followed).
absl::StatusOr<PlanSegmentDoc> parseSegment(const json& j, const std::string& where, int depth) {
  ObjectReader sr(j, where);
  PlanSegmentDoc seg;
  seg.mode = sr.string("mode");
  seg.modules = sr.strings("modules");
  seg.option = sr.string("option", "");
  seg.recompute = sr.strings("recompute");
  seg.policy = sr.string("policy", "");
  seg.inputBytes = sr.integer("input_bytes", -1);
  const json* inner = sr.raw("inner", true);
  if (inner != nullptr && !inner->is_array()) sr.fail("inner must be a list");
  if (absl::Status s = sr.finish(); !s.ok()) return s;
  if (seg.mode != "store" && seg.mode != "recompute" && seg.mode != "selective" &&
      seg.mode != "offload")
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": mode '", seg.mode, "' is not store, recompute, selective or offload"));
  if (seg.modules.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no modules"));
  if (inner == nullptr) return seg;
  if (seg.mode != "recompute")
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": only a recompute segment has inner segments"));
  if (depth <= 0) return absl::InvalidArgumentError(absl::StrCat(where, ": nested too deep"));
  size_t covered = 0;
  for (size_t i = 0; i < inner->size(); ++i) {
    absl::StatusOr<PlanSegmentDoc> part =
        parseSegment((*inner)[i], absl::StrCat(where, ".inner[", i, "]"), depth - 1);
    if (!part.ok()) return part.status();
    if (part->mode == "selective")
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".inner[", i, "]: inner segments store or recompute"));
    for (const std::string& m : part->modules) {
      if (covered >= seg.modules.size() || seg.modules[covered] != m)
        return absl::InvalidArgumentError(absl::StrCat(where, ".inner[", i, "]: module ", m,
                                                       " is not the segment's next module"));
      ++covered;
    }
    seg.inner.push_back(std::move(*part));
  }
  if (covered != seg.modules.size())
    return absl::InvalidArgumentError(absl::StrCat(where, ": its inner segments cover ", covered,
                                                   " of its ", seg.modules.size(), " modules"));
  return seg;
}

}  // namespace

absl::StatusOr<ChainProfile> parseChainProfile(std::string_view text) {
  absl::StatusOr<json> j = parseJson(text);
  if (!j.ok()) return j.status();
  ObjectReader top(*j, "profile");
  if (absl::Status s = checkFormat(top, kChainProfileFormat, kChainProfileVersion); !s.ok())
    return s;
  ChainProfile p;
  p.name = top.string("name", "");
  p.staticBytes = top.integer("static_bytes", 0);
  p.inputBytes = top.integer("input_bytes");
  p.endOutsideBytes = top.integer("end_outside_bytes", 0);
  p.floorBytes = top.integer("floor_bytes", 0);
  p.offloadBytesPerSecond = top.integer("offload_bytes_per_second", 0);
  const json* stages = top.raw("stages", false);
  if (stages != nullptr && !stages->is_array()) top.fail("stages must be a list");
  // `tidemark chain`'s check of the model against the step it came from: read, not used.
  if (const json* recorded = top.raw("recorded", true); recorded != nullptr) {
    ObjectReader rr(*recorded, "profile.recorded");
    rr.integer("step");
    rr.string("plan");
    rr.integer("predicted_peak_bytes");
    rr.integer("measured_peak_bytes");
    rr.integer("measured_step_ns");
    rr.integer("carried_peak_bytes", 0);
    if (absl::Status s = rr.finish(); !s.ok()) return s;
  }
  if (absl::Status s = top.finish(); !s.ok()) return s;
  for (size_t i = 0; i < stages->size(); ++i) {
    ObjectReader r((*stages)[i], absl::StrCat("stages[", i, "]"));
    Stage s;
    s.name = r.string("name");
    s.forwardNs = r.integer("forward_ns");
    s.backwardNs = r.integer("backward_ns");
    s.rerunNs = r.integer("rerun_ns", 0);
    s.savedBytes = r.integer("saved_bytes");
    s.outputBytes = r.integer("output_bytes");
    s.forwardWorkingBytes = r.integer("forward_working_bytes", 0);
    s.backwardWorkingBytes = r.integer("backward_working_bytes", 0);
    s.checkpointedForwardWorkingBytes = r.integer("checkpointed_forward_working_bytes", -1);
    s.checkpointable = r.boolean("checkpointable", true);
    s.linked = r.boolean("linked", true);
    s.forwardOutsideBytes = r.integer("forward_outside_bytes", 0);
    s.backwardOutsideBytes = r.integer("backward_outside_bytes", 0);
    s.recomputeOutsideBytes = r.integer("recompute_outside_bytes", -1);
    const json* options = r.raw("options", true);
    if (options != nullptr && !options->is_array()) r.fail("options must be a list");
    if (absl::Status st = r.finish(); !st.ok()) return st;
    if (options != nullptr) {
      for (size_t k = 0; k < options->size(); ++k) {
        ObjectReader o((*options)[k], absl::StrCat("stages[", i, "].options[", k, "]"));
        StageOption opt;
        opt.name = o.string("name");
        opt.savedBytes = o.integer("saved_bytes");
        opt.recomputeNs = o.integer("recompute_ns");
        opt.recompute = o.strings("recompute");
        opt.policy = o.string("policy", "");
        for (auto [key, field] : {std::pair{"forward_working_bytes", &opt.forwardWorkingBytes},
                                  std::pair{"backward_working_bytes", &opt.backwardWorkingBytes}}) {
          if (o.raw(key, true) == nullptr) continue;
          *field = o.integer(key);
          if (*field < 0) o.fail(absl::StrCat(key, " must not be negative"));
        }
        if (absl::Status st = o.finish(); !st.ok()) return st;
        s.options.push_back(std::move(opt));
      }
    }
    p.stages.push_back(std::move(s));
  }
  if (absl::Status s = validateProfile(p); !s.ok()) return s;
  return p;
}

std::string chainProfileToJson(const ChainProfile& p) {
  json j = {{"format", kChainProfileFormat},
            {"version", kChainProfileVersion},
            {"name", p.name},
            {"static_bytes", p.staticBytes},
            {"input_bytes", p.inputBytes},
            {"stages", json::array()}};
  if (p.endOutsideBytes != 0) j["end_outside_bytes"] = p.endOutsideBytes;
  if (p.floorBytes != 0) j["floor_bytes"] = p.floorBytes;
  if (p.offloadBytesPerSecond != 0) j["offload_bytes_per_second"] = p.offloadBytesPerSecond;
  for (const Stage& s : p.stages) {
    json st = {{"name", s.name},
               {"forward_ns", s.forwardNs},
               {"backward_ns", s.backwardNs},
               {"saved_bytes", s.savedBytes},
               {"output_bytes", s.outputBytes},
               {"forward_working_bytes", s.forwardWorkingBytes},
               {"backward_working_bytes", s.backwardWorkingBytes},
               {"checkpointable", s.checkpointable}};
    if (s.rerunNs != 0) st["rerun_ns"] = s.rerunNs;
    if (!s.linked) st["linked"] = false;
    if (s.forwardOutsideBytes != 0) st["forward_outside_bytes"] = s.forwardOutsideBytes;
    if (s.backwardOutsideBytes != 0) st["backward_outside_bytes"] = s.backwardOutsideBytes;
    if (s.recomputeOutsideBytes >= 0) st["recompute_outside_bytes"] = s.recomputeOutsideBytes;
    if (s.checkpointedForwardWorkingBytes >= 0)
      st["checkpointed_forward_working_bytes"] = s.checkpointedForwardWorkingBytes;
    if (!s.options.empty()) {
      st["options"] = json::array();
      for (const StageOption& o : s.options) {
        json oj = {{"name", o.name},
                   {"saved_bytes", o.savedBytes},
                   {"recompute_ns", o.recomputeNs},
                   {"recompute", o.recompute}};
        if (!o.policy.empty()) oj["policy"] = o.policy;
        if (o.forwardWorkingBytes >= 0) oj["forward_working_bytes"] = o.forwardWorkingBytes;
        if (o.backwardWorkingBytes >= 0) oj["backward_working_bytes"] = o.backwardWorkingBytes;
        st["options"].push_back(std::move(oj));
      }
    }
    j["stages"].push_back(std::move(st));
  }
  return j.dump(2) + "\n";
}

std::string planToJson(const ChainProfile& p, const PlanReport& r) {
  json source = json::object();
  if (!r.source.session.empty()) source["session"] = r.source.session;
  if (r.source.step >= 0) source["step"] = r.source.step;
  if (!r.source.profile.empty()) source["profile"] = r.source.profile;
  if (const PlanSource::AsRecorded& ran = r.source.asRecorded; !ran.plan.empty()) {
    source["as_recorded"] = {{"plan", ran.plan},
                             {"peak_bytes", ran.peakBytes},
                             {"extra_ns", ran.extraNs},
                             {"step_ns", ran.stepNs}};
  }
  json peakAt = {{"phase", simPhaseName(r.predicted.peakAt.phase)}};
  if (r.predicted.peakAt.stage >= 0) peakAt["stage"] = p.stages[r.predicted.peakAt.stage].name;
  json j = {{"format", kPlanFormat},
            {"version", kPlanVersion},
            {"strategy", strategyName(r.strategy)},
            {"budget_bytes", r.budgetBytes},
            {"margin_bytes", r.marginBytes},
            {"margin_met", r.marginMet},
            {"feasible", r.feasible},
            {"predicted",
             {{"peak_bytes", r.predicted.peakBytes},
              {"peak_at", peakAt},
              {"extra_ns", r.predicted.extraNs},
              {"step_ns", r.predicted.stepNs},
              {"overhead", r.predictedOverhead()}}},
            {"baseline", {{"peak_bytes", r.storeAllPeakBytes}, {"step_ns", r.baseStepNs}}},
            {"lower_bound_extra_ns", r.lowerBoundExtraNs},
            {"min_feasible_budget_bytes", r.minFeasibleBudgetBytes},
            {"source", source},
            {"chain", {{"name", p.name}, {"stages", p.size()}, {"static_bytes", p.staticBytes}}},
            {"segments", json::array()}};
  // A plan without nested segments reads as version 1 (what readers before nesting apply).
  if (planDepth(r.plan) <= 1) j["version"] = 1;
  for (const Segment& seg : r.plan.segments) j["segments"].push_back(segmentJson(p, seg));
  if (r.epsilonBytes > 0) j["epsilon_bytes"] = r.epsilonBytes;
  if (!r.warnings.empty()) j["warnings"] = r.warnings;
  return j.dump(2) + "\n";
}

absl::StatusOr<PlanDocument> parsePlanDocument(std::string_view text) {
  absl::StatusOr<json> j = parseJson(text);
  if (!j.ok()) return j.status();
  ObjectReader top(*j, "plan");
  if (absl::Status s = checkFormat(top, kPlanFormat, kPlanVersion); !s.ok()) return s;
  PlanDocument d;
  d.strategy = top.string("strategy");
  d.budgetBytes = top.integer("budget_bytes");
  d.marginBytes = top.integer("margin_bytes", 0);
  d.marginMet = top.boolean("margin_met", true);
  d.feasible = top.boolean("feasible", false);
  const json* predicted = top.raw("predicted", false);
  const json* baseline = top.raw("baseline", false);
  const json* chain = top.raw("chain", false);
  const json* source = top.raw("source", true);
  const json* segments = top.raw("segments", false);
  d.lowerBoundExtraNs = top.integer("lower_bound_extra_ns");
  d.minFeasibleBudgetBytes = top.integer("min_feasible_budget_bytes");
  d.epsilonBytes = top.integer("epsilon_bytes", 0);
  if (d.epsilonBytes < 0) top.fail("epsilon_bytes must not be negative");
  d.applyAtStep = top.integer("apply_at_step", 0);
  d.warnings = top.strings("warnings");
  if (d.applyAtStep < 0) top.fail("apply_at_step must be a step number (1 or more)");
  if (segments != nullptr && !segments->is_array()) top.fail("segments must be a list");
  if (absl::Status s = top.finish(); !s.ok()) return s;

  ObjectReader pr(*predicted, "predicted");
  d.predictedPeakBytes = pr.integer("peak_bytes");
  d.predictedExtraNs = pr.integer("extra_ns");
  d.predictedStepNs = pr.integer("step_ns");
  if (const json* o = pr.raw("overhead", false); o != nullptr) {
    if (o->is_number())
      d.predictedOverhead = o->get<double>();
    else
      pr.fail("overhead must be a number");
  }
  if (const json* at = pr.raw("peak_at", false); at != nullptr) {
    ObjectReader ar(*at, "predicted.peak_at");
    d.predictedPeakPhase = ar.string("phase");
    d.predictedPeakStage = ar.string("stage", "");
    if (absl::Status s = ar.finish(); !s.ok()) return s;
  }
  if (absl::Status s = pr.finish(); !s.ok()) return s;
  ObjectReader br(*baseline, "baseline");
  d.baselinePeakBytes = br.integer("peak_bytes");
  d.baselineStepNs = br.integer("step_ns");
  if (absl::Status s = br.finish(); !s.ok()) return s;
  ObjectReader cr(*chain, "chain");
  d.chainName = cr.string("name", "");
  cr.integer("stages");
  d.staticBytes = cr.integer("static_bytes");
  if (absl::Status s = cr.finish(); !s.ok()) return s;
  if (source != nullptr) {
    ObjectReader sr(*source, "source");
    d.source.session = sr.string("session", "");
    d.source.step = sr.integer("step", -1);
    d.source.profile = sr.string("profile", "");
    if (const json* ran = sr.raw("as_recorded", true); ran != nullptr) {
      ObjectReader rr(*ran, "source.as_recorded");
      d.source.asRecorded.plan = rr.string("plan");
      d.source.asRecorded.peakBytes = rr.integer("peak_bytes");
      d.source.asRecorded.extraNs = rr.integer("extra_ns");
      d.source.asRecorded.stepNs = rr.integer("step_ns");
      if (absl::Status s = rr.finish(); !s.ok()) return s;
    }
    if (absl::Status s = sr.finish(); !s.ok()) return s;
  }
  for (size_t i = 0; i < segments->size(); ++i) {
    absl::StatusOr<PlanSegmentDoc> seg =
        parseSegment((*segments)[i], absl::StrCat("segments[", i, "]"), kPlanMaxDepth);
    if (!seg.ok()) return seg.status();
    d.segments.push_back(std::move(*seg));
  }
  return d;
}

RankProgress rankProgress(const std::vector<StepSpan>& steps) {
  RankProgress p;
  std::vector<const StepSpan*> closed;
  for (const StepSpan& s : steps) {
    p.lastStep = std::max(p.lastStep, s.step);
    if (s.endTsNs > s.beginTsNs) closed.push_back(&s);
  }
  std::sort(closed.begin(), closed.end(),
            [](const StepSpan* a, const StepSpan* b) { return a->step < b->step; });
  constexpr size_t kRecent = 5;
  std::vector<int64_t> times;
  for (size_t i = closed.size() > kRecent ? closed.size() - kRecent : 0; i < closed.size(); ++i)
    times.push_back(closed[i]->endTsNs - closed[i]->beginTsNs);
  if (!times.empty()) {
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    p.stepNs = times[times.size() / 2];
  }
  return p;
}

int64_t jobApplyStep(const std::vector<RankProgress>& ranks, int64_t readingNs) {
  int64_t furthest = 0;
  int64_t fastestNs = 0;
  for (const RankProgress& r : ranks) {
    furthest = std::max(furthest, r.lastStep);
    if (r.stepNs > 0 && (fastestNs == 0 || r.stepNs < fastestNs)) fastestNs = r.stepNs;
  }
  int64_t lead = kJobApplyLeadSteps;
  if (fastestNs > 0) {
    const int64_t ns = kJobApplyLeadNs + 2 * std::max<int64_t>(0, readingNs);
    lead = std::max(lead, (ns + fastestNs - 1) / fastestNs);
  }
  return furthest + lead;
}

absl::StatusOr<std::string> withApplyAtStep(std::string_view planJson, int64_t step) {
  nlohmann::json doc = nlohmann::json::parse(planJson, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return absl::InvalidArgumentError("the plan is not a JSON object");
  doc["apply_at_step"] = step;
  return doc.dump(2) + "\n";
}

}  // namespace tidemark::core
