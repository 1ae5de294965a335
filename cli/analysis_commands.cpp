// `tidemark timeline` and `tidemark peak`: the analysis queries.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/render.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

namespace {

bool parseInt(const std::string& s, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

// Parses "--from/--to TIME" into req (relative times need the session's start).
int resolveTime(const GlobalOptions& g, uint64_t session, const std::string& text, int64_t* ns) {
  bool relative = false;
  if (!parseTime(text, &relative, ns)) {
    std::fprintf(stderr, "tidemark timeline: bad time '%s' (try +1.5s or 250ms)\n", text.c_str());
    return kExitUsage;
  }
  if (relative) {
    int code = kExitOk;
    const int64_t start = sessionStartNs(g, session, "timeline", &code);
    if (start < 0) return code;
    *ns += start;
  }
  return kExitOk;
}

std::string itemsJson(const google::protobuf::RepeatedPtrField<v1::PeakItem>& items) {
  std::string out = "[";
  for (int i = 0; i < items.size(); ++i) {
    const v1::PeakItem& it = items.Get(i);
    if (i) out += ", ";
    out += "{\"name\": " + jsonString(it.name()) + ", \"category\": " +
           jsonString(v1::Category_Name(it.category()).substr(9)) +  // drop "CATEGORY_"
           ", \"bytes\": " + std::to_string(it.bytes()) +
           ", \"blocks\": " + std::to_string(it.blocks()) +
           (it.rule().empty() ? "" : ", \"rule\": " + jsonString(it.rule())) +
           (it.address() == 0 ? "" : ", \"address\": " + std::to_string(it.address())) + "}";
  }
  return out + "]";
}

void printItems(const char* title, const google::protobuf::RepeatedPtrField<v1::PeakItem>& items,
                int limit) {
  if (items.empty()) return;
  const bool tensors = !items.Get(0).rule().empty();
  std::printf("\n%-60s %12s %-17s %7s %s\n", title, "BYTES", "CATEGORY", "BLOCKS",
              tensors ? "RULE          ADDRESS (tidemark block)" : "");
  for (int i = 0; i < items.size() && i < limit; ++i) {
    const v1::PeakItem& it = items.Get(i);
    std::string name = it.name();
    if (name.size() > 60) name = "..." + name.substr(name.size() - 57);
    std::printf("%-60s %12s %-17s %7lld %s", name.c_str(), humanBytes(it.bytes()).c_str(),
                v1::Category_Name(it.category()).substr(9).c_str(),
                static_cast<long long>(it.blocks()), it.rule().c_str());
    if (tensors && it.address() != 0)
      std::printf("%*s0x%llx", std::max(1, 14 - static_cast<int>(it.rule().size())), "",
                  static_cast<unsigned long long>(it.address()));
    std::printf("\n");
  }
}

std::string signedBytes(int64_t delta) {
  return delta > 0 ? "+" + humanBytes(delta) : humanBytes(delta);
}

}  // namespace

int timelineCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  constexpr const char* kUsageText =
      "usage: tidemark timeline SESSION [--from TIME] [--to TIME] [--buckets N] [--device D] "
      "[--server ADDR] [--json]\n\n"
      "Memory over time: per bucket, the lowest and highest tracked bytes, the bytes at its end\n"
      "and the category holding the most of them (--json: every category's lowest, highest and\n"
      "last). TIME is an offset from the session's start (+1.5s, 250ms) or an absolute timestamp\n"
      "in ns. Default: the whole session, 40 buckets (1000 with --json).\n"
      "--device: cpu, cuda or cuda:N memory only (default all).\n";
  v1::TimelineRequest req;
  std::vector<std::string> args = argsIn;
  if (int code = kExitOk; !takeDeviceOption("timeline", &args, req.mutable_device(), &code))
    return code;
  bool haveSession = false;
  std::string from;
  std::string to;
  int64_t buckets = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsageText, stdout);
      return kExitOk;
    } else if ((a == "--from" || a == "--to" || a == "--buckets") && i + 1 >= args.size()) {
      std::fprintf(stderr, "tidemark timeline: %s needs a value\n", a.c_str());
      return kExitUsage;
    } else if (a == "--from") {
      from = args[++i];
    } else if (a == "--to") {
      to = args[++i];
    } else if (a == "--buckets") {
      if (!parseInt(args[++i], &buckets) || buckets < 1 || buckets > 100000) {
        std::fprintf(stderr, "tidemark timeline: --buckets must be 1 to 100000\n");
        return kExitUsage;
      }
    } else {
      uint64_t id = 0;
      if (int code = kExitOk; !acceptSessionArg("timeline", a, &haveSession, &id, &code))
        return code;
      req.set_session_id(id);
    }
  }
  if (!haveSession) {
    std::fputs(kUsageText, stderr);
    return kExitUsage;
  }
  if (from.empty() != to.empty()) {
    std::fputs("tidemark timeline: give both --from and --to, or neither\n", stderr);
    return kExitUsage;
  }
  if (!from.empty()) {
    int64_t ns = 0;
    if (int code = resolveTime(g, req.session_id(), from, &ns); code != kExitOk) return code;
    req.set_from_ts_ns(ns);
    if (int code = resolveTime(g, req.session_id(), to, &ns); code != kExitOk) return code;
    req.set_to_ts_ns(ns);
  }
  req.set_buckets(static_cast<int32_t>(buckets != 0 ? buckets : (g.json ? 1000 : 40)));

  v1::Timeline t;
  if (int code = callQuery(g, "timeline", &v1::Query::Stub::GetTimeline, req, &t);
      code != kExitOk) {
    return code;
  }

  if (g.json) {
    std::string out = "{\"session\": " + std::to_string(t.session_id()) +
                      ", \"from_ts_ns\": " + std::to_string(t.from_ts_ns()) +
                      ", \"to_ts_ns\": " + std::to_string(t.to_ts_ns()) +
                      ", \"precomputed\": " + (t.precomputed() ? "true" : "false") +
                      ", \"series\": [";
    for (int i = 0; i < t.series_size(); ++i) out += (i ? ", " : "") + jsonString(t.series(i));
    out += "], \"buckets\": [";
    for (int i = 0; i < t.buckets_size(); ++i) {
      const v1::TimelineBucket& b = t.buckets(i);
      auto list = [](const google::protobuf::RepeatedField<int64_t>& v) {
        std::string o = "[";
        for (int k = 0; k < v.size(); ++k) o += (k ? ", " : "") + std::to_string(v.Get(k));
        return o + "]";
      };
      out += std::string(i ? ",\n  " : "\n  ") +
             "{\"start_ts_ns\": " + std::to_string(b.start_ts_ns()) +
             ", \"end_ts_ns\": " + std::to_string(b.end_ts_ns()) +
             ", \"empty\": " + (b.empty() ? "true" : "false") +
             ", \"min\": " + list(b.min_bytes()) + ", \"max\": " + list(b.max_bytes()) +
             ", \"last\": " + list(b.last_bytes()) + "}";
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return kExitOk;
  }
  int64_t top = 1;
  for (const v1::TimelineBucket& b : t.buckets()) top = std::max<int64_t>(top, b.max_bytes(0));
  std::printf(
      "session %llu: tracked bytes over %.3f s (%d buckets; # = max, the bar's scale is %s)\n",
      static_cast<unsigned long long>(t.session_id()),
      static_cast<double>(t.to_ts_ns() - t.from_ts_ns()) / 1e9, t.buckets_size(),
      humanBytes(top).c_str());
  std::printf("%10s %12s %12s %12s  %-16s %s\n", "TIME", "MIN", "MAX", "LAST", "MOSTLY (LAST)", "");
  constexpr int kWidth = 40;
  for (const v1::TimelineBucket& b : t.buckets()) {
    const int bar = static_cast<int>(static_cast<double>(b.max_bytes(0)) * kWidth / top);
    const int low = static_cast<int>(static_cast<double>(b.min_bytes(0)) * kWidth / top);
    std::string drawn(static_cast<size_t>(low), '=');
    drawn += std::string(static_cast<size_t>(std::max(bar - low, 0)), '#');
    // Series 0 is the total; the others are the categories.
    int mostly = 0;
    for (int k = 1; k < b.last_bytes_size() && k < t.series_size(); ++k)
      if (b.last_bytes(k) > 0 && (mostly == 0 || b.last_bytes(k) > b.last_bytes(mostly)))
        mostly = k;
    std::printf("%9.3fs %12s %12s %12s  %-16s %s\n",
                static_cast<double>(b.start_ts_ns() - t.from_ts_ns()) / 1e9,
                humanBytes(b.min_bytes(0)).c_str(), humanBytes(b.max_bytes(0)).c_str(),
                humanBytes(b.last_bytes_size() > 0 ? b.last_bytes(0) : 0).c_str(),
                mostly > 0 ? t.series(mostly).c_str() : "-", drawn.c_str());
  }
  return kExitOk;
}

int peakCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  constexpr const char* kUsageText =
      "usage: tidemark peak SESSION [--step N] [--top K] [--device D] [--server ADDR] [--json]\n\n"
      "The peak of tracked memory (of the session, or of step N): when, how high, the phase and\n"
      "module running, the bytes by category, and for the session's peak the largest modules\n"
      "(the scope each block was allocated in) and tensors live at it: the 10 largest of each,\n"
      "or K (1 to 1000; --json: 20 unless --top is given; past 20 the daemon replays the session\n"
      "to find them). --device: the peak of cpu, cuda or cuda:N memory only (default all).\n";
  v1::PeakRequest req;
  std::vector<std::string> args = argsIn;
  if (int code = kExitOk; !takeDeviceOption("peak", &args, req.mutable_device(), &code))
    return code;
  bool haveSession = false;
  int64_t topK = 10;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsageText, stdout);
      return kExitOk;
    } else if (a == "--step" || a == "--top") {
      int64_t v = 0;
      if (i + 1 >= args.size() || !parseInt(args[i + 1], &v)) {
        std::fprintf(stderr, "tidemark peak: %s needs a number\n", a.c_str());
        return kExitUsage;
      }
      ++i;
      if (a == "--step") {
        req.set_has_step(true);
        req.set_step(v);
      } else if (v < 1 || v > 1000) {
        std::fputs("tidemark peak: --top takes 1 to 1000\n", stderr);
        return kExitUsage;
      } else {
        topK = v;
        req.set_items(static_cast<int32_t>(v));
      }
    } else {
      uint64_t id = 0;
      if (int code = kExitOk; !acceptSessionArg("peak", a, &haveSession, &id, &code)) return code;
      req.set_session_id(id);
    }
  }
  if (!haveSession) {
    std::fputs(kUsageText, stderr);
    return kExitUsage;
  }
  v1::Peak p;
  if (int code = callQuery(g, "peak", &v1::Query::Stub::GetPeak, req, &p); code != kExitOk) {
    return code;
  }
  if (g.json) {
    std::printf("{\"breakdown\": %s, \"modules\": %s, \"ops\": %s, \"tensors\": %s}\n",
                breakdownJson(p.breakdown()).c_str(), itemsJson(p.modules()).c_str(),
                itemsJson(p.ops()).c_str(), itemsJson(p.tensors()).c_str());
    return kExitOk;
  }
  printBreakdown(p.breakdown());
  printItems("MODULE (allocating scope, parameter's owner, or code)", p.modules(),
             static_cast<int>(topK));
  printItems("OP (open at allocation)", p.ops(), static_cast<int>(topK));
  printItems("TENSOR", p.tensors(), static_cast<int>(topK));
  printSessionCaveats(g, req.session_id(), "peak");
  return kExitOk;
}

int stepsCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  constexpr const char* kUsageText =
      "usage: tidemark steps SESSION [--from STEP | --last N] [--device D] [--server ADDR]\n"
      "                      [--json]\n\n"
      "Every step: its duration and its peak, in total and by category, with the change from\n"
      "the step before. --from: the steps numbered STEP or more; --last: the last N steps (at\n"
      "most 4,096: the daemon answers a page of 4,096 steps at a time; without --last every\n"
      "page is read).\n"
      "--device: the peaks of cpu, cuda or cuda:N memory only (default all).\n"
      "Steps a capture schedule summarized (tidemark run --steps) are marked: their peak is the\n"
      "agent's measure, by the tags' categories only (UNKNOWN: what no tag named).\n"
      "Steps of a recording without step marks (no adapter) are inferred from the memory's\n"
      "repetition, and said so (--json: \"inferred\").\n";
  v1::StepsRequest req;
  std::vector<std::string> args = argsIn;
  if (int code = kExitOk; !takeDeviceOption("steps", &args, req.mutable_device(), &code))
    return code;
  int64_t fromStep = 0, last = 0;
  if (int code = kExitOk; !takeNumberOption("steps", &args, "--from", 0, &fromStep, &code) ||
                          !takeNumberOption("steps", &args, "--last", 1, &last, &code))
    return code;
  uint64_t id = 0;
  if (int code = kExitOk; !parseSessionArgs(args, 1, kUsageText, &id, &code)) return code;
  req.set_session_id(id);
  req.set_from_step(fromStep);
  if (last > 4096) {
    std::fprintf(stderr, "tidemark steps: --last takes at most 4096 steps (one page)\n");
    return kExitUsage;
  }
  if (last > 0) {
    req.set_last(true);
    req.set_max_steps(static_cast<uint32_t>(std::min<int64_t>(last, UINT32_MAX)));
  }
  v1::Steps steps;
  if (int code = fetchSteps(g, "steps", req, &steps); code != kExitOk) return code;
  if (g.json) {
    std::string out = "{\"session\": " + std::to_string(steps.session_id()) +
                      ", \"total_steps\": " + std::to_string(steps.total_steps()) +
                      ", \"steps\": [";
    for (int i = 0; i < steps.steps_size(); ++i) {
      const v1::StepSummary& st = steps.steps(i);
      out += std::string(i ? ",\n  " : "\n  ") + "{\"step\": " + std::to_string(st.step()) +
             ", \"begin_ts_ns\": " + std::to_string(st.begin_ts_ns()) +
             ", \"end_ts_ns\": " + std::to_string(st.end_ts_ns()) +
             ", \"summarized\": " + (st.summarized() ? "true" : "false") +
             ", \"events_summarized\": " + std::to_string(st.events_summarized()) +
             ", \"inferred\": " + (st.inferred() ? "true" : "false") +
             ", \"peak\": " + breakdownJson(st.peak()) + "}";
    }
    std::printf("%s]}\n", out.c_str());
    return kExitOk;
  }
  if (steps.steps().empty() && steps.total_steps() > 0) {
    std::printf("no steps from step %lld (the session has %lld)\n",
                static_cast<long long>(fromStep), static_cast<long long>(steps.total_steps()));
    return kExitOk;
  }
  if (steps.steps().empty()) {
    std::puts("no steps recorded (the Python adapter marks them at each optimizer step)");
    return kExitOk;
  }
  // Columns: the categories that are non-zero at some step's peak.
  std::vector<int> shown;
  for (int c = 0; c < steps.steps(0).peak().categories_size(); ++c) {
    for (const v1::StepSummary& st : steps.steps()) {
      if (st.peak().categories(c).bytes() != 0) {
        shown.push_back(c);
        break;
      }
    }
  }
  bool anySummarized = false;
  for (const v1::StepSummary& st : steps.steps()) anySummarized = anySummarized || st.summarized();
  // The categories in one unit (the largest peak's), their names whole or in a short form said
  // under the table: about 140 columns for nine categories, no header cut.
  int64_t largest = 1;
  for (const v1::StepSummary& st : steps.steps())
    largest = std::max<int64_t>(largest, st.peak().tracked_bytes());
  const char* unitName = "B";
  double unit = 1;
  for (const char* u : {"KiB", "MiB", "GiB", "TiB"}) {
    if (static_cast<double>(largest) / unit < 1024 * 10) break;
    unit *= 1024;
    unitName = u;
  }
  auto shortName = [](const std::string& n) -> std::string {
    if (n == "OPTIMIZER_STATE") return "OPT_STATE";
    if (n == "CHECKPOINT_INPUT") return "CKPT_INPUT";
    if (n == "ALLOCATOR_SLACK") return "SLACK";
    return n;
  };
  std::printf("%5s %10s %12s %13s", "STEP", "TIME (ms)", "PEAK", "CHANGE");
  if (anySummarized) std::printf(" %-8s", "DETAIL");
  std::vector<std::string> shortened;
  for (int c : shown) {
    const std::string& n = steps.steps(0).peak().categories(c).name();
    std::printf(" %10s", shortName(n).c_str());
    if (shortName(n) != n) shortened.push_back(shortName(n) + " = " + n);
  }
  std::printf("\n");
  int64_t previous = -1;
  for (const v1::StepSummary& st : steps.steps()) {
    const int64_t peak = st.peak().tracked_bytes();
    std::printf("%5lld %10.1f %12s %13s", static_cast<long long>(st.step()),
                st.end_ts_ns() ? static_cast<double>(st.end_ts_ns() - st.begin_ts_ns()) / 1e6 : 0.0,
                peak < 0 ? "?" : humanBytes(peak).c_str(),
                previous < 0 || peak < 0 ? "" : signedBytes(peak - previous).c_str());
    if (anySummarized) std::printf(" %-8s", st.summarized() ? "summary" : "full");
    for (int c : shown)
      std::printf(" %10.2f", static_cast<double>(st.peak().categories(c).bytes()) / unit);
    std::printf("\n");
    previous = peak;
  }
  std::string key = std::string("(categories at each step's peak, in ") + unitName;
  for (const std::string& k : shortened) key += "; " + k;
  std::printf("%s)\n", key.c_str());
  if (steps.steps(0).inferred()) {
    std::puts("(steps inferred from the memory's repetition: the recording has no step marks)");
  }
  printSessionCaveats(g, id, "steps");
  return kExitOk;
}

int exportCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  constexpr const char* kUsageText =
      "usage: tidemark export SESSION [--format chrome] [-o FILE] [--server ADDR]\n\n"
      "Writes the session as a Chrome trace (JSON) that Perfetto and chrome://tracing open:\n"
      "memory counters per category, module scopes, phases and steps. Default: to stdout.\n";
  v1::ExportRequest req;
  req.set_format("chrome");
  std::string output;
  bool haveSession = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsageText, stdout);
      return kExitOk;
    } else if ((a == "--format" || a == "-o") && i + 1 < args.size()) {
      (a == "-o" ? output : *req.mutable_format()) = args[++i];
    } else {
      uint64_t id = 0;
      if (int code = kExitOk; !acceptSessionArg("export", a, &haveSession, &id, &code)) return code;
      req.set_session_id(id);
    }
  }
  if (!haveSession) {
    std::fputs(kUsageText, stderr);
    return kExitUsage;
  }
  int refused = kExitOk;
  const std::shared_ptr<grpc::Channel> channel = channelFor(g, &refused);
  if (!channel) return refused;
  auto stub = v1::Query::NewStub(channel);
  grpc::ClientContext ctx;
  withDeadline(g, ctx, 600);
  auto reader = stub->Export(&ctx, req);
  // Written to FILE.part and renamed at the end: a failed export leaves no half file behind.
  const std::string partial = output.empty() ? "" : output + ".part";
  std::FILE* out = output.empty() ? stdout : std::fopen(partial.c_str(), "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "tidemark export: cannot write %s\n", partial.c_str());
    return kExitError;
  }
  v1::ExportChunk chunk;
  uint64_t bytes = 0;
  bool writeOk = true;
  while (reader->Read(&chunk)) {
    writeOk = writeOk &&
              std::fwrite(chunk.data().data(), 1, chunk.data().size(), out) == chunk.data().size();
    bytes += chunk.data().size();
  }
  const grpc::Status s = reader->Finish();
  if (out != stdout) std::fclose(out);
  if (!s.ok() || !writeOk) {
    if (!partial.empty()) std::remove(partial.c_str());
    if (!writeOk) {
      std::fprintf(stderr, "tidemark export: writing %s failed\n", output.c_str());
      return kExitError;
    }
    return reportError(g, "export", s);
  }
  if (!partial.empty()) {
    std::rename(partial.c_str(), output.c_str());
    std::fprintf(stderr, "tidemark export: %s (%s)\n", output.c_str(), humanBytes(bytes).c_str());
  }
  return kExitOk;
}

int opsCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  constexpr const char* kUsageText =
      "usage: tidemark ops SESSION [--server ADDR] [--json]\n\n"
      "Time per module (CPU time from its scopes, forward and recompute), per op (torch 2 jobs\n"
      "run with `tidemark run --ops`, imported traces) and per GPU kernel: calls, total, self.\n";
  uint64_t id = 0;
  if (int code = kExitOk; !parseSessionArgs(args, 1, kUsageText, &id, &code)) return code;
  v1::OpsRequest req;
  req.set_session_id(id);
  v1::Ops ops;
  if (int code = callQuery(g, "ops", &v1::Query::Stub::GetOps, req, &ops); code != kExitOk) {
    return code;
  }
  if (g.json) {
    std::string out = "{\"session\": " + std::to_string(ops.session_id()) + ", \"ops\": [";
    for (int i = 0; i < ops.ops_size(); ++i) {
      const v1::OpStat& o = ops.ops(i);
      out += std::string(i ? ", " : "") + "{\"name\": " + jsonString(o.name()) +
             ", \"calls\": " + std::to_string(o.calls()) +
             ", \"total_ns\": " + std::to_string(o.total_ns()) +
             ", \"self_ns\": " + std::to_string(o.self_ns()) +
             ", \"gpu_ns\": " + std::to_string(o.gpu_ns()) +
             ", \"launched_by\": " + jsonString(o.launched_by()) + ", \"kind\": " +
             (o.is_kernel() ? "\"kernel\""
              : o.is_op()   ? "\"op\""
                            : "\"module\"") +
             "}";
    }
    std::printf("%s]}\n", out.c_str());
    return kExitOk;
  }
  if (ops.ops().empty()) {
    std::puts("no module scopes recorded (the Python adapter reports them)");
    return kExitOk;
  }
  // GPU time per module and the launching module per kernel, when kernels were tied to launches.
  bool gpu = false;
  for (const v1::OpStat& o : ops.ops()) gpu = gpu || o.gpu_ns() > 0 || !o.launched_by().empty();
  std::printf("%-60s %-7s %8s %12s %12s%s\n", "MODULE / OP / KERNEL", "KIND", "CALLS", "TOTAL (ms)",
              "SELF (ms)", gpu ? "   GPU (ms)  LAUNCHED BY" : "");
  for (const v1::OpStat& o : ops.ops()) {
    std::string name = o.name();
    if (name.size() > 60) name = "..." + name.substr(name.size() - 57);
    std::printf("%-60s %-7s %8lld %12.3f %12.3f", name.c_str(),
                o.is_kernel() ? "kernel"
                : o.is_op()   ? "op"
                              : "module",
                static_cast<long long>(o.calls()), static_cast<double>(o.total_ns()) / 1e6,
                static_cast<double>(o.self_ns()) / 1e6);
    if (gpu && o.gpu_ns() > 0) std::printf(" %11.3f", static_cast<double>(o.gpu_ns()) / 1e6);
    if (gpu && !o.launched_by().empty()) std::printf(" %11s  %s", "", o.launched_by().c_str());
    std::printf("\n");
  }
  return kExitOk;
}

int diffCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  constexpr const char* kUsageText =
      "usage: tidemark diff SESSION_A SESSION_B [--server ADDR] [--json]\n\n"
      "Two sessions' peaks side by side, by category, with B - A.\n";
  v1::DiffRequest req;
  uint64_t ids[2] = {0, 0};
  if (int code = kExitOk; !parseSessionArgs(args, 2, kUsageText, ids, &code)) return code;
  const uint64_t a = ids[0];
  const uint64_t b = ids[1];
  req.set_session_a(a);
  req.set_session_b(b);
  v1::Diff d;
  if (int code = callQuery(g, "diff", &v1::Query::Stub::GetDiff, req, &d); code != kExitOk) {
    return code;
  }
  if (g.json) {
    std::printf("{\"a\": %s, \"b\": %s, \"steps_a\": %lld, \"steps_b\": %lld}\n",
                breakdownJson(d.peak_a()).c_str(), breakdownJson(d.peak_b()).c_str(),
                static_cast<long long>(d.steps_a()), static_cast<long long>(d.steps_b()));
    return kExitOk;
  }
  std::printf("peaks of session %llu (A, %lld steps) and %llu (B, %lld steps)\n",
              static_cast<unsigned long long>(a), static_cast<long long>(d.steps_a()),
              static_cast<unsigned long long>(b), static_cast<long long>(d.steps_b()));
  std::printf("%-17s %12s %12s %13s\n", "CATEGORY", "A", "B", "B - A");
  for (int i = 0; i < d.peak_a().categories_size() && i < d.peak_b().categories_size(); ++i) {
    const auto& ca = d.peak_a().categories(i);
    const auto& cb = d.peak_b().categories(i);
    if (ca.bytes() == 0 && cb.bytes() == 0) continue;
    std::printf("%-17s %12s %12s %13s\n", ca.name().c_str(), humanBytes(ca.bytes()).c_str(),
                humanBytes(cb.bytes()).c_str(), signedBytes(cb.bytes() - ca.bytes()).c_str());
  }
  const int64_t ta = d.peak_a().tracked_bytes();
  const int64_t tb = d.peak_b().tracked_bytes();
  std::printf("%-17s %12s %12s %13s\n", "total tracked", humanBytes(ta).c_str(),
              humanBytes(tb).c_str(), signedBytes(tb - ta).c_str());
  return kExitOk;
}

}  // namespace tidemark::cli
