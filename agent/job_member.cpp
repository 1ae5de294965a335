#include "agent/job_member.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

namespace tidemark::agent {

namespace {
// A non-negative int, or `fallback` for unset or malformed text.
int number(const char* text, int fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > INT_MAX) return fallback;
  return static_cast<int>(v);
}

bool set(const char* text) { return text != nullptr && *text != '\0'; }
}  // namespace

bool jobMemberFrom(const std::function<const char*(const char*)>& env, v1::JobMember* out) {
  std::string key;
  if (const char* job = env("TIDEMARK_JOB"); set(job)) {
    key = job;
  } else if (const char* run = env("TORCHELASTIC_RUN_ID"); set(run) && std::string(run) != "none") {
    key = run;
  } else if (const char* addr = env("MASTER_ADDR"), *port = env("MASTER_PORT");
             set(addr) && set(port)) {
    key = std::string(addr) + ":" + port;
  }
  if (key.empty()) return false;
  constexpr size_t kMaxKey = 256;  // the daemon refuses longer ones
  if (key.size() > kMaxKey) key.resize(kMaxKey);
  out->set_key(key);
  out->set_rank(number(env("RANK"), -1));
  out->set_local_rank(number(env("LOCAL_RANK"), -1));
  out->set_world_size(number(env("WORLD_SIZE"), 0));
  return true;
}

bool isLauncherOnly(const std::function<const char*(const char*)>& env) {
  const char* launcher = env("TIDEMARK_LAUNCHER");
  return launcher != nullptr && std::string(launcher) == "1" && !set(env("RANK"));
}

}  // namespace tidemark::agent
