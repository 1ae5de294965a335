#include "server/rpc/token_book.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <chrono>
#include <memory>

namespace tidemark::server {

std::string sha256(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

absl::Status TokenBook::load() {
  auto rows = Store::readTokens(m_dbPath);
  if (!rows.ok()) return rows.status();
  std::lock_guard<std::mutex> lock(m_mutex);
  m_byHash.clear();
  for (const TokenRow& t : *rows) {
    if (t.revoked) continue;
    m_byHash[t.hash] = {t.id, static_cast<uid_t>(t.uid), static_cast<v1::TokenRole>(t.role)};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, std::string>> TokenBook::create(v1::TokenRole role,
                                                                  const std::string& name,
                                                                  uid_t uid) {
  unsigned char random[32];
  size_t got = 0;
  while (got < sizeof random) {
    const ssize_t n = getrandom(random + got, sizeof random - got, 0);
    if (n <= 0) return absl::InternalError("getrandom failed");
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string secret = "tdm_";
  for (unsigned char c : random) {
    secret += kHex[c >> 4];
    secret += kHex[c & 15];
  }
  TokenRow row;
  row.name = name;
  row.role = role;
  row.uid = uid;
  row.hash = sha256(secret);
  row.createdWallNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  auto id = std::make_shared<int64_t>(0);
  absl::Status s = m_writer
                       .submit([row, id](Store& store) -> absl::Status {
                         auto inserted = store.insertToken(row);
                         if (!inserted.ok()) return inserted.status();
                         *id = *inserted;
                         return absl::OkStatus();
                       })
                       .get();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(m_mutex);
  m_byHash[row.hash] = {*id, uid, role};
  return std::make_pair(*id, secret);
}

absl::Status TokenBook::revoke(int64_t id) {
  absl::Status s = m_writer.submit([id](Store& store) { return store.revokeToken(id); }).get();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(m_mutex);
  for (auto it = m_byHash.begin(); it != m_byHash.end(); ++it) {
    if (it->second.id == id) {
      m_byHash.erase(it);
      break;
    }
  }
  return absl::OkStatus();
}

std::optional<TokenGrant> TokenBook::find(const std::string& secret) const {
  const std::string hash = sha256(secret);
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_byHash.find(hash);
  if (it == m_byHash.end()) return std::nullopt;
  return it->second;
}

}  // namespace tidemark::server
