#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tidemark::base {

// Who owns a TCP socket on this host, from the kernel's socket tables (/proc/net/tcp and tcp6):
// on the loopback interface this is what SO_PEERCRED is on a Unix socket. The daemon asks it of
// the client end of a connection it accepted; an agent asks it of the daemon's listening socket
// before it sends anything there.

// True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104.
bool isLoopback(const sockaddr_storage& address);

// The uid of the socket whose own end is `local` and whose peer is `remote` (as that socket
// sees them), or nullopt when no such socket is in the tables (gone, or in another network
// namespace).
std::optional<uid_t> tcpSocketOwner(const sockaddr_storage& local, const sockaddr_storage& remote);

// The uid of the client socket `client` connected to this host's port serverPort (whichever
// local address it reached), or nullopt.
std::optional<uid_t> tcpClientOwner(const sockaddr_storage& client, uint16_t serverPort);

// "host:5000", "[::1]:5000" into host ("::1", brackets dropped) and port. False without a colon.
bool splitHostPort(const std::string& address, std::string* host, std::string* port);

// Parses gRPC's peer names "ipv4:127.0.0.1:5000" and "ipv6:[::1]:5000". False otherwise.
bool parsePeerName(const std::string& name, sockaddr_storage* out);

// The uid of the socket listening on TCP `port` on a loopback or wildcard address, or nullopt.
std::optional<uid_t> tcpListenerOwner(uint16_t port);

// "127.0.0.1:5000", "[::1]:5000".
std::string describe(const sockaddr_storage& address);

}  // namespace tidemark::base
