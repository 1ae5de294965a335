#include "server/store/store_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tidemark::server {

absl::StatusOr<StoreLock> StoreLock::acquire(const std::string& dbPath) {
  const std::string path = dbPath + ".lock";
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError("cannot open the store's lock file " + path + ": " +
                                         std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      return absl::FailedPreconditionError("the store " + dbPath +
                                           " is in use by another tidemarkd (pid " + holder +
                                           "); one daemon per store");
    }
    return absl::FailedPreconditionError("cannot lock " + path + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the pid; only the refusal message of a second daemon loses it.
  }
  return StoreLock(fd);
}

StoreLock& StoreLock::operator=(StoreLock&& other) noexcept {
  if (this != &other) {
    if (m_fd >= 0) ::close(m_fd);
    m_fd = other.m_fd;
    other.m_fd = -1;
  }
  return *this;
}

StoreLock::~StoreLock() {
  if (m_fd >= 0) ::close(m_fd);  // closing releases the lock
}

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
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError("--unix " + path + ": path too long for a Unix socket");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
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
