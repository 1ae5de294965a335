#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "server/net/peer_registry.h"

namespace tidemark::server {

// Who may see and steer which session. A session belongs to the uid of the agent that opened
// it; a call is answered for the caller's own sessions only, unless the caller is root or a
// member of the group given to `tidemarkd --allow-group`. Sessions stored before owners were
// recorded belong to the user whose store it is (the daemon's uid). Every refusal is logged.
class Access {
 public:
  Access(const PeerRegistry& peers, std::string dbPath, uid_t storeOwner,
         std::optional<gid_t> allowGroup);

  // The caller's uid, or UNAUTHENTICATED saying why it cannot be told.
  absl::StatusOr<uid_t> caller(const grpc::ServerContext& ctx, const char* what) const;
  // Root, or in the allowed group: sees every session.
  bool seesAll(uid_t uid) const;
  // OK when the caller may use the session (or it does not exist: the call says so itself);
  // UNAUTHENTICATED or PERMISSION_DENIED otherwise.
  grpc::Status check(const grpc::ServerContext& ctx, int64_t session, const char* what) const;
  // The uid a session belongs to (the store's owner for one stored without); nullopt when none.
  std::optional<uid_t> ownerOf(int64_t session) const;
  uid_t storeOwner() const { return m_storeOwner; }

 private:
  void logRefusal(const grpc::ServerContext& ctx, const std::string& why) const;

  const PeerRegistry& m_peers;
  std::string m_dbPath;
  uid_t m_storeOwner;
  std::optional<gid_t> m_allowGroup;
  mutable std::mutex m_mutex;
  mutable std::map<int64_t, uid_t> m_owners;  // owners never change: cached
};

}  // namespace tidemark::server
