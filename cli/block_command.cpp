// `tidemark block SESSION ADDRESS`: a block's history — every block the session held at the
// address, with its allocation (when, in which step, phase, module and op, from what stack), its
// tags, its category and the rule that decided it, and its free.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

namespace {

std::string categoryOf(v1::Category c) { return v1::Category_Name(c).substr(9); }  // "CATEGORY_"

std::string lifeJson(const v1::BlockLife& b) {
  std::string out = "{\"address\": " + std::to_string(b.address()) +
                    ", \"size_bytes\": " + std::to_string(b.size_bytes()) +
                    ", \"device\": " + std::to_string(b.device()) +
                    ", \"thread_id\": " + std::to_string(b.thread_id()) +
                    ", \"alloc_seq\": " + std::to_string(b.alloc_seq()) +
                    ", \"alloc_ts_ns\": " + std::to_string(b.alloc_ts_ns()) +
                    ", \"alloc_offset_ns\": " + std::to_string(b.alloc_offset_ns()) +
                    ", \"freed\": " + (b.freed() ? "true" : "false");
  if (b.freed())
    out += ", \"free_seq\": " + std::to_string(b.free_seq()) +
           ", \"free_ts_ns\": " + std::to_string(b.free_ts_ns());
  out += ", \"step\": " + std::to_string(b.step()) + ", \"phase\": " + jsonString(b.phase()) +
         ", \"module\": " + jsonString(b.module()) + ", \"op\": " + jsonString(b.op()) +
         ", \"category\": " + jsonString(categoryOf(b.category())) +
         ", \"rule\": " + jsonString(b.rule()) + ", \"tags\": [";
  for (int i = 0; i < b.tags_size(); ++i) {
    const v1::BlockTag& t = b.tags(i);
    out += std::string(i ? ", " : "") + "{\"seq\": " + std::to_string(t.seq()) +
           ", \"ts_ns\": " + std::to_string(t.ts_ns()) +
           ", \"category\": " + jsonString(categoryOf(t.category())) +
           ", \"name\": " + jsonString(t.name()) + "}";
  }
  out += "], \"frames\": [";
  for (int i = 0; i < b.frames_size(); ++i) out += (i ? ", " : "") + jsonString(b.frames(i));
  return out + "]}";
}

void printLife(const v1::BlockLife& b) {
  std::printf("block 0x%llx, %s (%s bytes), %s\n", static_cast<unsigned long long>(b.address()),
              humanBytes(static_cast<int64_t>(b.size_bytes())).c_str(),
              groupDigits(static_cast<int64_t>(b.size_bytes())).c_str(),
              b.device() < 0 ? "host memory" : ("cuda:" + std::to_string(b.device())).c_str());
  std::printf("  category   %s (rule: %s)\n", categoryOf(b.category()).c_str(), b.rule().c_str());
  std::string where;
  if (b.step() >= 0) where += ", step " + std::to_string(b.step());
  if (!b.phase().empty()) where += ", " + b.phase();
  if (!b.module().empty()) where += ", in " + b.module();
  if (!b.op().empty()) where += ", op " + b.op();
  std::printf("  allocated  at +%.6f s (seq %llu), thread %u%s\n",
              static_cast<double>(b.alloc_offset_ns()) / 1e9,
              static_cast<unsigned long long>(b.alloc_seq()), b.thread_id(), where.c_str());
  for (const v1::BlockTag& t : b.tags())
    std::printf("  tagged     %s \"%s\" (seq %llu)\n", categoryOf(t.category()).c_str(),
                t.name().c_str(), static_cast<unsigned long long>(t.seq()));
  if (b.freed())
    std::printf("  freed      after %.6f s (seq %llu)\n",
                static_cast<double>(b.free_ts_ns() - b.alloc_ts_ns()) / 1e9,
                static_cast<unsigned long long>(b.free_seq()));
  else
    std::printf("  freed      never: live when the recording ended\n");
  if (!b.frames().empty()) {
    std::printf("  allocated from\n");
    for (const std::string& f : b.frames()) std::printf("    %s\n", f.c_str());
  }
}

}  // namespace

int blockCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  constexpr const char* kUsageText =
      "usage: tidemark block SESSION ADDRESS [--server ADDR] [--json]\n\n"
      "A block's history: every block the session held at ADDRESS (0x-hex or decimal, as\n"
      "`tidemark peak` and the GUI's inspector show them) — when and where it was allocated\n"
      "(step, phase, module, op, and the allocating stack where the recording has one: imported\n"
      "memory snapshots), its tags, its category and the rule that decided it, and its free.\n";
  std::vector<std::string> positional;
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kUsageText, stdout);
      return kExitOk;
    }
    positional.push_back(a);
  }
  uint64_t id = 0;
  if (positional.size() != 2 || !parseSessionId(positional[0], &id)) {
    std::fputs(kUsageText, stderr);
    return kExitUsage;
  }
  const std::string& text = positional[1];
  char* end = nullptr;
  errno = 0;
  const unsigned long long address = std::strtoull(text.c_str(), &end, 0);
  if (text.empty() || *end != '\0' || errno != 0 || text[0] == '-') {
    std::fprintf(stderr, "tidemark block: '%s' is not an address (0x7f3a00000000, or decimal)\n",
                 text.c_str());
    return kExitUsage;
  }
  v1::BlockRequest req;
  req.set_session_id(id);
  req.set_address(address);
  v1::BlockHistory history;
  if (int code = callQuery(g, "block", &v1::Query::Stub::GetBlock, req, &history); code != kExitOk)
    return code;
  if (g.json) {
    std::string out = "{\"session\": " + std::to_string(history.session_id()) + ", \"blocks\": [";
    for (int i = 0; i < history.blocks_size(); ++i)
      out += (i ? ", " : "") + lifeJson(history.blocks(i));
    std::printf("%s]}\n", out.c_str());
    return kExitOk;
  }
  for (int i = 0; i < history.blocks_size(); ++i) {
    if (i) std::printf("\n");
    printLife(history.blocks(i));
  }
  return kExitOk;
}

}  // namespace tidemark::cli
