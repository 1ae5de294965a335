// `tidemark attach PID` and `tidemark detach PID`: record a running process that was started
// without tidemark (src/inject does the ptrace work; the agent's attach entry the rest).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/install_paths.h"
#include "src/base/daemon_address.h"
#include "src/inject/attach.h"

namespace tidemark::cli {

namespace {

constexpr const char* kAttachUsage =
    R"(usage: tidemark attach PID [--name NAME] [--no-adapter] [--ops] [--agent LIB] [--timeout S]
                       [--steps A-B[,C-D] | --every N [--window W]] [--json]

Records a running process that was started without tidemark. The process is stopped briefly
(one thread, under ptrace), loads libtidemark_agent.so and starts it, and goes on exactly where
it was. The agent patches the allocator entries of the loaded libraries, opens a session, and in
a Python process starts the adapter, which finds the models and optimizers and records the
tensors they already hold. `tidemark detach PID` stops recording; a later attach resumes.

  --name NAME     the session's name
  --no-adapter    allocations only (no Python adapter)
  --ops           torch 2: every aten op as an op scope too (as `tidemark run --ops`)
  --steps A-B     full detail only in these steps, summaries for the others (as `tidemark run
                  --steps`; steps are counted from the attach, the first is 1)
  --every N       full detail in a window of W steps (--window, default 1) every N steps
  --agent LIB     the agent library (default: beside tidemark, or $TIDEMARK_AGENT)
  --timeout S     how long to wait for the agent to report (default 60)

x86-64 Linux only. Needs ptrace rights over the process: the same user with Yama's
ptrace_scope at 0, or root / CAP_SYS_PTRACE.
exit codes: 0 attached, 1 not attached (the message says why; the process is untouched),
2 bad usage, 3 no tidemarkd reachable.
)";

constexpr const char* kDetachUsage =
    R"(usage: tidemark detach PID [--agent LIB] [--timeout S] [--json]

Stops recording in a process attached with `tidemark attach`: its session ends, and the agent
stays loaded, dormant, until the next attach.
exit codes: 0 detached, 1 not detached (the message says why), 2 bad usage.
)";

const char* reasonOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return "no_such_process";
    case absl::StatusCode::kPermissionDenied:
      return "not_permitted";
    case absl::StatusCode::kAlreadyExists:
      return "already_attached";
    case absl::StatusCode::kAborted:
      return "exited";
    case absl::StatusCode::kFailedPrecondition:
      return "unsupported";
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    default:
      return "failed";
  }
}

int fail(const char* command, const GlobalOptions& g, const absl::Status& s) {
  std::fprintf(stderr, "tidemark %s: %s\n", command, std::string(s.message()).c_str());
  if (g.json)
    std::printf("%s\n", nlohmann::json{{"error", std::string(s.message())}, {"reason", reasonOf(s)}}
                            .dump()
                            .c_str());
  return kExitError;
}

struct Args {
  long pid = 0;
  std::string name, agent;
  bool adapter = true;
  bool ops = false;
  int timeoutS = 60;
  std::string steps, every, window;  // a capture schedule
};

// Parses PID and the options; false with *exitCode set when the command should end here.
bool parseArgs(const char* command, const char* usage, bool attach,
               const std::vector<std::string>& args, Args* out, int* exitCode) {
  bool havePid = false;
  auto bad = [&](const std::string& why) {
    std::fprintf(stderr, "tidemark %s: %s\n%s", command, why.c_str(), usage);
    *exitCode = kExitUsage;
    return false;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= args.size()) return false;
      *v = args[++i];
      return true;
    };
    std::string v;
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      *exitCode = kExitOk;
      return false;
    } else if (a == "--agent") {
      if (!value(&out->agent)) return bad("--agent needs a path");
    } else if (a == "--timeout") {
      if (!value(&v)) return bad("--timeout needs seconds");
      char* end = nullptr;
      const long t = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || t <= 0 || t > 3600) return bad("--timeout takes 1 to 3600 seconds");
      out->timeoutS = static_cast<int>(t);
    } else if (attach && a == "--name") {
      if (!value(&out->name)) return bad("--name needs a name");
    } else if (attach && a == "--no-adapter") {
      out->adapter = false;
    } else if (attach && a == "--ops") {
      out->ops = true;
    } else if (attach && (a == "--steps" || a == "--every" || a == "--window")) {
      std::string* into = a == "--steps"   ? &out->steps
                          : a == "--every" ? &out->every
                                           : &out->window;
      if (!value(into)) return bad(a + " needs a value");
    } else if (a.rfind("-", 0) == 0) {
      return bad("unknown option '" + a + "'");
    } else if (!havePid) {
      char* end = nullptr;
      out->pid = std::strtol(a.c_str(), &end, 10);
      if (a.empty() || *end != '\0' || out->pid <= 0 || out->pid > 0x7fffffff)
        return bad("'" + a + "' is not a process id");
      havePid = true;
    } else {
      return bad("one PID only");
    }
  }
  if (!havePid) return bad("no PID given");
  if (attach && !checkCaptureOptions(command, out->steps, out->every, out->window)) {
    *exitCode = kExitUsage;
    return false;
  }
  if (out->agent.empty()) out->agent = findAgent();
  if (out->agent.empty()) {
    std::fprintf(stderr, "tidemark %s: libtidemark_agent.so not found; set TIDEMARK_AGENT\n",
                 command);
    *exitCode = kExitError;
    return false;
  }
  std::error_code ec;
  out->agent = std::filesystem::canonical(out->agent, ec).string();
  if (ec) {
    std::fprintf(stderr, "tidemark %s: no agent library at %s\n", command, out->agent.c_str());
    *exitCode = kExitError;
    return false;
  }
  return true;
}

}  // namespace

int attachCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  Args a;
  int code = kExitOk;
  if (!parseArgs("attach", kAttachUsage, true, args, &a, &code)) return code;
  // The agent will talk to tidemarkd: make sure one answers before touching the process (a
  // token that may only ingest is told it may not list: that is an answer too).
  {
    int refused = kExitOk;
    const std::shared_ptr<grpc::Channel> channel = channelFor(g, &refused);
    if (!channel) return refused;
    v1::ListSessionsRequest req;
    req.set_page_size(1);
    v1::ListSessionsResponse resp;
    grpc::ClientContext ctx;
    withDeadline(g, ctx, 10);
    const grpc::Status s = v1::Query::NewStub(channel)->ListSessions(&ctx, req, &resp);
    if (!s.ok() && s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
      return reportError(g, "attach", s);
    }
  }
  inject::AttachOptions o;
  o.agentPath = a.agent;
  o.pythonDir = a.adapter ? findPythonDir() : "";
  o.server = g.server;
  o.token = g.token;
  // TLS settings as the CLI has them (flags, else its environment): the attached process's own
  // environment may have none.
  // Absolute: the process's working directory is not this one.
  auto pem = [](const std::string& flag, const char* env) {
    const std::string path = !flag.empty() ? flag : base::env(env);
    std::error_code ec;
    return path.empty() ? path : std::filesystem::absolute(path, ec).string();
  };
  o.tlsCa = pem(g.tlsCa, "TIDEMARK_TLS_CA");
  o.tlsCert = pem(g.tlsCert, "TIDEMARK_TLS_CERT");
  o.tlsKey = pem(g.tlsKey, "TIDEMARK_TLS_KEY");
  o.sessionName = a.name;
  o.adapter = a.adapter;
  o.ops = a.ops;
  o.captureSteps = a.steps;
  o.captureEvery = a.every;
  o.captureWindow = a.window;
  o.timeoutMs = a.timeoutS * 1000;
  if (!g.json) std::fprintf(stderr, "tidemark attach: attaching to process %ld…\n", a.pid);
  absl::StatusOr<inject::AttachReport> r = inject::attachAgent(static_cast<pid_t>(a.pid), o);
  if (!r.ok()) return fail("attach", g, r.status());
  if (g.json) {
    std::printf("%s\n", nlohmann::json{{"pid", a.pid},
                                       {"session", r->sessionId},
                                       {"python_adapter", r->python},
                                       {"patched_entries", r->patchedEntries},
                                       {"loaded_now", r->loadedNow},
                                       {"message", r->message}}
                            .dump()
                            .c_str());
  } else {
    std::printf("attached to process %ld: session %llu (%s)\n", a.pid,
                static_cast<unsigned long long>(r->sessionId), r->message.c_str());
  }
  return kExitOk;
}

int detachCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  Args a;
  int code = kExitOk;
  if (!parseArgs("detach", kDetachUsage, false, args, &a, &code)) return code;
  absl::StatusOr<inject::AttachReport> r =
      inject::detachAgent(static_cast<pid_t>(a.pid), a.agent, a.timeoutS * 1000);
  if (!r.ok()) return fail("detach", g, r.status());
  if (g.json) {
    std::printf("%s\n",
                nlohmann::json{{"pid", a.pid}, {"session", r->sessionId}, {"message", r->message}}
                    .dump()
                    .c_str());
  } else {
    std::printf("detached from process %ld: session %llu ended (%s)\n", a.pid,
                static_cast<unsigned long long>(r->sessionId), r->message.c_str());
  }
  return kExitOk;
}

}  // namespace tidemark::cli
