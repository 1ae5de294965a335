#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/store/store.h"
#include "server/store/writer.h"
#include "tidemark/v1/admin.pb.h"

namespace tidemark::server {

// What a token lets its bearer do, and as whom.
struct TokenGrant {
  int64_t id = 0;
  uid_t uid = 0;
  v1::TokenRole role = v1::TOKEN_ROLE_UNSPECIFIED;
};

// The daemon's tokens: secrets handed out once ("tdm_" and 64 hex digits of getrandom), kept only
// as SHA-256 hashes, in the store and in memory for lookups.
class TokenBook {
 public:
  TokenBook(StoreWriter& writer, std::string dbPath)
      : m_writer(writer), m_dbPath(std::move(dbPath)) {}

  // Reads the store's tokens (at start).
  absl::Status load();
  // A new token acting on uid's sessions: its id and its secret.
  absl::StatusOr<std::pair<int64_t, std::string>> create(v1::TokenRole role,
                                                         const std::string& name, uid_t uid);
  absl::Status revoke(int64_t id);
  // The grant of a secret; nullopt when unknown or revoked.
  std::optional<TokenGrant> find(const std::string& secret) const;
  absl::StatusOr<std::vector<TokenRow>> list() const { return Store::readTokens(m_dbPath); }

 private:
  StoreWriter& m_writer;
  std::string m_dbPath;
  mutable std::mutex m_mutex;
  std::map<std::string, TokenGrant> m_byHash;  // live tokens only
};

// SHA-256 of data (32 bytes).
std::string sha256(const std::string& data);

}  // namespace tidemark::server
