#pragma once

#include <cstdint>
#include <string>

#include "cli/commands.h"
#include "tidemark/v1/advisor.pb.h"

namespace tidemark::cli {

// A plan document from a file, checked (docs/plan-format.md); false after saying why (as
// `tidemark COMMAND: ...`).
bool readPlanFile(const char* command, const std::string& path, std::string* text);

// The plans sent to a session (Advisor.PlanCheck): "sent", "applied", "refused".
const char* planStateName(v1::PlanState s);
int callPlanCheck(const GlobalOptions& g, const char* what, uint64_t session,
                  v1::PlanCheckResponse* resp);
// Measured against predicted, in percent (0 without a prediction).
double errorPct(int64_t measured, int64_t predicted);
// The plans as `tidemark plan-check --json` lists them: a JSON array.
std::string planOutcomesJson(const v1::PlanCheckResponse& resp);
// The plans as `tidemark plan-check` prints them.
void printPlanOutcomes(uint64_t session, const v1::PlanCheckResponse& resp);

}  // namespace tidemark::cli
