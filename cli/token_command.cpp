// tidemark token create|list|revoke: the daemon's tokens (docs/security.md).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "tidemark/v1/admin.grpc.pb.h"

namespace tidemark::cli {

namespace {

constexpr const char* kUsage =
    "usage: tidemark token create --role ingest|read|control [--name NAME] [--uid UID] [--json]\n"
    "       tidemark token list [--json]\n"
    "       tidemark token revoke ID\n\n"
    "Tokens let callers into a daemon that cannot tell who they are, or that requires one of\n"
    "everyone (tidemarkd --require-token). A token acts on the sessions of UID (default: yours)\n"
    "with its role: ingest streams recordings only (agents, upload, import), read lists and\n"
    "queries, control reads and applies plans. Its secret is printed once; the daemon keeps only\n"
    "a hash. Clients present it with TIDEMARK_TOKEN, TIDEMARK_TOKEN_FILE or --token-file. Only\n"
    "the daemon's own user or root, on this host, manage tokens.\n";

const char* roleName(v1::TokenRole role) {
  switch (role) {
    case v1::TOKEN_ROLE_INGEST:
      return "ingest";
    case v1::TOKEN_ROLE_READ:
      return "read";
    case v1::TOKEN_ROLE_CONTROL:
      return "control";
    default:
      return "?";
  }
}

int usage(bool help) {
  std::fputs(kUsage, help ? stdout : stderr);
  return help ? kExitOk : kExitUsage;
}

int create(const GlobalOptions& g, const std::vector<std::string>& args) {
  v1::CreateTokenRequest req;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool hasValue = i + 1 < args.size();
    if (a == "--role" && hasValue) {
      const std::string& r = args[++i];
      if (r == "ingest") {
        req.set_role(v1::TOKEN_ROLE_INGEST);
      } else if (r == "read") {
        req.set_role(v1::TOKEN_ROLE_READ);
      } else if (r == "control") {
        req.set_role(v1::TOKEN_ROLE_CONTROL);
      } else {
        std::fprintf(stderr, "tidemark token create: --role is ingest, read or control, not '%s'\n",
                     r.c_str());
        return kExitUsage;
      }
    } else if (a == "--name" && hasValue) {
      req.set_name(args[++i]);
    } else if (a == "--uid" && hasValue) {
      char* end = nullptr;
      const long uid = std::strtol(args[i + 1].c_str(), &end, 10);
      if (args[i + 1].empty() || *end != '\0' || uid < 0 || uid > 0xfffffffeL) {
        std::fprintf(stderr, "tidemark token create: --uid needs a user id\n");
        return kExitUsage;
      }
      ++i;
      req.set_has_uid(true);
      req.set_uid(static_cast<uint32_t>(uid));
    } else if (a == "-h" || a == "--help") {
      return usage(true);
    } else {
      std::fprintf(stderr, "tidemark token create: unexpected '%s'\n", a.c_str());
      return usage(false);
    }
  }
  if (req.role() == v1::TOKEN_ROLE_UNSPECIFIED) {
    std::fputs("tidemark token create: --role ingest|read|control is needed\n", stderr);
    return kExitUsage;
  }
  v1::CreateTokenResponse resp;
  if (int rc = callRpc<v1::Admin>(g, "token create", &v1::Admin::Stub::CreateToken, req, &resp);
      rc != kExitOk) {
    return rc;
  }
  if (g.json) {
    std::printf("{\"id\": %llu, \"role\": \"%s\", \"token\": %s}\n",
                static_cast<unsigned long long>(resp.id()), roleName(req.role()),
                jsonString(resp.token()).c_str());
  } else {
    std::printf("%s\n", resp.token().c_str());
    std::fprintf(stderr,
                 "tidemark: token %llu (%s) — shown only now; give it to the client as "
                 "TIDEMARK_TOKEN or in a file for --token-file\n",
                 static_cast<unsigned long long>(resp.id()), roleName(req.role()));
  }
  return kExitOk;
}

int list(const GlobalOptions& g) {
  v1::ListTokensResponse resp;
  if (int rc = callRpc<v1::Admin>(g, "token list", &v1::Admin::Stub::ListTokens,
                                  v1::ListTokensRequest(), &resp);
      rc != kExitOk) {
    return rc;
  }
  if (g.json) {
    std::string out = "{\"tokens\": [";
    for (int i = 0; i < resp.tokens_size(); ++i) {
      const v1::TokenInfo& t = resp.tokens(i);
      out += (i ? ", " : "") + std::string("{\"id\": ") + std::to_string(t.id()) +
             ", \"name\": " + jsonString(t.name()) + ", \"role\": \"" + roleName(t.role()) +
             "\", \"uid\": " + std::to_string(t.uid()) +
             ", \"created_wall_ns\": " + std::to_string(t.created_wall_ns()) +
             ", \"revoked\": " + (t.revoked() ? "true" : "false") + "}";
    }
    std::printf("%s]}\n", out.c_str());
    return kExitOk;
  }
  if (resp.tokens_size() == 0) {
    std::puts("no tokens (tidemark token create --role ROLE)");
    return kExitOk;
  }
  std::printf("%5s  %-8s %7s  %-8s %s\n", "ID", "ROLE", "UID", "STATE", "NAME");
  for (const v1::TokenInfo& t : resp.tokens()) {
    std::printf("%5llu  %-8s %7u  %-8s %s\n", static_cast<unsigned long long>(t.id()),
                roleName(t.role()), t.uid(), t.revoked() ? "revoked" : "valid", t.name().c_str());
  }
  return kExitOk;
}

int revoke(const GlobalOptions& g, const std::vector<std::string>& args) {
  uint64_t id = 0;
  if (args.size() != 2 || !parseSessionId(args[1], &id)) {
    std::fputs("usage: tidemark token revoke ID\n", stderr);
    return kExitUsage;
  }
  v1::RevokeTokenRequest req;
  req.set_id(id);
  v1::RevokeTokenResponse resp;
  if (int rc = callRpc<v1::Admin>(g, "token revoke", &v1::Admin::Stub::RevokeToken, req, &resp);
      rc != kExitOk) {
    return rc;
  }
  if (!g.json) std::printf("token %llu revoked\n", static_cast<unsigned long long>(id));
  return kExitOk;
}

}  // namespace

int tokenCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  if (args.empty()) return usage(false);
  if (args[0] == "-h" || args[0] == "--help") return usage(true);
  if (args[0] == "create") return create(g, args);
  if (args[0] == "list") return list(g);
  if (args[0] == "revoke") return revoke(g, args);
  std::fprintf(stderr, "tidemark token: unknown subcommand '%s'\n", args[0].c_str());
  return usage(false);
}

}  // namespace tidemark::cli
