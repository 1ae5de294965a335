#include "src/advisor/chain.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"

namespace tidemark::core {

int64_t ChainProfile::offloadNs(int64_t bytes) const {
  if (offloadBytesPerSecond <= 0 || bytes <= 0) return 0;
  // 2 * bytes * 1e9 / speed without overflow for any size a chain holds.
  const __int128 ns =
      (static_cast<__int128>(2) * bytes * 1'000'000'000 + offloadBytesPerSecond - 1) /
      offloadBytesPerSecond;
  return ns > std::numeric_limits<int64_t>::max() / 4 ? std::numeric_limits<int64_t>::max() / 4
                                                      : static_cast<int64_t>(ns);
}

int64_t ChainProfile::baseStepNs() const {
  int64_t total = 0;
  for (const Stage& s : stages) total += s.forwardNs + s.backwardNs;
  return total;
}

bool extends(const ChainProfile& p, int first, int k) {
  return k < p.size() && p.stages[k].checkpointable && (k == first || p.stages[k].linked);
}

int64_t optionForwardWorkingBytes(const Stage& s, const StageOption& o) {
  return o.forwardWorkingBytes >= 0 ? o.forwardWorkingBytes : s.forwardWorkingBytes;
}

int64_t optionBackwardWorkingBytes(const Stage& s, const StageOption& o) {
  if (o.backwardWorkingBytes >= 0) return o.backwardWorkingBytes;
  return s.backwardWorkingBytes + (s.savedBytes - o.savedBytes);
}

absl::Status validateProfile(const ChainProfile& profile) {
  if (profile.stages.empty()) return absl::InvalidArgumentError("the chain has no stages");
  if (profile.staticBytes < 0) return absl::InvalidArgumentError("static_bytes is negative");
  if (profile.inputBytes < 0) return absl::InvalidArgumentError("input_bytes is negative");
  if (profile.floorBytes < 0) return absl::InvalidArgumentError("floor_bytes is negative");
  if (profile.endOutsideBytes < 0)
    return absl::InvalidArgumentError("end_outside_bytes is negative");
  if (profile.offloadBytesPerSecond < 0)
    return absl::InvalidArgumentError("offload_bytes_per_second is negative");
  // Sums with a ceiling: each value is checked before it is added, so the sum cannot overflow.
  int64_t bytes = 0, ns = 0;
  const auto add = [](int64_t* total, int64_t v) {
    if (v > kMaxProfileTotal - *total) return false;
    *total += std::max<int64_t>(0, v);
    return true;
  };
  const auto tooLarge = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("the profile's ", what, " add up to more than ",
                                                   kMaxProfileTotal, " (2^56): not a step"));
  };
  for (int64_t v :
       {profile.staticBytes, profile.inputBytes, profile.floorBytes, profile.endOutsideBytes})
    if (!add(&bytes, v)) return tooLarge("sizes");
  std::set<std::string> names;
  for (size_t i = 0; i < profile.stages.size(); ++i) {
    const Stage& s = profile.stages[i];
    const std::string where = absl::StrCat("stage ", i, " (", s.name, ")");
    if (s.name.empty())
      return absl::InvalidArgumentError(absl::StrCat("stage ", i, " has no name"));
    if (!names.insert(s.name).second)
      return absl::InvalidArgumentError(absl::StrCat(where, ": the name is used twice"));
    if (s.forwardNs < 0 || s.backwardNs < 0 || s.rerunNs < 0)
      return absl::InvalidArgumentError(absl::StrCat(where, ": a negative time"));
    if (s.savedBytes < 0 || s.outputBytes < 0 || s.forwardWorkingBytes < 0 ||
        s.backwardWorkingBytes < 0 || s.forwardOutsideBytes < 0 || s.backwardOutsideBytes < 0 ||
        s.recomputeOutsideBytes < -1 || s.checkpointedForwardWorkingBytes < -1)
      return absl::InvalidArgumentError(absl::StrCat(where, ": a negative size"));
    for (int64_t v : {s.savedBytes, s.outputBytes, s.forwardWorkingBytes, s.backwardWorkingBytes,
                      s.forwardOutsideBytes, s.backwardOutsideBytes, s.recomputeOutside(),
                      s.checkpointedForwardWorking()})
      if (!add(&bytes, v)) return tooLarge("sizes");
    for (int64_t v : {s.forwardNs, s.backwardNs, s.rerunNs})
      if (!add(&ns, v)) return tooLarge("times");
    std::set<std::string> optionNames;
    for (const StageOption& o : s.options) {
      for (int64_t v : {o.savedBytes, o.forwardWorkingBytes, o.backwardWorkingBytes})
        if (!add(&bytes, v)) return tooLarge("sizes");
      if (!add(&ns, o.recomputeNs)) return tooLarge("times");
      // A plan names its option: two of one name would be one plan applied as another.
      if (!optionNames.insert(o.name).second)
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": two options are named '", o.name, "'"));
      if (o.savedBytes < 0 || o.savedBytes > s.savedBytes)
        return absl::InvalidArgumentError(absl::StrCat(where, ": option '", o.name, "' keeps ",
                                                       o.savedBytes, " bytes, outside 0..",
                                                       s.savedBytes));
      if (o.forwardWorkingBytes < -1 || o.backwardWorkingBytes < -1)
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": option '", o.name, "' has a negative working size"));
      if (!o.policy.empty() && !isSavePolicy(o.policy))
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": option '", o.name, "' has an unknown policy '", o.policy, "' (",
            kSavePolicyMatmul, ", or ", kSavePolicyMatmul, ":OP#N,... for some of the calls)"));
      if (o.recomputeNs < 0)
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": option '", o.name, "' has a negative time"));
    }
  }
  return absl::OkStatus();
}

