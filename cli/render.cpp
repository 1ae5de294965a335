// Rendering of query results shared by several commands.
#include "cli/render.h"

#include <cstdio>

#include "cli/format.h"

namespace tidemark::cli {

std::string breakdownJson(const v1::Breakdown& b) {
  std::string out =
      "{\"session\": " + std::to_string(b.session_id()) +
      ", \"ts_ns\": " + std::to_string(b.ts_ns()) + ", \"seq\": " + std::to_string(b.seq()) +
      ", \"offset_ns\": " + std::to_string(b.offset_ns()) +
      ", \"step\": " + std::to_string(b.step()) +
      ", \"at_peak\": " + (b.at_peak() ? "true" : "false") +
      ", \"summarized\": " + (b.summarized() ? "true" : "false") +
      ", \"phase\": " + jsonString(b.phase()) + ", \"scope\": " + jsonString(b.scope()) +
      ", \"tracked_bytes\": " + std::to_string(b.tracked_bytes()) +
      ", \"reserved_bytes\": " + std::to_string(b.reserved_bytes()) + ", \"categories\": {";
  for (int i = 0; i < b.categories_size(); ++i) {
    const v1::CategoryBytes& c = b.categories(i);
    if (i) out += ", ";
    out += jsonString(c.name()) + ": {\"bytes\": " + std::to_string(c.bytes()) +
           ", \"blocks\": " + std::to_string(c.blocks()) + "}";
  }
  out += "}}";
  return out;
}

void printBreakdown(const v1::Breakdown& b) {
  std::printf("session %llu, %s at +%.3f s%s (seq %llu)%s%s%s%s\n",
              static_cast<unsigned long long>(b.session_id()), b.at_peak() ? "peak" : "state",
              static_cast<double>(b.offset_ns()) / 1e9,
              b.step() >= 0 ? (", in step " + std::to_string(b.step())).c_str() : "",
              static_cast<unsigned long long>(b.seq()), b.phase().empty() ? "" : ", phase ",
              b.phase().c_str(), b.scope().empty() ? "" : ", in ", b.scope().c_str());
  if (b.summarized()) {
    std::puts(
        "a summarized step (capture schedule): the agent's measure, by tags only (UNKNOWN: "
        "what no tag named)");
  }
  std::printf("%-17s %16s %12s %7s %8s\n", "CATEGORY", "BYTES", "", "SHARE", "BLOCKS");
  for (const v1::CategoryBytes& c : b.categories()) {
    if (c.bytes() == 0 && c.blocks() == 0) continue;
    const double share =
        b.tracked_bytes() > 0 ? 100.0 * static_cast<double>(c.bytes()) / b.tracked_bytes() : 0.0;
    std::printf("%-17s %16s %12s %6.1f%% %8lld\n", c.name().c_str(), groupDigits(c.bytes()).c_str(),
                humanBytes(c.bytes()).c_str(), share, static_cast<long long>(c.blocks()));
  }
  std::printf("%-17s %16s %12s\n", "total tracked", groupDigits(b.tracked_bytes()).c_str(),
              humanBytes(b.tracked_bytes()).c_str());
  if (b.reserved_bytes() >= 0)
    std::printf("%-17s %16s %12s\n", "reserved", groupDigits(b.reserved_bytes()).c_str(),
                humanBytes(b.reserved_bytes()).c_str());
}

const char* stateName(v1::SessionState s) {
  switch (s) {
    case v1::SESSION_STATE_LIVE:
      return "live";
    case v1::SESSION_STATE_ENDED:
      return "ended";
    case v1::SESSION_STATE_ABORTED:
      return "aborted";
    default:
      return "?";
  }
}

void printSessionJson(const v1::SessionInfo& s, std::string& out) {
  out += "{\"id\": " + std::to_string(s.id()) + ", \"name\": " + jsonString(s.name()) +
         ", \"state\": " + jsonString(stateName(s.state())) +
         ", \"pid\": " + std::to_string(s.pid()) + ", \"hostname\": " + jsonString(s.hostname()) +
         ", \"command_line\": " + jsonString(s.command_line()) +
         ", \"start_ts_ns\": " + std::to_string(s.start_ts_ns()) +
         ", \"end_ts_ns\": " + std::to_string(s.end_ts_ns()) +
         ", \"start_wall_ns\": " + std::to_string(s.start_wall_ns()) +
         ", \"events_sent\": " + std::to_string(s.events_sent()) +
         ", \"events_received\": " + std::to_string(s.events_received()) +
         ", \"events_stored\": " + std::to_string(s.events_stored()) +
         ", \"events_dropped\": " + std::to_string(s.events_dropped()) +
         ", \"blocks\": " + std::to_string(s.blocks()) +
         ", \"live_blocks_at_end\": " + std::to_string(s.live_blocks_at_end()) +
         ", \"steps\": " + std::to_string(s.steps()) +
         ", \"analyzed\": " + (s.analyzed() ? "true" : "false") +
         ", \"owner_uid\": " + std::to_string(s.owner_uid()) +
         ", \"raw_pruned_wall_ns\": " + std::to_string(s.raw_pruned_wall_ns()) +
         ", \"job_id\": " + std::to_string(s.job_id()) + ", \"rank\": " + std::to_string(s.rank()) +
         ", \"local_rank\": " + std::to_string(s.local_rank()) +
         ", \"world_size\": " + std::to_string(s.world_size()) +
         ", \"daemon\": " + jsonString(s.daemon()) + ", \"stats\": {";
  for (int i = 0; i < s.stats_size(); ++i) {
    const v1::Stat& st = s.stats(i);
    if (i) out += ", ";
    out += jsonString(st.name()) + ": {\"severity\": " + jsonString(st.severity()) +
           ", \"value\": " + std::to_string(st.value()) +
           ", \"description\": " + jsonString(st.description()) + "}";
  }
  out += "}}";
}

}  // namespace tidemark::cli
