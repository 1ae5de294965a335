#include "server/unix_socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/base/unix_address.h"

namespace tidemark::server {

absl::Status claimUnixSocketPath(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError("--unix " + path + ": " + std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError("--unix " + path +
                                         ": exists and is not a socket; not touching it");
  }
  sockaddr_un addr{};
  if (!base::unixAddress(path, &addr)) {
    return absl::InvalidArgumentError("--unix " + path + ": path too long for a Unix socket");
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(std::string("socket: ") + std::strerror(errno));
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  ::close(fd);
  if (rc == 0) {
    return absl::FailedPreconditionError("--unix " + path +
                                         ": another tidemarkd is listening there");
  }
  if (err != ECONNREFUSED) {
    return absl::FailedPreconditionError("--unix " + path + ": " + std::strerror(err));
  }
  // Nobody accepts on it: the socket of a daemon that died.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError("cannot remove the stale socket " + path + ": " +
                                         std::strerror(errno));
  }
  return absl::OkStatus();
}

}  // namespace tidemark::server
