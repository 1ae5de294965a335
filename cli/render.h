#pragma once

#include <string>

#include "tidemark/v1/query.pb.h"

namespace tidemark::cli {

// {"session": .., "ts_ns": .., "seq": .., "step": .., "at_peak": .., "phase": .., "scope": ..,
//  "tracked_bytes": .., "categories": {"WEIGHT": {"bytes": .., "blocks": ..}, ...}}
std::string breakdownJson(const v1::Breakdown& b);
// A table: one line per non-empty category with bytes, share and blocks, then the total.
void printBreakdown(const v1::Breakdown& b);
// "live", "ended", "aborted".
const char* stateName(v1::SessionState s);
// A session as `tidemark sessions --json` lists it, appended to out.
void printSessionJson(const v1::SessionInfo& s, std::string& out);

}  // namespace tidemark::cli
