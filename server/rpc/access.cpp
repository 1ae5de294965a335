#include "server/rpc/access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "server/rpc/grpc_status.h"
#include "server/store/store.h"

namespace tidemark::server {

namespace {

const char* roleName(v1::TokenRole role) {
  switch (role) {
    case v1::TOKEN_ROLE_INGEST:
      return "ingest";
    case v1::TOKEN_ROLE_READ:
      return "read";
    case v1::TOKEN_ROLE_CONTROL:
      return "control";
    default:
      return "no";
  }
}

unsigned rolesOf(v1::TokenRole role) {
  switch (role) {
    case v1::TOKEN_ROLE_INGEST:
      return kIngest;
    case v1::TOKEN_ROLE_READ:
      return kRead;
    case v1::TOKEN_ROLE_CONTROL:
      return kRead | kControl;
    default:
      return 0;
  }
}

const char* neededRole(unsigned need) {
  return (need & kControl) != 0 ? "control" : (need & kRead) != 0 ? "read" : "ingest";
}

// The secret of an "authorization: Bearer <secret>" header, if the call has one.
std::optional<std::string> presentedToken(const grpc::ServerContext& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  if (value.rfind(prefix, 0) == 0) value = value.substr(prefix.size());
  return value;
}

// A call the daemon made itself (Access::kInternalKey carrying its secret): the uid it is made
// for; nullopt for any other call.
std::optional<uid_t> internalCall(const grpc::ServerContext& ctx, const std::string& secret) {
  if (secret.empty()) return std::nullopt;
  const auto& md = ctx.client_metadata();
  auto key = md.find(Access::kInternalKey);
  auto uid = md.find(Access::kOnBehalfKey);
  if (key == md.end() || uid == md.end()) return std::nullopt;
  const std::string presented(key->second.data(), key->second.size());
  // Compared in constant time: the secret is not to be found byte by byte.
  if (presented.size() != secret.size()) return std::nullopt;
  unsigned char diff = 0;
  for (size_t i = 0; i < secret.size(); ++i)
    diff |= static_cast<unsigned char>(presented[i] ^ secret[i]);
  if (diff != 0) return std::nullopt;
  const std::string text(uid->second.data(), uid->second.size());
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v > 0xFFFFFFFEull) return std::nullopt;
  return static_cast<uid_t>(v);
}

}  // namespace

std::string Access::makeInternalSecret() {
  unsigned char bytes[32];
  if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) return "";
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  m_internalSecret = out;
  return out;
}

Access::Access(const PeerRegistry& peers, const TokenBook& tokens, std::string dbPath,
               uid_t storeOwner, std::optional<gid_t> allowGroup, bool requireToken)
    : m_peers(&peers),
      m_tokens(&tokens),
      m_dbPath(std::move(dbPath)),
      m_storeOwner(storeOwner),
      m_allowGroup(allowGroup),
      m_requireToken(requireToken) {}

Access::Access(std::string dbPath)
    : m_fileReader(true), m_dbPath(std::move(dbPath)), m_storeOwner(::geteuid()) {}

std::unique_ptr<Access> Access::fileReader(std::string dbPath) {
  return std::unique_ptr<Access>(new Access(std::move(dbPath)));
}

absl::StatusOr<Caller> Access::caller(const grpc::ServerContext& ctx, const char* what,
                                      unsigned need) const {
  Caller c;
  if (m_fileReader) {
    if ((kRead & need) != need)
      return absl::FailedPreconditionError(std::string(what) +
                                           ": a store file opened with --db is only read; "
                                           "this needs a running tidemarkd");
    c.uid = m_storeOwner;
    c.roles = kRead;
    return c;
  }
  if (const std::optional<uid_t> onBehalf = internalCall(ctx, m_internalSecret)) {
    c.uid = *onBehalf;
    c.roles = kIngest;
    if ((c.roles & need) != need) {
      return refuse(ctx, absl::PermissionDeniedError(std::string(what) +
                                                     ": the daemon's own calls only ingest"));
    }
    return c;
  }
  if (const std::optional<std::string> secret = presentedToken(ctx)) {
    const std::optional<TokenGrant> grant = m_tokens->find(*secret);
    if (!grant) {
      return refuse(ctx, absl::UnauthenticatedError(
                             std::string(what) +
                             ": the token is not one of this daemon's (revoked, mistyped, or "
                             "made by another tidemarkd)"));
    }
    c.uid = grant->uid;
    c.roles = rolesOf(grant->role);
    c.tokenId = grant->id;
    if ((c.roles & need) != need) {
      return refuse(ctx, absl::PermissionDeniedError(
                             std::string(what) + " needs a token with the " + neededRole(need) +
                             " role; token " + std::to_string(grant->id) + " has the " +
                             roleName(grant->role) + " role"));
    }
    return c;
  }
  if (m_requireToken) {
    return refuse(ctx, absl::UnauthenticatedError(
                           std::string(what) +
                           ": this tidemarkd requires a token (set TIDEMARK_TOKEN or pass "
                           "--token-file; its owner makes them with `tidemark token create`)"));
  }
  const std::optional<Peer> peer = m_peers->of(ctx);
  if (!peer || !peer->uid) {
    return refuse(
        ctx, absl::UnauthenticatedError(
                 std::string(what) + ": who is calling cannot be told (" +
                 (peer ? "client " + peer->address +
                             " is not on this host's loopback, or not in the kernel's socket table"
                       : "a connection tidemarkd did not accept itself") +
                 "); present a token (TIDEMARK_TOKEN or --token-file; made by the daemon's "
                 "owner with `tidemark token create`)"));
  }
  c.uid = *peer->uid;
  c.roles = kIngest | kRead | kControl;
  return c;
}

