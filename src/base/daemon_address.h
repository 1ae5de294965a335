#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace tidemark::base {

// Where a user's own tidemarkd listens: $XDG_RUNTIME_DIR/tidemark/tidemarkd.sock, or
// ~/.cache/tidemark/tidemarkd.sock where there is no runtime directory.
std::string defaultUnixSocket();
// The same as a gRPC target: "unix:" and the path. What the agent, the CLI and the GUI use when
// neither --server nor TIDEMARK_SERVER says otherwise.
std::string defaultDaemonAddress();

// Empty when the daemon at target (a gRPC target: "unix:PATH" or "HOST:PORT") runs as this
// user or as root; otherwise why it may not be sent anything: a socket or port of another user,
// a path that is not a socket, or an address off this host without TLS (who runs a daemon there
// can only be told by its certificate). A daemon not running at all is trusted
// (there is nothing to send to; a later check catches whoever takes its place). With
// tlsVerified (the client checks the daemon's certificate against its CA), a TCP address
// anywhere is trusted: the certificate says who runs the daemon.
std::string untrustedDaemon(const std::string& target, bool tlsVerified = false);

// The uid the daemon at target runs as, as the kernel tells it: the owner of a Unix socket, or
// of the socket listening on a loopback port; none for any other address, or when nothing is
// there.
std::optional<uid_t> daemonOwner(const std::string& target);

// Whether target (a gRPC target, as an agent was given it) reaches the daemon listening on the
// Unix socket `unixSocket` ("" for none) or on loopback port `tcpPort` (0 for none): the same
// socket file, or a loopback address of that port.
bool reachesDaemonAt(const std::string& target, const std::string& unixSocket, int tcpPort);

// Whether something listens at target now (a connection the kernel accepts, closed at once):
// "unix:PATH" or a loopback "HOST:PORT"; false for any other address (not probed). Fast, and
// independent of gRPC's threads, which a loaded machine may hold up.
bool daemonListening(const std::string& target);
// Whether daemonListening's "no" means nobody listens (a Unix socket or a loopback address).
bool isProbedTarget(const std::string& target);

// The environment variable's value, "" when unset.
const char* env(const char* name);

// The token a client presents: `value` when not empty, else the first line of `file` (when
// named), else "". Surrounding white space is dropped.
std::string readToken(const std::string& value, const std::string& file);

}  // namespace tidemark::base
