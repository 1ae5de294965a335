#include "server/net/listeners.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <grpcpp/server_posix.h>

#include "src/base/socket_owner.h"
#include "src/base/unix_address.h"

namespace tidemark::server {

namespace {
std::string lastError() { return std::strerror(errno); }
}  // namespace

Listeners::~Listeners() { stop(); }

absl::Status Listeners::listenTcp(const std::string& address) {
  std::string host, port;
  if (!base::splitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError("--listen " + address + ": expected HOST:PORT");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError("--listen " + address + ": " + ::gai_strerror(rc));
  }
  absl::Status status = absl::OkStatus();
  int boundPort = 0;
  for (addrinfo* ai = found; ai != nullptr && status.ok(); ai = ai->ai_next) {
    sockaddr_storage where{};
    std::memcpy(&where, ai->ai_addr, ai->ai_addrlen);
    if (!base::isLoopback(where)) {
      status = absl::InvalidArgumentError(
          "--listen " + address + ": " + base::describe(where) +
          " can be reached from other machines: give it TLS (--tls-cert, --tls-key; callers from "
          "there then need a token), or listen on a loopback address (127.0.0.1, ::1)");
      break;
    }
    // Every address of a name listens on the same port (the first one's, when 0 was asked).
    if (boundPort != 0) reinterpret_cast<sockaddr_in&>(where).sin_port = htons(boundPort);
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::UnavailableError("socket: " + lastError());
      break;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // never SO_REUSEPORT
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&where), ai->ai_addrlen) != 0 ||
        ::listen(fd, 128) != 0) {
      status = absl::UnavailableError("cannot listen on " + address + " (" + lastError() +
                                      "; in use, or not a local address?)");
      ::close(fd);
      break;
    }
    m_fds.push_back(fd);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    boundPort = ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
  }
  ::freeaddrinfo(found);
  if (status.ok()) m_tcpPort = boundPort;
  return status;
}

absl::Status Listeners::listenUnix(const std::string& path) {
  sockaddr_un addr{};
  if (!base::unixAddress(path, &addr)) {
    return absl::InvalidArgumentError("--unix " + path + ": path too long for a Unix socket");
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("socket: " + lastError());
  // Created 0600 (the umask is set before the bind, so the socket is never open to others).
  const mode_t old = ::umask(0177);
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::listen(fd, 128) != 0) {
    const std::string why = lastError();
    ::close(fd);
    return absl::UnavailableError("cannot listen on unix:" + path + ": " + why);
  }
  m_fds.push_back(fd);
  m_unixPath = path;
  return absl::OkStatus();
}

void Listeners::start(grpc::Server* server, PeerRegistry* peers) {
  m_server = server;
  m_peers = peers;
  // Descriptors handed to gRPC rotate through a range above the low ones, so that a number is
  // given again only after many connections: a call still in flight on a closed connection is
  // never taken for the next connection's (PeerRegistry keys peers by descriptor).
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur > 4096 + 1024) {
    m_fdLimit = static_cast<int>(std::min<rlim_t>(limit.rlim_cur - 1024, 1 << 20));
    m_nextFd = 1024;
  }
  m_wake = ::eventfd(0, EFD_CLOEXEC);
  m_thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "td-accept");
    acceptLoop();
  });
}

int Listeners::handOver(int fd) {
  if (m_fdLimit == 0) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, m_nextFd);
  if (moved < 0 || moved >= m_fdLimit) {
    if (moved >= 0) ::close(moved);
    m_nextFd = 1024;
    return fd;
  }
  ::close(fd);
  m_nextFd = moved + 1 >= m_fdLimit ? 1024 : moved + 1;
  return moved;
}

void Listeners::acceptLoop() {
  std::vector<pollfd> polled;
  for (int fd : m_fds) polled.push_back({fd, POLLIN, 0});
  polled.push_back({m_wake, POLLIN, 0});
  for (;;) {
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (polled.back().revents != 0) return;
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if ((polled[i].revents & POLLIN) == 0) continue;
      int fd = ::accept4(polled[i].fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;  // gone already, or out of descriptors (tried again at the next poll)
      fd = handOver(fd);
      Peer peer = identifyPeer(fd);
      if (peer.address.rfind("unix", 0) != 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
      m_peers->add(fd, std::move(peer));
      grpc::AddInsecureChannelFromFd(m_server, fd);
    }
  }
}

void Listeners::stop() {
  if (m_thread.joinable()) {
    const uint64_t one = 1;
    (void)!::write(m_wake, &one, sizeof one);
    m_thread.join();
  }
  for (int fd : m_fds) ::close(fd);
  m_fds.clear();
  if (m_wake >= 0) ::close(m_wake);
  m_wake = -1;
  if (!m_unixPath.empty()) ::unlink(m_unixPath.c_str());
  m_unixPath.clear();
}

}  // namespace tidemark::server
