#pragma once

#include <string>
#include <vector>

#include "cli/commands.h"
#include "tidemark/v1/query.pb.h"

namespace tidemark::cli {

// A job by its id, or by a key (its newest job): Query.GetJob. An exit code (kExitOk: *job set).
int fetchJob(const GlobalOptions& g, const char* what, const std::string& which, v1::Job* job);

// For the commands that read one session (plan, chain, pareto): `--job JOB [--rank R]` in args
// is replaced by the session of the job's rank R, or of the rank that sets its memory need.
// False (and *code) when the job or rank is not there.
bool takeJobOption(const GlobalOptions& g, const char* command, std::vector<std::string>* args,
                   int* code);

// `tidemark apply --job JOB PLAN`: the plan on every live rank, from one step on.
int applyToJob(const GlobalOptions& g, const std::vector<std::string>& args);
// `tidemark plan-check --job JOB`: each rank's plans.
int planCheckOfJob(const GlobalOptions& g, const std::vector<std::string>& args);

}  // namespace tidemark::cli
