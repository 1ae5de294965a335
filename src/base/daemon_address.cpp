#include "src/base/daemon_address.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/base/socket_owner.h"

namespace tidemark::base {

std::string defaultUnixSocket() {
  const char* run = std::getenv("XDG_RUNTIME_DIR");
  if (run != nullptr && *run != '\0') return std::string(run) + "/tidemark/tidemarkd.sock";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : ".") +
         "/.cache/tidemark/tidemarkd.sock";
}

std::string defaultDaemonAddress() { return "unix:" + defaultUnixSocket(); }

namespace {
// The socket's path of a "unix:PATH" target ("unix:///abs/path" as well).
std::string unixSocketPath(const std::string& target) {
  std::string path = target.substr(5);
  if (path.rfind("//", 0) == 0) path = path.substr(2);
  return path;
}

std::string ownerText(uid_t uid) {
  return "uid " + std::to_string(uid) + ", not this user (uid " + std::to_string(::geteuid()) +
         ") or root";
}
}  // namespace

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string untrustedDaemon(const std::string& target, bool tlsVerified) {
  const uid_t self = ::geteuid();
  if (target.rfind("unix:", 0) == 0) {
    const std::string path = unixSocketPath(target);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return "";
      return "cannot reach " + path + ": " + std::strerror(errno);
    }
    if (!S_ISSOCK(st.st_mode)) return path + " is not a socket";
    if (st.st_uid != self && st.st_uid != 0)
      return "the socket " + path + " belongs to " + ownerText(st.st_uid);
    return "";
  }
  if (target.rfind("unix-abstract:", 0) == 0) return "abstract Unix sockets have no owner to check";
  std::string hostPort = target;
  if (hostPort.rfind("dns:", 0) == 0) hostPort = hostPort.substr(4);
  if (hostPort.rfind("ipv4:", 0) == 0 || hostPort.rfind("ipv6:", 0) == 0) {
    hostPort = hostPort.substr(5);
  }
  std::string host, port;
  if (!splitHostPort(hostPort, &host, &port)) return target + ": expected HOST:PORT or unix:PATH";
  if (tlsVerified) return "";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return target + ": the address cannot be resolved";
  }
  bool loopback = true;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage a{};
    std::memcpy(&a, ai->ai_addr, ai->ai_addrlen);
    loopback = loopback && isLoopback(a);
  }
  ::freeaddrinfo(found);
  if (!loopback) {
    return target +
           " is off this host: who runs a daemon there can only be told by its certificate; "
           "talk TLS to it (--tls-ca or TIDEMARK_TLS_CA)";
  }
  const long number = std::strtol(port.c_str(), nullptr, 10);
  const std::optional<uid_t> owner = tcpListenerOwner(static_cast<uint16_t>(number));
  if (owner && *owner != self && *owner != 0) {
    return "port " + port + " is listened on by " + ownerText(*owner);
  }
  return "";
}

std::optional<uid_t> daemonOwner(const std::string& target) {
  if (target.rfind("unix:", 0) == 0) {
    const std::string path = unixSocketPath(target);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
    return st.st_uid;
  }
  if (!isProbedTarget(target)) return std::nullopt;
  const long port = std::strtol(target.c_str() + target.rfind(':') + 1, nullptr, 10);
  if (port <= 0 || port > 65535) return std::nullopt;
  return tcpListenerOwner(static_cast<uint16_t>(port));
}

std::string readToken(const std::string& value, const std::string& file) {
  std::string token = value;
  if (token.empty() && !file.empty()) {
    std::ifstream in(file);
    std::getline(in, token);
  }
  const size_t begin = token.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const size_t end = token.find_last_not_of(" \t\r\n");
  return token.substr(begin, end - begin + 1);
}

bool reachesDaemonAt(const std::string& target, const std::string& unixSocket, int tcpPort) {
  if (target.rfind("unix:", 0) == 0) {
    if (unixSocket.empty()) return false;
    const std::filesystem::path path = unixSocketPath(target);
    std::error_code ec;
    if (std::filesystem::equivalent(path, unixSocket, ec)) return true;
    return path.lexically_normal() == std::filesystem::path(unixSocket).lexically_normal();
  }
  if (tcpPort <= 0 || !isProbedTarget(target)) return false;
  return std::strtol(target.c_str() + target.rfind(':') + 1, nullptr, 10) == tcpPort;
}

bool isProbedTarget(const std::string& target) {
  if (target.rfind("unix:", 0) == 0) return true;
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = target.substr(0, colon);
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]";
}

bool daemonListening(const std::string& target) {
  int fd = -1;
  int rc = -1;
  if (target.rfind("unix:", 0) == 0) {
    const std::string path = unixSocketPath(target);
    sockaddr_un addr{};
    if (path.empty() || path.size() >= sizeof addr.sun_path) return false;
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } else {
    // Loopback only: an address elsewhere is not probed (the kernel answers for this host at once).
    const size_t colon = target.rfind(':');
    if (colon == std::string::npos) return false;
    const std::string host = target.substr(0, colon);
    const int port = std::atoi(target.c_str() + colon + 1);
    if (port <= 0 || port > 65535) return false;
    if (host == "127.0.0.1" || host == "localhost") {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return false;
      rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    } else if (host == "[::1]") {
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      addr.sin6_addr = in6addr_loopback;
      fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return false;
      rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    } else {
      return false;
    }
  }
  // A full backlog (EAGAIN on a Unix socket) is a daemon too: busy, not absent.
  const bool listening = rc == 0 || errno == EAGAIN;
  ::close(fd);
  return listening;
}

}  // namespace tidemark::base
