#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tidemark::inject {

struct AttachOptions {
  std::string agentPath;  // libtidemark_agent.so (absolute)
  std::string pythonDir;  // the directory holding the tidemark package ("" : no adapter)
  std::string server;     // tidemarkd's address, for the agent
  std::string token;      // the token the agent presents there ("" : none)
  std::string tlsCa, tlsCert, tlsKey;  // TLS to the daemon: PEM files ("" : none)
  std::string sessionName;
  bool adapter = true;
  bool ops = false;  // torch 2: op scopes (the adapter turns torch's op callback on)
  // A capture schedule (core::CaptureSchedule's settings; all empty: every step in detail).
  std::string captureSteps, captureEvery, captureWindow;
  int timeoutMs = 60000;  // for the agent to report (the adapter waits for the GIL)
};

struct AttachReport {
  uint64_t sessionId = 0;
  bool python = false;          // the adapter started inside CPython
  uint64_t patchedEntries = 0;  // GOT entries pointed at the hooks
  bool loadedNow = false;       // false: the agent was there, dormant, from an earlier attach
  std::string message;          // the agent's own words
};

// Makes process `pid` load the agent (once) and start recording; returns when the agent says it
// records. Errors (the process untouched unless it exited): NotFound (no such process),
// PermissionDenied (ptrace not allowed; the message says what to change), FailedPrecondition
// (unsupported architecture), AlreadyExists (already attached, or recorded under tidemark run),
// Aborted (the process exited during the attach), DeadlineExceeded, Internal.
absl::StatusOr<AttachReport> attachAgent(pid_t pid, const AttachOptions& options);

// Stops recording in a process attached before: the agent closes its session and stays loaded,
// dormant. FailedPrecondition when the process is not attached.
absl::StatusOr<AttachReport> detachAgent(pid_t pid, const std::string& agentPath, int timeoutMs);

}  // namespace tidemark::inject
