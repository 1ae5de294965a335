#include "cli/own_daemon.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "cli/install_paths.h"
#include "src/base/daemon_address.h"
#include "src/base/preload_list.h"
#include "src/base/unix_address.h"

namespace tidemark::cli {

namespace {

bool answers(const std::string& path) {
  sockaddr_un addr{};
  if (!base::unixAddress(path, &addr)) return false;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Starts tidemarkd detached from this process (its own session, stdio on /dev/null, stderr to
// the log). Returns its pid, or -1.
pid_t spawn(const std::string& daemon, const std::string& log) {
  // Never the agent in the daemon (a `tidemark` run inside a recorded job has it preloaded,
  // under any name $TIDEMARK_AGENT gave it); the job's other preloads stay. Worked out before
  // the fork: the child only sets it.
  const char* preload = std::getenv("LD_PRELOAD");
  std::string keptPreload;
  if (preload != nullptr) {
    const std::string agent = findAgent();
    keptPreload = base::preloadWithout(
        preload, [&](std::string_view entry) { return base::preloadEntryIsAgent(entry, agent); });
  }
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ::setsid();
    const pid_t grandchild = ::fork();
    if (grandchild != 0) _exit(grandchild > 0 ? 0 : 1);
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    const int err =
        ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(err >= 0 ? err : null, 2);
    if (preload != nullptr) {
      if (keptPreload.empty()) {
        ::unsetenv("LD_PRELOAD");
      } else {
        ::setenv("LD_PRELOAD", keptPreload.c_str(), 1);
      }
    }
    ::unsetenv("CUDA_INJECTION64_PATH");
    ::execl(daemon.c_str(), "tidemarkd", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? child : -1;
}

std::string lastLines(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return last;
}

}  // namespace

bool ensureOwnDaemon(const std::string& address) {
  if (address != base::defaultDaemonAddress()) return true;
  const std::string socket = base::defaultUnixSocket();
  if (answers(socket)) return true;
  const std::string daemon = findDaemon();
  if (daemon.empty()) {
    std::fprintf(stderr,
                 "tidemark: no tidemarkd answers at %s and none was found to start (beside this "
                 "tidemark, or $TIDEMARK_DAEMON)\n",
                 socket.c_str());
    return false;
  }
  // Its directory: the daemon checks it is private; made here first for the log.
  const std::string dir = std::filesystem::path(socket).parent_path().string();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path(), ec);
  ::mkdir(dir.c_str(), 0700);
  const std::string log = dir + "/tidemarkd.log";
  if (spawn(daemon, log) < 0) {
    std::fprintf(stderr, "tidemark: could not start %s: %s\n", daemon.c_str(),
                 std::strerror(errno));
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!answers(socket)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "tidemark: started tidemarkd, but it does not answer at %s (%s: %s)\n",
                   socket.c_str(), log.c_str(), lastLines(log).c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "tidemark: started your tidemarkd (unix:%s; its log: %s)\n", socket.c_str(),
               log.c_str());
  return true;
}

}  // namespace tidemark::cli
