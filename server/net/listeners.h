#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "server/net/peer_registry.h"

namespace tidemark::server {

// The daemon's listening sockets. tidemarkd accepts connections itself, learns who is at the
// other end (PeerRegistry) and only then hands each to gRPC: gRPC's own listeners do not say
// which user a call comes from.
class Listeners {
 public:
  ~Listeners();

  // TCP on "HOST:PORT" (port 0 picks a free one). Loopback addresses only: a call from another
  // machine could not be told apart from anyone's.
  absl::Status listenTcp(const std::string& address);
  int tcpPort() const { return m_tcpPort; }
  // A Unix socket at path, mode 0600 (its directory is the caller's to make private).
  absl::Status listenUnix(const std::string& path);

  // Accepts on a thread of its own from now on, handing each connection to server.
  void start(grpc::Server* server, PeerRegistry* peers);
  // Stops accepting and closes the listening sockets (the Unix socket's file is removed).
  void stop();

 private:
  void acceptLoop();
  int handOver(int fd);

  std::vector<int> m_fds;
  int m_wake = -1;  // an eventfd: stop() wakes the accept loop
  int m_tcpPort = 0;
  std::string m_unixPath;
  grpc::Server* m_server = nullptr;
  PeerRegistry* m_peers = nullptr;
  std::thread m_thread;
  int m_nextFd = 0;  // descriptors given to gRPC rotate through a range (see handOver)
  int m_fdLimit = 0;
};

}  // namespace tidemark::server
