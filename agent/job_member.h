#pragma once

#include <functional>
#include <string>

#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {

// Whether this process is a rank of a training job, from the variables launchers set
// (docs/jobs.md): the job's key is TIDEMARK_JOB (`tidemark run --job NAME`), else
// TORCHELASTIC_RUN_ID (torchrun; "none" is its value when no rendezvous id was given, no key),
// else MASTER_ADDR:MASTER_PORT (any launcher of torch.distributed); RANK, LOCAL_RANK and
// WORLD_SIZE its place. False (nothing filled) when no key is found. `env` reads a variable
// (nullptr when unset): getenv in the agent, a map in tests.
bool jobMemberFrom(const std::function<const char*(const char*)>& env, v1::JobMember* out);

// TIDEMARK_LAUNCHER=1 (`tidemark run` sets it for torchrun and torch.distributed.launch) in a
// process that is not a rank: the launcher itself, which is not recorded and passes the agent on
// to the ranks it starts.
bool isLauncherOnly(const std::function<const char*(const char*)>& env);

}  // namespace tidemark::agent
