// What every client command shares: the channel, deadlines, error reporting, argument parsing.
#include "cli/client.h"

#include "cli/own_daemon.h"
#include "client/channel.h"
#include "server/store_file_server.h"
#include "src/base/daemon_address.h"
#include "src/core/device_filter.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

std::shared_ptr<grpc::Channel> channelFor(const GlobalOptions& g, int* exitCode) {
  if (!g.dbFile.empty()) {
    // One in-process server over the file for the whole command, left to the process's exit.
    static auto* file = new absl::StatusOr<std::unique_ptr<server::StoreFileServer>>(
        server::StoreFileServer::open(g.dbFile));
    if (!file->ok()) {
      std::fprintf(stderr, "tidemark: --db %s\n", std::string(file->status().message()).c_str());
      *exitCode = file->status().code() == absl::StatusCode::kPermissionDenied ? kExitRefused
                                                                               : kExitUnreachable;
      return nullptr;
    }
    return (**file)->channel();
  }
  const bool tls = !g.tlsCa.empty() || !std::string(base::env("TIDEMARK_TLS_CA")).empty();
  if (const std::string why = base::untrustedDaemon(g.server, tls); !why.empty()) {
    std::fprintf(stderr, "tidemark: not talking to the daemon at %s: %s\n", g.server.c_str(),
                 why.c_str());
    *exitCode = kExitRefused;
    return nullptr;
  }
  if (!ensureOwnDaemon(g.server)) {
    *exitCode = kExitUnreachable;
    return nullptr;
  }
  client::ChannelOptions o = client::ChannelOptions::fromEnvironment(g.server);
  o.token = g.token;
  if (!g.tlsCa.empty()) o.tlsCa = g.tlsCa;
  if (!g.tlsCert.empty()) o.tlsCert = g.tlsCert;
  if (!g.tlsKey.empty()) o.tlsKey = g.tlsKey;
  std::string why;
  std::shared_ptr<grpc::Channel> channel = client::makeChannel(o, &why);
  if (!channel) {
    std::fprintf(stderr, "tidemark: %s\n", why.c_str());
    *exitCode = kExitUsage;
  }
  return channel;
}

namespace {
int lastDeadlineSeconds = 0;  // the last call's, for reportError
}  // namespace

// Prints a failed call's status; UNAVAILABLE means nobody answered at the address,
// DEADLINE_EXCEEDED that nobody did in time.
int reportError(const GlobalOptions& g, const char* what, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    const std::string& m = s.error_message();
    if (m.find("CERTIFICATE_VERIFY_FAILED") != std::string::npos ||
        m.find("certificate verify failed") != std::string::npos) {
      std::fprintf(stderr,
                   "tidemark %s: the TLS handshake with %s failed: its certificate is not signed "
                   "by the CA given (--tls-ca or TIDEMARK_TLS_CA) or does not name that address "
                   "(gRPC: %s)\n",
                   what, g.server.c_str(), m.c_str());
      return kExitUnreachable;
    }
    const bool tls = !g.tlsCa.empty() || *base::env("TIDEMARK_TLS_CA") != '\0';
    if (m.find("andshake") != std::string::npos || m.find("SSL") != std::string::npos ||
        (tls && m.find("Socket closed") != std::string::npos)) {
      std::fprintf(stderr,
                   "tidemark %s: the TLS handshake with %s failed (gRPC: %s); does the daemon "
                   "use TLS, and ask for a client certificate (--tls-cert, --tls-key)?\n",
                   what, g.server.c_str(), m.c_str());
      return kExitUnreachable;
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::fprintf(stderr,
                   "tidemark %s: no answer from %s within %d s: the daemon is busy or stopped, "
                   "or nothing there accepts the connection (--deadline S waits longer)\n",
                   what, g.server.c_str(), lastDeadlineSeconds);
      return kExitUnreachable;
    }
    std::fprintf(stderr,
                 "tidemark %s: no tidemarkd reachable at %s (start it with `tidemarkd`, or "
                 "pass --server; a daemon with TLS needs --tls-ca)%s%s%s\n",
                 what, g.server.c_str(), m.empty() ? "" : " (gRPC: ", m.c_str(),
                 m.empty() ? "" : ")");
    return kExitUnreachable;
  }
  if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
      s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    std::fprintf(stderr, "tidemark %s: refused (%s): %s\n", what,
                 s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? "permission denied"
                                                                       : "unauthenticated",
                 s.error_message().c_str());
    return kExitRefused;
  }
  std::fprintf(stderr, "tidemark %s: %s\n", what, s.error_message().c_str());
  // The request's own arguments were refused (a budget, strategy, format, range or plan file
  // that is not one): bad usage, as when the CLI itself refuses them.
  return s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitUsage : kExitError;
}

int callDeadline(const GlobalOptions& g, int seconds) {
  lastDeadlineSeconds = g.deadlineS > 0 ? g.deadlineS : seconds;
  return lastDeadlineSeconds;
}

void withDeadline(const GlobalOptions& g, grpc::ClientContext& ctx, int seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(callDeadline(g, seconds)));
}

bool parseSessionId(const std::string& s, uint64_t* id) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || end == nullptr || *end != '\0' || v == 0) return false;
  *id = v;
  return true;
}

