#include "agent/transport/spool.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/base/private_dir.h"

namespace tidemark::agent {

std::string prepareSpoolDirectory(const std::string& dir) {
  if (dir == base::defaultSpoolDirectory() || dir == base::defaultHandoffDirectory()) {
    return base::makePrivateDirectory(dir);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return "";
}

uint64_t freeBytesFor(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (;;) {
    struct statvfs fs {};
    if (::statvfs(dir.c_str(), &fs) == 0) return uint64_t{fs.f_bavail} * fs.f_frsize;
    if (!dir.has_relative_path()) return 0;
    dir = dir.parent_path();
  }
}

SpoolWriter::SpoolWriter(std::string path, uint64_t capBytes)
    : m_path(std::move(path)), m_cap(capBytes) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    m_cap = std::min<uint64_t>(m_cap, limit.rlim_cur);
  }
}

SpoolWriter::~SpoolWriter() {
  if (m_fd >= 0) ::close(m_fd);
}

bool SpoolWriter::append(const v1::AgentMessage& message) {
  return appendSerialized(message.SerializeAsString());
}

bool SpoolWriter::appendSerialized(const std::string& bytes) {
  return appendSerialized(bytes, nullptr, 0);
}

bool SpoolWriter::appendSerialized(const std::string& bytes, const void* tail, size_t tailBytes) {
  if (m_failed) return false;
  const uint64_t size = bytes.size() + tailBytes;
  if (size > UINT32_MAX || m_bytes + size + 4 > m_cap) return false;
  if (m_fd < 0) {
    m_failure = prepareSpoolDirectory(std::filesystem::path(m_path).parent_path().string());
    if (!m_failure.empty()) {
      m_failed = true;
      return false;
    }
    m_fd = ::open(m_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (m_fd < 0) {
      m_failure = "cannot create " + m_path + ": " + std::strerror(errno);
      m_failed = true;
      return false;
    }
  }
  const uint32_t n = static_cast<uint32_t>(size);
  unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                          static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  iovec parts[3] = {{len, 4},
                    {const_cast<char*>(bytes.data()), bytes.size()},
                    {const_cast<void*>(tail), tailBytes}};
  // The whole message, however the kernel splits the write.
  int first = 0;
  const int count = tailBytes > 0 ? 3 : 2;
  while (first < count) {
    const ssize_t wrote = ::writev(m_fd, parts + first, count - first);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      m_failure = "cannot write " + m_path + ": " + std::strerror(wrote < 0 ? errno : ENOSPC);
      m_failed = true;
      return false;
    }
    size_t left = static_cast<size_t>(wrote);
    while (first < count && left >= parts[first].iov_len) left -= parts[first++].iov_len;
    if (first < count) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + left;
      parts[first].iov_len -= left;
    }
  }
  m_bytes += size + 4;
  return true;
}

}  // namespace tidemark::agent
