#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "server/net/peer_registry.h"
#include "server/rpc/token_book.h"

namespace tidemark::server {

// What a call may do.
enum Role : unsigned {
  kIngest = 1,   // stream a recording
  kRead = 2,     // list and query sessions, ask the advisor
  kControl = 4,  // apply plans to running jobs
};

// Who is calling: the uid whose sessions the call may use, and what it may do.
struct Caller {
  uid_t uid = 0;
  unsigned roles = 0;
  std::optional<int64_t> tokenId;  // the token it presented, if any
};

// Who may see and steer which session. A session belongs to the uid of the agent that opened it;
// a call is answered for the caller's own sessions only, unless the caller is root or a member
// of the group given to `tidemarkd --allow-group`. The caller is the uid the kernel gives for its
// connection (Unix socket, loopback TCP), with every role; or, when it presents a token
// ("authorization: Bearer tdm_..."), the token's uid with the token's role. A daemon started with
// --require-token answers nothing without one (but token management, which only the kernel's
// word opens). Sessions stored before owners were recorded belong to the store's owner (the
// daemon's uid). Every refusal is logged.
class Access {
 public:
  Access(const PeerRegistry& peers, const TokenBook& tokens, std::string dbPath, uid_t storeOwner,
         std::optional<gid_t> allowGroup, bool requireToken);
  // The daemon's own calls on its in-process channel (a handed-off file taken up: handoff_taker.h)
  // carry kInternalKey = a secret made at start, which never leaves the process, and
  // kOnBehalfKey = the uid the file came from (checked when it was handed over): they are
  // that uid's, for ingest only.
  static constexpr const char* kInternalKey = "x-tidemark-internal";
  static constexpr const char* kOnBehalfKey = "x-tidemark-on-behalf-of";
  // A new random secret for those calls.
  std::string makeInternalSecret();
  // A store file read in this process (tidemark --db FILE): the file's permissions decided who
  // reads it, so its reader (this process's uid) reads every session in it, and nothing else.
  static std::unique_ptr<Access> fileReader(std::string dbPath);

  // The caller, if it may do `need` (a Role); UNAUTHENTICATED or PERMISSION_DENIED saying why.
  absl::StatusOr<Caller> caller(const grpc::ServerContext& ctx, const char* what,
                                unsigned need) const;
  // Root, or in the allowed group: sees every session.
  bool seesAll(uid_t uid) const;
  // OK when the caller may do `need` to the session (or it does not exist: the call says so
  // itself); UNAUTHENTICATED or PERMISSION_DENIED otherwise.
  grpc::Status check(const grpc::ServerContext& ctx, int64_t session, const char* what,
                     unsigned need) const;
  // The caller of an Admin call: the daemon's own user or root, as the kernel says (a token
  // never opens token management).
  absl::StatusOr<uid_t> administrator(const grpc::ServerContext& ctx, const char* what) const;
  // The uid a session belongs to (the store's owner for one stored without); nullopt when there
  // is no such session; an error when the store cannot be read (then nobody is let in).
  absl::StatusOr<std::optional<uid_t>> ownerOf(int64_t session) const;
  uid_t storeOwner() const { return m_storeOwner; }

 private:
  absl::Status refuse(const grpc::ServerContext& ctx, absl::Status why) const;

  Access(std::string dbPath);  // fileReader's

  const PeerRegistry* m_peers = nullptr;  // nullptr for a file reader
  const TokenBook* m_tokens = nullptr;
  bool m_fileReader = false;
  std::string m_dbPath;
  uid_t m_storeOwner;
  std::optional<gid_t> m_allowGroup;
  bool m_requireToken;
  std::string m_internalSecret;  // "" until made
  mutable std::mutex m_mutex;
  mutable std::map<int64_t, uid_t> m_owners;  // owners never change: cached
};

}  // namespace tidemark::server
