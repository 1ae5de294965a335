// The query commands of the CLI: each is a gRPC call and a rendering (table or --json).
#include "cli/commands.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <grpcpp/grpcpp.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/render.h"
#include "client/spool_upload.h"
#include "tidemark/v1/control.grpc.pb.h"
#include "tidemark/v1/ingest.grpc.pb.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::cli {

int sessionsCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::puts(
          "usage: tidemark sessions [--server ADDR] [--json]\n\n"
          "Lists recorded sessions: id, state, pid, start, blocks, steps, events stored and\n"
          "dropped, the job and rank of a training job's ranks (JOB/RANK: tidemark job JOB),\n"
          "the session's name (tidemark run --name, an imported file's) and its command line.");
      return kExitOk;
    }
    std::fprintf(stderr, "tidemark sessions: unexpected argument '%s'\n", a.c_str());
    return kExitUsage;
  }
  // Every page, appended: a store holds any number of sessions.
  v1::ListSessionsResponse resp;
  v1::ListSessionsRequest req;
  do {
    v1::ListSessionsResponse page;
    if (int code = callQuery(g, "sessions", &v1::Query::Stub::ListSessions, req, &page, 30);
        code != kExitOk) {
      return code;
    }
    for (v1::SessionInfo& si : *page.mutable_sessions()) *resp.add_sessions() = std::move(si);
    req.set_page_token(page.next_page_token());
  } while (req.page_token() != 0);
  if (g.json) {
    std::string out = "{\"sessions\": [";
    for (int i = 0; i < resp.sessions_size(); ++i) {
      if (i) out += ",\n  ";
      printSessionJson(resp.sessions(i), out);
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return kExitOk;
  }
  if (resp.sessions_size() == 0) {
    std::puts("no sessions yet (record one with: tidemark run -- python train.py)");
    return kExitOk;
  }
  // The NAME and JOB columns only where some session has one (they widen every line).
  bool named = false, ranks = false;
  for (const v1::SessionInfo& si : resp.sessions()) {
    named = named || !si.name().empty();
    ranks = ranks || si.job_id() != 0;
  }
  std::printf("%5s  %-7s  %7s  %-19s  %9s  %5s  %10s  %7s  %s%s%s\n", "ID", "STATE", "PID",
              "STARTED (UTC)", "BLOCKS", "STEPS", "EVENTS", "DROPPED", ranks ? "JOB/RANK  " : "",
              named ? "NAME                      " : "", "COMMAND");
  for (const v1::SessionInfo& si : resp.sessions()) {
    std::string cmd = si.command_line();
    if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
    // A name cut in its middle keeps both ends (an imported file's name and its extension).
    std::string name = si.name().empty() ? "-" : si.name();
    if (name.size() > 24) name = name.substr(0, 10) + "..." + name.substr(name.size() - 11);
    name = named ? name + std::string(24 - name.size(), ' ') + "  " : "";
    // A session whose raw events retention dropped: "pruned" (its summaries remain).
    const char* state = si.raw_pruned_wall_ns() != 0 ? "pruned" : stateName(si.state());
    // "3/1": rank 1 of job 3 (tidemark job 3); "3/?" a job's process without a RANK.
    std::string rank;
    if (ranks) {
      rank = si.job_id() == 0 ? "-"
                              : std::to_string(si.job_id()) + "/" +
                                    (si.rank() >= 0 ? std::to_string(si.rank()) : "?");
      rank += std::string(rank.size() < 10 ? 10 - rank.size() : 1, ' ');
    }
    std::printf("%5llu  %-7s  %7d  %-19s  %9llu  %5lld  %10llu  %7llu  %s%s%s\n",
                static_cast<unsigned long long>(si.id()), state, si.pid(),
                wallTime(si.start_wall_ns()).c_str(), static_cast<unsigned long long>(si.blocks()),
                static_cast<long long>(si.steps()),
                static_cast<unsigned long long>(si.events_stored()),
                static_cast<unsigned long long>(si.events_dropped()), rank.c_str(), name.c_str(),
                cmd.c_str());
  }
  return kExitOk;
}

int deleteCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  static const char* kUsage =
      "usage: tidemark delete SESSION [--json]\n\n"
      "Deletes an ended session and everything stored about it; the store's file shrinks.\n"
      "A live session (its job still records) is refused. Only the session's owner, root and\n"
      "the daemon's --allow-group may delete it.\n";
  uint64_t session = 0;
  int code = kExitOk;
  if (!parseSessionArgs(args, 1, kUsage, &session, &code)) return code;
  v1::DeleteSessionRequest req;
  req.set_session_id(session);
  v1::DeleteSessionResponse resp;
  if (int rc =
          callRpc<v1::Control>(g, "delete", &v1::Control::Stub::DeleteSession, req, &resp, 600);
      rc != kExitOk)
    return rc;
  if (g.json)
    std::printf("{\"deleted\": %llu}\n", static_cast<unsigned long long>(session));
  else
    std::printf("session %llu deleted\n", static_cast<unsigned long long>(session));
  return kExitOk;
}

int breakdownCommand(const GlobalOptions& g, const std::vector<std::string>& argsIn) {
  constexpr const char* kUsageText =
      "usage: tidemark breakdown SESSION [--step N] [--at peak|end|TIME] [--device D] "
      "[--server ADDR] [--json]\n\n"
      "Memory by category at one moment: the peak (default; of step N with --step), the end of\n"
      "the recording (a snapshot's dump), or TIME: an offset from the session's start (+1.5s,\n"
      "250ms, 40us) or an absolute timestamp in ns. --device: the memory of cpu (host), cuda\n"
      "(every GPU) or cuda:N only (default all: host and devices together).\n";
  v1::BreakdownRequest req;
  bool haveSession = false;
  std::vector<std::string> args = argsIn;
  if (int code = kExitOk; !takeDeviceOption("breakdown", &args, req.mutable_device(), &code))
    return code;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsageText, stdout);
      return kExitOk;
    } else if (a == "--step") {
      if (i + 1 >= args.size()) {
        std::fputs("tidemark breakdown: --step needs a number\n", stderr);
        return kExitUsage;
      }
      char* end = nullptr;
      const long long n = std::strtoll(args[++i].c_str(), &end, 10);
      if (end == nullptr || *end != '\0') {
        std::fprintf(stderr, "tidemark breakdown: bad step '%s'\n", args[i].c_str());
        return kExitUsage;
      }
      req.set_has_step(true);
      req.set_step(n);
    } else if (a == "--at") {
      if (i + 1 >= args.size()) {
        std::fputs("tidemark breakdown: --at needs 'peak' or a time\n", stderr);
        return kExitUsage;
      }
      const std::string v = args[++i];
      if (v == "peak") {
        req.set_peak(true);
        continue;
      }
      if (v == "end") {  // the last moment of the recording (a snapshot's dump)
        if (!haveSession) {
          std::fputs("tidemark breakdown: give SESSION before --at\n", stderr);
          return kExitUsage;
        }
        v1::GetSessionRequest sr;
        sr.set_session_id(req.session_id());
        v1::SessionInfo si;
        if (int code = callQuery(g, "breakdown", &v1::Query::Stub::GetSession, sr, &si);
            code != kExitOk)
          return code;
        req.set_ts_ns(si.end_ts_ns());
        continue;
      }
      bool relative = false;
      int64_t ns = 0;
      if (!parseTime(v, &relative, &ns)) {
        std::fprintf(stderr, "tidemark breakdown: bad time '%s' (try +1.5s or 250ms)\n", v.c_str());
        return kExitUsage;
      }
      if (relative) {
        if (!haveSession) {
          std::fputs("tidemark breakdown: give SESSION before --at\n", stderr);
          return kExitUsage;
        }
        int code = kExitOk;
        const int64_t start = sessionStartNs(g, req.session_id(), "breakdown", &code);
        if (start < 0) return code;
        ns += start;
      }
      req.set_ts_ns(ns);
    } else {
      uint64_t id = 0;
      if (int code = kExitOk; !acceptSessionArg("breakdown", a, &haveSession, &id, &code))
        return code;
      req.set_session_id(id);
    }
  }
  if (!haveSession) {
    std::fputs(kUsageText, stderr);
    return kExitUsage;
  }
  v1::Breakdown b;
  if (int code = callQuery(g, "breakdown", &v1::Query::Stub::GetBreakdown, req, &b);
      code != kExitOk) {
    return code;
  }

  if (g.json) {
    std::fputs((breakdownJson(b) + "\n").c_str(), stdout);
  } else {
    printBreakdown(b);
    printSessionCaveats(g, req.session_id(), "breakdown");
  }
  return kExitOk;
}

int uploadCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0] == "-h" || args[0] == "--help") {
    std::fputs(
        "usage: tidemark upload SPOOL [--server ADDR] [--json]\n\n"
        "Sends a spool file (written by the agent at exit when no tidemarkd took the rest of\n"
        "its run): the rest of the session it continues, or a new session. A session closed\n"
        "meanwhile (its resume grace passed) gets the rest as a new session. A tidemarkd of\n"
        "the same user takes up by itself, and removes, the spool of a session it made once\n"
        "the job's process has exited (in the user's spool directory), and that of a job\n"
        "aimed at it, started after it, that exited before its first handshake reached it.\n",
        args.size() == 1 ? stdout : stderr);
    return args.size() == 1 ? kExitOk : kExitUsage;
  }
  client::SpoolReader reader(args[0]);
  if (!reader.ok()) {
    std::error_code ec;
    const bool gone = !std::filesystem::exists(std::filesystem::symlink_status(args[0], ec));
    std::fprintf(stderr, "tidemark upload: %s%s\n", reader.error().c_str(),
                 gone ? " (a job's spool may have been taken up already by a tidemarkd of this "
                        "user, which removes it once stored: see `tidemark sessions`)"
                      : "");
    return kExitError;
  }
  v1::AgentMessage first;
  if (!reader.next(&first) || !first.has_handshake()) {
    std::fprintf(stderr, "tidemark upload: %s is not a tidemark spool file%s%s\n", args[0].c_str(),
                 reader.error().empty() ? "" : ": ", reader.error().c_str());
    return kExitError;
  }
  int refused = kExitOk;
  const std::shared_ptr<grpc::Channel> channel = channelFor(g, &refused);
  if (!channel) return refused;
  client::SpoolUpload options;
  options.note = [](const std::string& what) {
    std::fprintf(stderr, "tidemark upload: %s\n", what.c_str());
  };
  // No limit of its own (a long spool takes long), --deadline's when given.
  options.deadlineS = callDeadline(g, 0);
  const client::SpoolUploadResult sent =
      client::uploadSpool(channel, reader, std::move(first), options);
  if (!sent.status.ok()) return reportError(g, "upload", sent.status);
  if (sent.alreadyWhole) {
    const auto id = static_cast<unsigned long long>(sent.sessionId);
    if (g.json) {
      std::printf("{\"session\": %llu, \"events\": 0, \"already_whole\": true}\n", id);
    } else {
      std::printf(
          "session %llu had ended whole (every event its agent sent is stored): the spool "
          "adds nothing, nothing uploaded\n",
          id);
    }
    return kExitOk;
  }
  if (!sent.readError.empty()) {
    std::fprintf(stderr, "tidemark upload: stopped early: %s (what came before is stored)\n",
                 sent.readError.c_str());
  }
  const auto id = static_cast<unsigned long long>(sent.sessionId);
  const auto events = static_cast<unsigned long long>(sent.events);
  if (g.json) {
    std::printf("{\"session\": %llu, \"events\": %llu}\n", id, events);
  } else {
    std::printf("uploaded %llu events as session %llu\n", events, id);
  }
  return sent.readError.empty() ? kExitOk : kExitError;
}

}  // namespace tidemark::cli
