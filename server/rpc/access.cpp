#include "server/rpc/access.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "server/store/store.h"

namespace tidemark::server {

Access::Access(const PeerRegistry& peers, std::string dbPath, uid_t storeOwner,
               std::optional<gid_t> allowGroup)
    : m_peers(peers),
      m_dbPath(std::move(dbPath)),
      m_storeOwner(storeOwner),
      m_allowGroup(allowGroup) {}

absl::StatusOr<uid_t> Access::caller(const grpc::ServerContext& ctx, const char* what) const {
  const std::optional<Peer> peer = m_peers.of(ctx);
  if (peer && peer->uid) return *peer->uid;
  const std::string why =
      std::string(what) + ": who is calling cannot be told (" +
      (peer ? "TCP client " + peer->address + " not found in the kernel's socket table"
            : "a connection tidemarkd did not accept itself") +
      "); connect through the Unix socket or a loopback address of this host";
  logRefusal(ctx, why);
  return absl::UnauthenticatedError(why);
}

bool Access::seesAll(uid_t uid) const {
  if (uid == 0) return true;
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

std::optional<uid_t> Access::ownerOf(int64_t session) const {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (auto it = m_owners.find(session); it != m_owners.end()) return it->second;
  }
  auto owner = Store::sessionOwner(m_dbPath, session);
  if (!owner.ok()) return std::nullopt;
  const uid_t uid = owner->value_or(m_storeOwner);
  std::lock_guard<std::mutex> lock(m_mutex);
  m_owners[session] = uid;
  return uid;
}

grpc::Status Access::check(const grpc::ServerContext& ctx, int64_t session,
                           const char* what) const {
  auto uid = caller(ctx, what);
  if (!uid.ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(uid.status().message()));
  }
  const std::optional<uid_t> owner = ownerOf(session);
  if (!owner || *owner == *uid || seesAll(*uid)) return grpc::Status::OK;
  const std::string why = std::string(what) + ": session " + std::to_string(session) +
                          " belongs to uid " + std::to_string(*owner) + ", not to uid " +
                          std::to_string(*uid) +
                          " (its owner, root or a member of tidemarkd's --allow-group may use it)";
  logRefusal(ctx, why);
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why);
}

void Access::logRefusal(const grpc::ServerContext& ctx, const std::string& why) const {
  const std::optional<Peer> peer = m_peers.of(ctx);
  std::string who = peer ? peer->address : ctx.peer();
  if (peer && peer->pid > 0) who += ", pid " + std::to_string(peer->pid);
  std::fprintf(stderr, "tidemarkd: refused (%s): %s\n", who.c_str(), why.c_str());
}

}  // namespace tidemark::server
