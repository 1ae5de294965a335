#include "server/store/store_lock.h"

#include <fcntl.h>
#include <sys/file.h>
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

}  // namespace tidemark::server