absl::StatusOr<uid_t> Access::administrator(const grpc::ServerContext& ctx,
                                            const char* what) const {
  if (m_fileReader)
    return absl::FailedPreconditionError(std::string(what) +
                                         ": tokens are a running tidemarkd's; not for --db");
  const std::optional<Peer> peer = m_peers->of(ctx);
  if (!peer || !peer->uid) {
    return refuse(ctx, absl::UnauthenticatedError(
                           std::string(what) +
                           ": token management is open only to callers on this host (the Unix "
                           "socket or a loopback address)"));
  }
  if (*peer->uid != m_storeOwner && *peer->uid != 0) {
    return refuse(ctx, absl::PermissionDeniedError(
                           std::string(what) + ": only the daemon's own user (uid " +
                           std::to_string(m_storeOwner) + ") or root manage its tokens, not uid " +
                           std::to_string(*peer->uid)));
  }
  return *peer->uid;
}

bool Access::seesAll(uid_t uid) const {
  if (uid == 0 || m_fileReader) return true;
  if (!m_allowGroup) return false;
  // The caller's groups as the system knows them (supplementary ones included).
  std::vector<char> buffer(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return false;
  }
  if (pw.pw_gid == *m_allowGroup) return true;
  int count = 64;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count));
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) return false;
  }
  for (int i = 0; i < count; ++i) {
    if (groups[static_cast<size_t>(i)] == *m_allowGroup) return true;
  }
  return false;
}

absl::StatusOr<std::optional<uid_t>> Access::ownerOf(int64_t session) const {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (auto it = m_owners.find(session); it != m_owners.end()) return it->second;
  }
  auto owner = Store::sessionOwner(m_dbPath, session);
  if (owner.status().code() == absl::StatusCode::kNotFound) return std::optional<uid_t>();
  if (!owner.ok()) return owner.status();
  const uid_t uid = owner->value_or(m_storeOwner);
  std::lock_guard<std::mutex> lock(m_mutex);
  m_owners[session] = uid;
  return uid;
}

grpc::Status Access::check(const grpc::ServerContext& ctx, int64_t session, const char* what,
                           unsigned need) const {
  auto c = caller(ctx, what, need);
  if (!c.ok()) return toGrpc(c.status());
  const auto known = ownerOf(session);
  if (!known.ok()) return toGrpc(known.status());  // the store unreadable: nobody let in
  const std::optional<uid_t> owner = *known;
  if (!owner || *owner == c->uid || seesAll(c->uid)) return grpc::Status::OK;
  return toGrpc(refuse(
      ctx, absl::PermissionDeniedError(
               std::string(what) + ": session " + std::to_string(session) + " belongs to uid " +
               std::to_string(*owner) + ", not to uid " + std::to_string(c->uid) +
               " (its owner, root or a member of tidemarkd's --allow-group may use it)")));
}

absl::Status Access::refuse(const grpc::ServerContext& ctx, absl::Status why) const {
  const std::optional<Peer> peer = m_peers ? m_peers->of(ctx) : std::nullopt;
  std::string who = peer ? peer->address : ctx.peer();
  if (peer && peer->pid > 0) who += ", pid " + std::to_string(peer->pid);
  if (peer && peer->uid) who += ", uid " + std::to_string(*peer->uid);
  std::fprintf(stderr, "tidemarkd: refused (%s): %s\n", who.c_str(),
               std::string(why.message()).c_str());
  return why;
}

}  // namespace tidemark::server
