#include "src/base/private_dir.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace tidemark::base {

std::string makePrivateDirectory(const std::string& dir) {
  const std::filesystem::path path(dir);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    std::error_code ec;
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return "cannot make " + dir + ": " + std::strerror(errno);
    }
    if (::lstat(dir.c_str(), &st) != 0) return "cannot make " + dir + ": " + std::strerror(errno);
  }
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != ::geteuid()) {
    return dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
           std::to_string(::geteuid()) + ")";
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return dir + " can be entered by other users (mode " + mode + "); make it private: chmod 700 " +
           dir;
  }
  return "";
}

std::string defaultSpoolDirectory() {
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && *state != '\0') return std::string(state) + "/tidemark/spool";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : ".") +
         "/.local/state/tidemark/spool";
}

std::string defaultHandoffDirectory() {
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) return "";
  return "/dev/shm/tidemark-" + std::to_string(::geteuid());
}

}  // namespace tidemark::base
