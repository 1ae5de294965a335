#include "src/base/socket_owner.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tidemark::base {

namespace {

// Addresses as the kernel prints them in /proc/net/tcp{,6}: the address's 32-bit words in the
// host's byte order, "%08X" each, then ":%04X" of the port.
std::string words(const void* bytes, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    uint32_t w = 0;
    std::memcpy(&w, static_cast<const char*>(bytes) + 4 * i, 4);
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08X", w);
    out += hex;
  }
  return out;
}

std::string port(uint16_t networkOrder) {
  char hex[6];
  std::snprintf(hex, sizeof hex, ":%04X", ntohs(networkOrder));
  return hex;
}

// How the address appears in the IPv4 table (when it is one, or IPv4-mapped) and in the IPv6
// table: a dual-stack socket (as gRPC's clients make) talks to 127.0.0.1 as ::ffff:127.0.0.1
// and is listed in tcp6.
struct Forms {
  std::string v4;  // empty when the address is not an IPv4 one
  std::string v6;
};

Forms forms(const sockaddr_storage& a) {
  Forms f;
  in6_addr six{};
  uint16_t p = 0;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    six.s6_addr[10] = six.s6_addr[11] = 0xff;
    std::memcpy(six.s6_addr + 12, &in.sin_addr, 4);
    p = in.sin_port;
  } else {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    six = in6.sin6_addr;
    p = in6.sin6_port;
  }
  if (IN6_IS_ADDR_V4MAPPED(&six)) f.v4 = words(six.s6_addr + 12, 1) + port(p);
  f.v6 = words(&six, 4) + port(p);
  return f;
}

// Calls row(local, remote, state, uid) for each socket of the table; stops when it returns true.
template <typename Row>
void scan(bool v6, Row&& row) {
  std::ifstream in(v6 ? "/proc/net/tcp6" : "/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits;
    long uid = -1;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid)) {
      continue;
    }
    if (row(local, remote, state, static_cast<uid_t>(uid))) return;
  }
}

}  // namespace

bool isLoopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family != AF_INET6) return false;
  const in6_addr& in6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&in6) || (IN6_IS_ADDR_V4MAPPED(&in6) && in6.s6_addr[12] == 127);
}

std::optional<uid_t> tcpSocketOwner(const sockaddr_storage& local, const sockaddr_storage& remote) {
  const Forms l = forms(local);
  const Forms r = forms(remote);
  std::optional<uid_t> owner;
  for (bool v6 : {false, true}) {
    const std::string& lt = v6 ? l.v6 : l.v4;
    const std::string& rt = v6 ? r.v6 : r.v4;
    if (lt.empty() || rt.empty()) continue;
    scan(v6,
         [&](const std::string& local, const std::string& remote, const std::string&, uid_t uid) {
           if (local != lt || remote != rt) return false;
           owner = uid;
           return true;
         });
    if (owner) break;
  }
  return owner;
}

std::optional<uid_t> tcpClientOwner(const sockaddr_storage& client, uint16_t serverPort) {
  const Forms c = forms(client);
  char suffix[6];
  std::snprintf(suffix, sizeof suffix, ":%04X", serverPort);
  std::optional<uid_t> owner;
  for (bool v6 : {false, true}) {
    const std::string& ct = v6 ? c.v6 : c.v4;
    if (ct.empty()) continue;
    scan(v6, [&](const std::string& local, const std::string& remote, const std::string&,
                 uid_t uid) {
      if (local != ct || remote.size() < 5 || remote.compare(remote.size() - 5, 5, suffix) != 0) {
        return false;
      }
      owner = uid;
      return true;
    });
    if (owner) break;
  }
  return owner;
}

bool splitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return true;
}

bool parsePeerName(const std::string& name, sockaddr_storage* out) {
  *out = sockaddr_storage{};
  const bool v4 = name.rfind("ipv4:", 0) == 0;
  if (!v4 && name.rfind("ipv6:", 0) != 0) return false;
  std::string host, portText;
  if (!splitHostPort(name.substr(5), &host, &portText)) return false;
  const long port = std::strtol(portText.c_str(), nullptr, 10);
  if (port <= 0 || port > 65535) return false;
  if (v4) {
    auto& in = reinterpret_cast<sockaddr_in&>(*out);
    in.sin_family = AF_INET;
    in.sin_port = htons(static_cast<uint16_t>(port));
    return inet_pton(AF_INET, host.c_str(), &in.sin_addr) == 1;
  }
  auto& in6 = reinterpret_cast<sockaddr_in6&>(*out);
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET6, host.c_str(), &in6.sin6_addr) == 1;
}

std::optional<uid_t> tcpListenerOwner(uint16_t hostOrderPort) {
  // The addresses a connection to 127.0.0.1 or ::1 reaches: those two and the wildcards.
  sockaddr_storage v4{}, any4{}, v6{}, any6{};
  for (auto [storage, text] : {std::pair{&v4, "127.0.0.1"}, std::pair{&any4, "0.0.0.0"}}) {
    auto& in = reinterpret_cast<sockaddr_in&>(*storage);
    in.sin_family = AF_INET;
    in.sin_port = htons(hostOrderPort);
    inet_pton(AF_INET, text, &in.sin_addr);
  }
  for (auto [storage, text] : {std::pair{&v6, "::1"}, std::pair{&any6, "::"}}) {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(*storage);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(hostOrderPort);
    inet_pton(AF_INET6, text, &in6.sin6_addr);
  }
  std::optional<uid_t> owner;
  for (bool inV6 : {false, true}) {
    // Listening on 127.0.0.1 or 0.0.0.0 (IPv4 table), ::1 or :: (IPv6 table; :: takes IPv4
    // connections too unless it is IPv6-only).
    const std::string a = inV6 ? forms(v6).v6 : forms(v4).v4;
    const std::string b = inV6 ? forms(any6).v6 : forms(any4).v4;
    scan(inV6, [&](const std::string& lt, const std::string&, const std::string& state, uid_t uid) {
      if (state != "0A" || (lt != a && lt != b)) return false;  // 0A: listening
      owner = uid;
      return true;
    });
    if (owner) break;
  }
  return owner;
}

std::string describe(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in.sin_port));
  }
  const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
  inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof host);
  return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6.sin6_port));
}

}  // namespace tidemark::base
