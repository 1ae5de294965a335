#include "server/net/peer_registry.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

#include "src/base/socket_owner.h"

namespace tidemark::server {

namespace {
ino_t inodeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}
}  // namespace

void PeerRegistry::add(int fd, Peer peer) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_peers.size() >= 4096) {
    // Connections gRPC has closed since: their descriptors are closed or hold another socket.
    for (auto it = m_peers.begin(); it != m_peers.end();) {
      it = inodeOf(it->first) != it->second.inode ? m_peers.erase(it) : std::next(it);
    }
  }
  m_peers[fd] = std::move(peer);
}

std::optional<Peer> PeerRegistry::of(const grpc::ServerContext& ctx) const {
  const std::string name = ctx.peer();
  sockaddr_storage client{};
  if (m_tlsPort != 0 && base::parsePeerName(name, &client)) {
    Peer peer;
    peer.address = base::describe(client) + " (TLS)";
    if (base::isLoopback(client)) {
      peer.uid = base::tcpClientOwner(client, static_cast<uint16_t>(m_tlsPort));
    }
    return peer;
  }
  if (name.rfind("fd:", 0) != 0) return std::nullopt;
  char* end = nullptr;
  const long fd = std::strtol(name.c_str() + 3, &end, 10);
  if (end == name.c_str() + 3 || *end != '\0') return std::nullopt;
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_peers.find(static_cast<int>(fd));
  if (it == m_peers.end()) return std::nullopt;
  return it->second;
}

Peer identifyPeer(int fd) {
  Peer peer;
  peer.inode = inodeOf(fd);
  sockaddr_storage local{};
  socklen_t localLen = sizeof local;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLen) != 0) return peer;
  if (local.ss_family == AF_UNIX) {
    peer.address = "unix socket";
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      peer.uid = cred.uid;
      peer.pid = cred.pid;
    }
    return peer;
  }
  sockaddr_storage remote{};
  socklen_t remoteLen = sizeof remote;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remoteLen) != 0) return peer;
  peer.address = base::describe(remote);
  // The client's own socket: its local end is our peer, its peer is our local end.
  if (base::isLoopback(remote)) peer.uid = base::tcpSocketOwner(remote, local);
  return peer;
}

}  // namespace tidemark::server
