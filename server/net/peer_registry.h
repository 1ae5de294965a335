#pragma once

#include <sys/types.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <grpcpp/grpcpp.h>

namespace tidemark::server {

// Who is at the other end of a connection the daemon accepted.
struct Peer {
  std::optional<uid_t> uid;  // from SO_PEERCRED (Unix socket) or the kernel's table (loopback TCP)
  pid_t pid = 0;             // Unix sockets only
  std::string address;       // "unix socket" or the TCP client's "127.0.0.1:40112"
  ino_t inode = 0;           // of the connection's socket, to tell a reused descriptor
};

// The peers of the connections handed to gRPC, by descriptor: gRPC names such a connection's
// calls "fd:N" (ServerContext::peer()).
class PeerRegistry {
 public:
  void add(int fd, Peer peer);
  // The peer of a call: of a connection the daemon accepted itself, or of one gRPC accepted on
  // the TLS port (its uid known when it comes from this host's loopback); nullopt otherwise.
  std::optional<Peer> of(const grpc::ServerContext& ctx) const;
  // The port of the listener gRPC owns (TLS), 0 for none.
  void setTlsPort(int port) { m_tlsPort = port; }

 private:
  mutable std::mutex m_mutex;
  std::unordered_map<int, Peer> m_peers;
  int m_tlsPort = 0;
};

// The peer at the other end of the connected socket fd (Unix or TCP).
Peer identifyPeer(int fd);

}  // namespace tidemark::server