bool isSavePolicy(std::string_view policy) {
  if (policy == kSavePolicyMatmul) return true;
  const std::string_view head = std::string_view(kSavePolicyMatmul);
  if (policy.size() <= head.size() + 1 || policy.substr(0, head.size()) != head ||
      policy[head.size()] != ':')
    return false;
  // OP#N entries, comma-separated: OP in [a-z0-9_], N a decimal occurrence of 1 to 9 digits.
  const auto opChar = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  };
  const auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  std::string_view rest = policy.substr(head.size() + 1);
  for (;;) {
    const size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    const size_t hash = entry.find('#');
    if (hash == std::string_view::npos) return false;
    const std::string_view op = entry.substr(0, hash), number = entry.substr(hash + 1);
    if (op.empty() || number.empty() || number.size() > 9 ||
        !std::all_of(op.begin(), op.end(), opChar) ||
        !std::all_of(number.begin(), number.end(), digit))
      return false;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return true;
}

namespace {

absl::Status validateSegments(const ChainProfile& profile, const std::vector<Segment>& segments,
                              int from, int to, bool inner) {
  int next = from;
  for (const Segment& seg : segments) {
    if (seg.first != next || seg.last < seg.first || seg.last > to)
      return absl::InvalidArgumentError(absl::StrCat("segments must cover stages ", from, "..", to,
                                                     " in order; got [", seg.first, ", ", seg.last,
                                                     "] where stage ", next, " was expected"));
    if (seg.mode == SegmentMode::kRecompute) {
      for (int i = seg.first; i <= seg.last; ++i) {
        if (!profile.stages[i].checkpointable)
          return absl::InvalidArgumentError(
              absl::StrCat("stage ", profile.stages[i].name, " cannot be recomputed"));
        if (i > seg.first && !profile.stages[i].linked)
          return absl::InvalidArgumentError(absl::StrCat(
              "the recomputed segment [", seg.first, ", ", seg.last, "] runs into stage ",
              profile.stages[i].name, ", whose input is not the previous stage's output"));
      }
      if (inner && seg.first == from && seg.last == to)
        return absl::InvalidArgumentError(absl::StrCat("the recomputed segment [", from, ", ", to,
                                                       "] lists itself in its inner plan"));
      if (!seg.inner.empty()) {
        absl::Status st = validateSegments(profile, seg.inner, seg.first, seg.last, true);
        if (!st.ok()) return st;
      }
    } else if (!seg.inner.empty()) {
      return absl::InvalidArgumentError("only a recomputed segment has an inner plan");
    }
    if (seg.mode == SegmentMode::kOffload) {
      if (inner) return absl::InvalidArgumentError("an inner plan stores or recomputes");
      if (profile.offloadBytesPerSecond <= 0)
        return absl::InvalidArgumentError(
            "the plan offloads stages, but the chain has no offload speed");
      if (seg.option >= 0) return absl::InvalidArgumentError("an offloaded stage has no option");
    }
    if (seg.option >= 0) {
      if (inner) return absl::InvalidArgumentError("an inner plan stores stages without options");
      if (seg.mode != SegmentMode::kStore || seg.first != seg.last)
        return absl::InvalidArgumentError("an option applies to one stored stage only");
      if (seg.option >= static_cast<int>(profile.stages[seg.first].options.size()))
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", profile.stages[seg.first].name, " has no option ", seg.option));
    }
    next = seg.last + 1;
  }
  if (next != to + 1)
    return absl::InvalidArgumentError(
        absl::StrCat("the plan covers stages ", from, "..", next - 1, " of ", from, "..", to));
  return absl::OkStatus();
}

void appendSignature(const std::vector<Segment>& segments, std::string* out) {
  for (size_t k = 0; k < segments.size(); ++k) {
    const Segment& seg = segments[k];
    if (k) *out += '|';
    if (seg.option >= 0) {
      absl::StrAppend(out, "s", seg.option);
      continue;
    }
    if (!seg.inner.empty()) {
      *out += "R[";
      appendSignature(seg.inner, out);
      *out += ']';
      continue;
    }
    out->append(static_cast<size_t>(seg.last - seg.first + 1),
                seg.mode == SegmentMode::kRecompute ? 'R'
                : seg.mode == SegmentMode::kOffload ? 'O'
                                                    : 'S');
  }
}

int segmentsDepth(const std::vector<Segment>& segments) {
  int depth = 0;
  for (const Segment& seg : segments)
    if (seg.mode == SegmentMode::kRecompute) depth = std::max(depth, 1 + segmentsDepth(seg.inner));
  return depth;
}

}  // namespace

absl::Status validatePlan(const ChainProfile& profile, const ChainPlan& plan) {
  if (profile.size() == 0) return absl::InvalidArgumentError("the chain has no stages");
  return validateSegments(profile, plan.segments, 0, profile.size() - 1, false);
}

std::string planSignature(const ChainPlan& plan) {
  std::string out;
  appendSignature(plan.segments, &out);
  return out;
}

int planDepth(const ChainPlan& plan) { return segmentsDepth(plan.segments); }

}  // namespace tidemark::core
