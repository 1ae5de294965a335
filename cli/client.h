#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "cli/commands.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

// A channel to g.server (the user's own daemon started first if it is the default and none
// answers). nullptr, after saying why, with *exitCode set: kExitRefused when the daemon there is
// not run by this user or root (base::untrustedDaemon: nothing is sent to it), kExitUnreachable
// when the user's own daemon could not be started.
std::shared_ptr<grpc::Channel> channelFor(const GlobalOptions& g, int* exitCode);
// Prints a failed call's status and returns the exit code: kExitUnreachable when nobody answered
// at the address (or not within the call's deadline), kExitError otherwise.
int reportError(const GlobalOptions& g, const char* what, const grpc::Status& s);
// The call's deadline: `seconds` from now, or --deadline's (g.deadlineS) when given.
void withDeadline(const GlobalOptions& g, grpc::ClientContext& ctx, int seconds);
// The seconds withDeadline would give a call (0: none), remembered for reportError's message.
int callDeadline(const GlobalOptions& g, int seconds);

// One unary call of any tidemark service with a deadline: kExitOk, or the exit code of the error
// it reported (as `tidemark <what>: ...`).
template <typename Service, typename Stub, typename Request, typename Response>
int callRpc(const GlobalOptions& g, const char* what,
            grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
            const Request& request, Response* response, int deadlineSeconds = 120) {
  int refused = kExitOk;
  const std::shared_ptr<grpc::Channel> channel = channelFor(g, &refused);
  if (!channel) return refused;
  auto stub = Service::NewStub(channel);
  grpc::ClientContext ctx;
  withDeadline(g, ctx, deadlineSeconds);
  const grpc::Status s = ((*stub).*method)(&ctx, request, response);
  return s.ok() ? kExitOk : reportError(g, what, s);
}

template <typename Request, typename Response>
int callQuery(const GlobalOptions& g, const char* what,
              grpc::Status (v1::Query::Stub::*method)(grpc::ClientContext*, const Request&,
                                                      Response*),
              const Request& request, Response* response, int deadlineSeconds = 120) {
  return callRpc<v1::Query>(g, what, method, request, response, deadlineSeconds);
}
bool parseSessionId(const std::string& s, uint64_t* id);
// "+1.5s", "1500ms", "2s", "250us", "100ns": an offset from the session's start (relative); a bare
// integer is an absolute timestamp in nanoseconds (CLOCK_MONOTONIC of the recording host).
bool parseTime(const std::string& s, bool* relative, int64_t* ns);
// A positional argument of a command taking one SESSION: the first becomes *id (false and a
// message if it is not a session id), any further one is an error. *exitCode is set on false.
bool acceptSessionArg(const char* command, const std::string& arg, bool* have, uint64_t* id,
                      int* exitCode);
// For commands whose only arguments are `count` session ids: parses them into ids[], or prints
// the usage (to stdout for --help, to stderr for bad arguments) and sets *exitCode.
bool parseSessionArgs(const std::vector<std::string>& args, size_t count, const char* usage,
                      uint64_t* ids, int* exitCode);
// Takes "--device D" out of args (all, cpu, cuda, cuda:N; see core::DeviceFilter) into *device.
// False after reporting a bad or missing value (*exitCode = kExitUsage).
bool takeDeviceOption(const char* command, std::vector<std::string>* args, std::string* device,
                      int* exitCode);
// Takes "NAME N" out of args, N a whole number >= minimum, into *value (left as it is when the
// option is absent). False after reporting a bad or missing value (*exitCode = kExitUsage).
bool takeNumberOption(const char* command, std::vector<std::string>* args, const char* name,
                      int64_t minimum, int64_t* value, int* exitCode);
// GetSteps page after page from request's from_step on (the daemon answers a page at a time:
// StepsRequest), all of them into *out; with request.last(), the one page asked for.
int fetchSteps(const GlobalOptions& g, const char* what, v1::StepsRequest request, v1::Steps* out);
// The session's start timestamp, to turn relative times into absolute ones; -1 after reporting
// an error (its exit code in *exitCode).
int64_t sessionStartNs(const GlobalOptions& g, uint64_t session, const char* what, int* exitCode);
// Under a human answer about a session: its stats that say the recording may miss something
// (severity error or data_loss: events dropped, adapter failures), one line each, so that a
// breakdown read by a person says what `tidemark sessions --json` says. Nothing when there are
// none or the session cannot be read.
void printSessionCaveats(const GlobalOptions& g, uint64_t session, const char* what);

}  // namespace tidemark::cli