bool parseTime(const std::string& s, bool* relative, int64_t* ns) {
  std::string t = s;
  *relative = false;
  if (!t.empty() && t[0] == '+') {
    *relative = true;
    t = t.substr(1);
  }
  char* end = nullptr;
  // Integers are read exactly (absolute timestamps do not survive a double).
  const long long whole = std::strtoll(t.c_str(), &end, 10);
  if (!t.empty() && end != t.c_str() && (*end == '\0' || (std::string(end) == "ns"))) {
    *relative = *relative || *end != '\0';
    *ns = whole;
    return true;
  }
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end == t.c_str()) return false;
  const std::string unit = end;
  double scale = 1;
  if (unit.empty()) {
    scale = 1;
  } else if (unit == "s") {
    scale = 1e9;
    *relative = true;
  } else if (unit == "ms") {
    scale = 1e6;
    *relative = true;
  } else if (unit == "us") {
    scale = 1e3;
    *relative = true;
  } else if (unit == "ns") {
    *relative = true;
  } else {
    return false;
  }
  *ns = static_cast<int64_t>(v * scale);
  return true;
}

bool acceptSessionArg(const char* command, const std::string& arg, bool* have, uint64_t* id,
                      int* exitCode) {
  if (*have) {
    std::fprintf(stderr, "tidemark %s: unexpected argument '%s'\n", command, arg.c_str());
    *exitCode = kExitUsage;
    return false;
  }
  if (!parseSessionId(arg, id)) {
    std::fprintf(stderr, "tidemark %s: '%s' is not a session id\n", command, arg.c_str());
    *exitCode = kExitUsage;
    return false;
  }
  *have = true;
  return true;
}

bool parseSessionArgs(const std::vector<std::string>& args, size_t count, const char* usage,
                      uint64_t* ids, int* exitCode) {
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    std::fputs(usage, stdout);
    *exitCode = kExitOk;
    return false;
  }
  bool ok = args.size() == count;
  for (size_t i = 0; ok && i < count; ++i) ok = parseSessionId(args[i], &ids[i]);
  if (!ok) {
    std::fputs(usage, stderr);
    *exitCode = kExitUsage;
  }
  return ok;
}

bool takeDeviceOption(const char* command, std::vector<std::string>* args, std::string* device,
                      int* exitCode) {
  for (size_t i = 0; i < args->size(); ++i) {
    if ((*args)[i] != "--device") continue;
    if (i + 1 >= args->size()) {
      std::fprintf(stderr, "tidemark %s: --device needs all, cpu, cuda or cuda:N\n", command);
      *exitCode = kExitUsage;
      return false;
    }
    std::string why;
    if (!core::DeviceFilter::parse((*args)[i + 1], &why)) {
      std::fprintf(stderr, "tidemark %s: %s\n", command, why.c_str());
      *exitCode = kExitUsage;
      return false;
    }
    *device = (*args)[i + 1];
    args->erase(args->begin() + static_cast<long>(i), args->begin() + static_cast<long>(i) + 2);
    --i;
  }
  return true;
}

bool takeNumberOption(const char* command, std::vector<std::string>* args, const char* name,
                      int64_t minimum, int64_t* value, int* exitCode) {
  for (size_t i = 0; i < args->size(); ++i) {
    if ((*args)[i] != name) continue;
    const std::string text = i + 1 < args->size() ? (*args)[i + 1] : std::string();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || v < minimum) {
      std::fprintf(stderr, "tidemark %s: %s needs a whole number of at least %lld\n", command, name,
                   static_cast<long long>(minimum));
      *exitCode = kExitUsage;
      return false;
    }
    *value = v;
    args->erase(args->begin() + static_cast<long>(i), args->begin() + static_cast<long>(i) + 2);
    --i;
  }
  return true;
}

int fetchSteps(const GlobalOptions& g, const char* what, v1::StepsRequest request, v1::Steps* out) {
  out->Clear();
  for (;;) {
    v1::Steps page;
    if (int code = callQuery(g, what, &v1::Query::Stub::GetSteps, request, &page); code != kExitOk)
      return code;
    out->set_session_id(page.session_id());
    out->set_total_steps(page.total_steps());
    for (v1::StepSummary& s : *page.mutable_steps()) *out->add_steps() = std::move(s);
    out->set_next_step(page.next_step());
    // A next page that does not move on would be asked for ever: take what came.
    if (request.last() || page.next_step() < 0 || page.next_step() <= request.from_step()) break;
    request.set_from_step(page.next_step());
  }
  return kExitOk;
}

int64_t sessionStartNs(const GlobalOptions& g, uint64_t session, const char* what, int* exitCode) {
  v1::GetSessionRequest req;
  req.set_session_id(session);
  v1::SessionInfo info;
  *exitCode = callQuery(g, what, &v1::Query::Stub::GetSession, req, &info, 30);
  return *exitCode == kExitOk ? info.start_ts_ns() : -1;
}

void printSessionCaveats(const GlobalOptions& g, uint64_t session, const char* what) {
  v1::GetSessionRequest req;
  req.set_session_id(session);
  v1::SessionInfo info;
  if (callQuery(g, what, &v1::Query::Stub::GetSession, req, &info, 30) != kExitOk) return;
  for (const v1::Stat& st : info.stats()) {
    if (st.severity() == "info" || st.value() == 0) continue;
    std::printf("%s: %s: %lld (%s)\n", st.severity() == "data_loss" ? "data lost" : "caution",
                st.description().c_str(), static_cast<long long>(st.value()), st.name().c_str());
  }
}

}  // namespace tidemark::cli
