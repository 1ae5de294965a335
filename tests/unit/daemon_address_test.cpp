// base::daemonListening: what an exiting agent asks the kernel before it gives a daemon the
// exit's whole time; base::daemonOwner: whether that daemon runs as this user. Real sockets: a Unix
// socket and a loopback port that listen, and ones that do not.
#include "src/base/daemon_address.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

namespace tidemark::base {
namespace {

// A Unix socket bound at `path` (not listening yet); its descriptor.
int boundUnixSocket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(DaemonListeningTest, AUnixSocketListensUntilItIsClosed) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tidemark-listen-" + std::to_string(getpid()) + ".sock"))
                               .string();
  std::filesystem::remove(path);
  EXPECT_FALSE(daemonListening("unix:" + path));  // nothing there
  const int fd = boundUnixSocket(path);
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(daemonListening("unix:" + path));  // bound, not listening
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_TRUE(daemonListening("unix:" + path));
  EXPECT_EQ(daemonOwner("unix:" + path), std::optional<uid_t>(::geteuid()));
  ::close(fd);
  EXPECT_FALSE(daemonListening("unix:" + path));  // the file stays, no one listens
  std::filesystem::remove(path);
}

TEST(DaemonListeningTest, ALoopbackPortListensAndNoOtherAddressIsProbed) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_TRUE(daemonListening("127.0.0.1:" + port));
  EXPECT_TRUE(daemonListening("localhost:" + port));
  EXPECT_EQ(daemonOwner("127.0.0.1:" + port), std::optional<uid_t>(::geteuid()));
  EXPECT_EQ(daemonOwner("192.0.2.1:" + port),
            std::nullopt);  // off this host: the kernel cannot say
  // Not probed: another host (its answer would take a network round trip), or no port.
  EXPECT_FALSE(daemonListening("192.0.2.1:" + port));
  EXPECT_FALSE(daemonListening("127.0.0.1"));
  EXPECT_FALSE(daemonListening("127.0.0.1:0"));
  ::close(fd);
  EXPECT_FALSE(daemonListening("127.0.0.1:" + port));
  EXPECT_EQ(daemonOwner("127.0.0.1:" + port), std::nullopt);
}

// Which daemon an agent's target reaches: what a daemon asks of a spool's handshake before it
// takes the spool up as a run that was meant for it.
TEST(ReachesDaemonAtTest, TheSameSocketFileOrTheSameLoopbackPort) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tidemark-reaches-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "sub");
  const std::string path = (dir / "d.sock").string();
  const int fd = boundUnixSocket(path);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(reachesDaemonAt("unix:" + path, path, 0));
  EXPECT_TRUE(reachesDaemonAt("unix://" + path, path, 0));
  EXPECT_TRUE(reachesDaemonAt("unix:" + (dir / "sub" / ".." / "d.sock").string(), path, 0));
  EXPECT_FALSE(reachesDaemonAt("unix:" + (dir / "other.sock").string(), path, 0));
  EXPECT_FALSE(reachesDaemonAt("unix:" + path, "", 4242));
  EXPECT_TRUE(reachesDaemonAt("127.0.0.1:4242", path, 4242));
  EXPECT_TRUE(reachesDaemonAt("localhost:4242", "", 4242));
  EXPECT_TRUE(reachesDaemonAt("[::1]:4242", "", 4242));
  EXPECT_FALSE(reachesDaemonAt("127.0.0.1:4243", "", 4242));
  EXPECT_FALSE(reachesDaemonAt("192.0.2.1:4242", "", 4242));  // another host's port
  EXPECT_FALSE(reachesDaemonAt("127.0.0.1:4242", path, 0));   // no TCP port here
  EXPECT_FALSE(reachesDaemonAt("", path, 4242));
  ::close(fd);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark::base
