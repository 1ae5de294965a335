#include "src/inject/attach.h"

#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "src/inject/elf_file.h"
#include "src/inject/proc_maps.h"
#include "src/inject/tracee.h"
#include "tidemark/attach_status.h"

namespace tidemark::inject {

namespace {

namespace fs = std::filesystem;

absl::Status checkProcess(pid_t pid) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("not a process id: ", pid));
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::error_code ec;
  if (!fs::exists(absl::StrCat("/proc/", pid), ec))
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  // The program it runs: its architecture decides.
  auto exe = ElfFile::readHeader(absl::StrCat("/proc/", pid, "/exe"));
  if (!exe.ok()) {
    if (access(absl::StrCat("/proc/", pid, "/exe").c_str(), R_OK) != 0 && errno == EACCES)
      return absl::PermissionDeniedError(absl::StrCat(
          "not permitted to trace process ", pid,
          ": run tidemark as the process's user or as root, or give it CAP_SYS_PTRACE"));
    if (!fs::exists(absl::StrCat("/proc/", pid), ec))
      return absl::NotFoundError(absl::StrCat("no process ", pid));
    return absl::FailedPreconditionError(
        absl::StrCat("process ", pid, ": cannot read its program (", exe.status().message(), ")"));
  }
  return checkSupported(*exe);
}

// A file as the target sees it (its mount namespace).
std::string targetPath(pid_t pid, const std::string& path) {
  const std::string viaRoot = absl::StrCat("/proc/", pid, "/root", path);
  std::error_code ec;
  return fs::exists(viaRoot, ec) ? viaRoot : path;
}

// The address of `symbol` of the object mapped from `suffix` in the target.
absl::StatusOr<uint64_t> remoteSymbol(pid_t pid, const std::vector<Mapping>& maps,
                                      const std::string& suffix, const std::string& symbol) {
  const auto object = findObject(maps, suffix);
  if (!object) return absl::NotFoundError(absl::StrCat(suffix, " is not loaded"));
  auto elf = ElfFile::read(targetPath(pid, object->path));
  if (!elf.ok()) return elf.status();
  const auto value = elf->symbol(symbol);
  if (!value) return absl::NotFoundError(absl::StrCat(object->path, " has no symbol ", symbol));
  const uint64_t bias = object->begin - (elf->firstLoadAddress() & ~uint64_t{0xfff});
  return bias + *value;
}

// The agent's status, read from outside at its address in the target.
absl::StatusOr<tidemark_attach_status_t> readStatusAt(pid_t pid, uint64_t at) {
  tidemark_attach_status_t s{};
  if (absl::Status r = readMemory(pid, at, &s, sizeof s); !r.ok()) {
    if (r.code() != absl::StatusCode::kNotFound) return r;
    // ESRCH: gone, a zombie, or still running with its memory briefly out of reach (the kernel
    // says ESRCH while it cannot take the process's memory map): only a process that is gone or
    // a zombie has exited; anything else is a transient failure, which the callers retry.
    if (kill(pid, 0) != 0 && errno == ESRCH)
      return absl::AbortedError(absl::StrCat("process ", pid, " exited"));
    const std::string state = statusField(pid, "State");
    if (state.rfind("Z", 0) == 0 || state.rfind("X", 0) == 0)
      return absl::AbortedError(absl::StrCat("process ", pid, " exited (state ", state, ")"));
    return absl::UnavailableError(absl::StrCat("process ", pid, " (state ",
                                               state.empty() ? "unknown" : state,
                                               "): its memory could not be read"));
  }
  s.message[sizeof s.message - 1] = '\0';
  return s;
}

// How long a read of the agent's status is retried while the process's memory is out of reach.
constexpr std::chrono::milliseconds kUnreadableWait{2000};

// readStatusAt, retried a moment while the memory is briefly out of reach.
absl::StatusOr<tidemark_attach_status_t> readStatusSoon(pid_t pid, uint64_t at) {
  const auto deadline = std::chrono::steady_clock::now() + kUnreadableWait;
  for (;;) {
    auto s = readStatusAt(pid, at);
    if (s.ok() || s.status().code() != absl::StatusCode::kUnavailable ||
        std::chrono::steady_clock::now() >= deadline)
      return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::StatusOr<tidemark_attach_status_t> readStatus(pid_t pid, const std::vector<Mapping>& maps,
                                                    const std::string& agentPath) {
  auto at = remoteSymbol(pid, maps, agentPath, "tidemark_attach_status");
  if (!at.ok()) return at.status();
  return readStatusSoon(pid, *at);
}

AttachReport reportOf(const tidemark_attach_status_t& s) {
  AttachReport r;
  r.sessionId = s.session_id;
  r.python = s.python != 0;
  r.patchedEntries = s.patched_entries;
  r.message = s.message;
  return r;
}

// Waits until the agent's state is `done` (or FAILED), reading its status (at `statusAt`, which
// does not move while the agent is loaded) from outside.
absl::StatusOr<tidemark_attach_status_t> awaitState(pid_t pid, uint64_t statusAt,
                                                    uint32_t generation, int32_t done,
                                                    int timeoutMs) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    auto s = readStatusAt(pid, statusAt);
    if (!s.ok() && s.status().code() == absl::StatusCode::kUnavailable &&
        std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!s.ok()) return s.status();
    if (s->generation != generation && (s->state == done || s->state == TIDEMARK_ATTACH_FAILED))
      return *s;
    if (std::chrono::steady_clock::now() > deadline)
      return absl::DeadlineExceededError(absl::StrCat(
          "the agent in process ", pid, " did not finish within ", timeoutMs / 1000, " s (state ",
          s->state, ")", s->message[0] ? absl::StrCat(": ", s->message) : ""));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// How long an attach waits for a preloaded agent mapped in a starting process to mark itself.
constexpr std::chrono::milliseconds kPreloadMarkWait{2000};

std::string alreadyMessage(pid_t pid, const tidemark_attach_status_t& s) {
  if (s.state == TIDEMARK_ATTACH_PRELOADED)
    return absl::StrCat("process ", pid, " runs under `tidemark run` and is recorded already");
  return absl::StrCat("process ", pid, " is already attached",
                      s.session_id ? absl::StrCat(" (session ", s.session_id, ")") : "",
                      "; `tidemark detach ", pid, "` first");
}

}  // namespace

absl::StatusOr<AttachReport> attachAgent(pid_t pid, const AttachOptions& options) {
  if (absl::Status s = checkProcess(pid); !s.ok()) return s;
  auto maps = readMaps(pid);
  if (!maps.ok()) return maps.status();
  bool loaded = findObject(*maps, options.agentPath).has_value();
  uint32_t generation = 0;
  if (loaded) {
    auto status = readStatus(pid, *maps, options.agentPath);
    // Mapped and never attached: a process in its start, whose preloaded agent (`tidemark run`)
    // is still to mark itself (the loader maps it before its constructor runs). Stopping it
    // there and calling into the agent would race its constructor: wait for the mark a moment
    // (an agent loaded by other means, say a script's ctypes, stays unmarked: attached then).
    const auto startDeadline = std::chrono::steady_clock::now() + kPreloadMarkWait;
    while (status.ok() && status->state == TIDEMARK_ATTACH_NONE &&
           std::chrono::steady_clock::now() < startDeadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      status = readStatus(pid, *maps, options.agentPath);
    }
    if (!status.ok()) return status.status();
    const int32_t st = status->state;
    if (st != TIDEMARK_ATTACH_NONE && st != TIDEMARK_ATTACH_DORMANT && st != TIDEMARK_ATTACH_FAILED)
      return absl::AlreadyExistsError(alreadyMessage(pid, *status));
    generation = status->generation;
  }

  auto tracee = Tracee::stop(pid);
  if (!tracee.ok()) return tracee.status();
  Tracee& t = **tracee;
  if (!loaded) {
    // dlopen(agent, RTLD_NOW | RTLD_GLOBAL): global, so that ctypes finds the C ABI.
    auto dlopenAt = remoteSymbol(pid, t.maps(), "/libc.so.6", "dlopen");
    if (!dlopenAt.ok()) dlopenAt = remoteSymbol(pid, t.maps(), "/libdl.so.2", "dlopen");
    if (!dlopenAt.ok())
      return absl::FailedPreconditionError(absl::StrCat(
          "process ", pid, " has no dlopen in its C library (", dlopenAt.status().message(), ")"));
    auto path = t.pushData(options.agentPath);
    if (!path.ok()) return path.status();
    auto handle = t.call(*dlopenAt, {*path, static_cast<uint64_t>(RTLD_NOW | RTLD_GLOBAL)});
    if (!handle.ok()) return handle.status();
    if (*handle == 0) {
      std::string why = "dlopen failed";
      if (auto dlerrorAt = remoteSymbol(pid, t.maps(), "/libc.so.6", "dlerror"); dlerrorAt.ok())
        if (auto text = t.call(*dlerrorAt, {}); text.ok() && *text != 0)
          if (auto s = t.readString(*text, 400); s.ok()) why = *s;
      (void)t.release();
      return absl::FailedPreconditionError(
          absl::StrCat("process ", pid, " could not load the agent: ", why));
    }
    if (absl::Status s = t.refreshMaps(); !s.ok()) return s;
    if (!findObject(t.maps(), options.agentPath))
      return absl::InternalError("the agent is not mapped after dlopen");
  }
  auto entry = remoteSymbol(pid, t.maps(), options.agentPath, "tidemark_attach");
  if (!entry.ok()) return entry.status();
  const std::string config = absl::StrCat(
      "server=", options.server, "\ntoken=", options.token, "\ntls_ca=", options.tlsCa,
      "\ntls_cert=", options.tlsCert, "\ntls_key=", options.tlsKey, "\nname=", options.sessionName,
      "\npython=", options.pythonDir, "\nadapter=", options.adapter ? "1" : "0",
      "\nops=", options.ops ? "1" : "0", "\ncapture_steps=", options.captureSteps,
      "\ncapture_every=", options.captureEvery, "\ncapture_window=", options.captureWindow, "\n");
  auto configAt = t.pushData(config);
  if (!configAt.ok()) return configAt.status();
  auto statusAt = remoteSymbol(pid, t.maps(), options.agentPath, "tidemark_attach_status");
  if (!statusAt.ok()) return statusAt.status();
  auto rc = t.call(*entry, {*configAt});
  if (!rc.ok()) return rc.status();
  if (absl::Status s = t.release(); !s.ok()) return s;
  if (static_cast<int>(*rc) == 1) {
    auto status = readStatusSoon(pid, *statusAt);
    return absl::AlreadyExistsError(status.ok() ? alreadyMessage(pid, *status)
                                                : absl::StrCat("process ", pid, " is attached"));
  }
  auto done = awaitState(pid, *statusAt, generation, TIDEMARK_ATTACH_RECORDING, options.timeoutMs);
  if (!done.ok()) return done.status();
  if (done->state == TIDEMARK_ATTACH_FAILED)
    return absl::InternalError(
        absl::StrCat("the agent in process ", pid, " failed: ", done->message));
  AttachReport r = reportOf(*done);
  r.loadedNow = !loaded;
  return r;
}

absl::StatusOr<AttachReport> detachAgent(pid_t pid, const std::string& agentPath, int timeoutMs) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("not a process id: ", pid));
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  auto maps = readMaps(pid);
  if (!maps.ok()) return maps.status();
  if (!findObject(*maps, agentPath))
    return absl::FailedPreconditionError(
        absl::StrCat("process ", pid, " is not attached (the agent is not loaded in it)"));
  auto statusAt = remoteSymbol(pid, *maps, agentPath, "tidemark_attach_status");
  if (!statusAt.ok()) return statusAt.status();
  auto status = readStatusSoon(pid, *statusAt);
  if (!status.ok()) return status.status();
  if (status->state == TIDEMARK_ATTACH_PRELOADED)
    return absl::FailedPreconditionError(
        absl::StrCat("process ", pid, " runs under `tidemark run`: it records until it exits"));
  if (status->state != TIDEMARK_ATTACH_RECORDING)
    return absl::FailedPreconditionError(absl::StrCat("process ", pid, " is not attached"));
  const uint64_t session = status->session_id;
  auto tracee = Tracee::stop(pid);
  if (!tracee.ok()) return tracee.status();
  auto entry = remoteSymbol(pid, (*tracee)->maps(), agentPath, "tidemark_detach");
  if (!entry.ok()) return entry.status();
  auto rc = (*tracee)->call(*entry, {});
  if (!rc.ok()) return rc.status();
  if (absl::Status s = (*tracee)->release(); !s.ok()) return s;
  if (*rc != 0)
    return absl::FailedPreconditionError(absl::StrCat("process ", pid, " is not attached"));
  auto done = awaitState(pid, *statusAt, status->generation, TIDEMARK_ATTACH_DORMANT, timeoutMs);
  if (!done.ok()) return done.status();
  AttachReport r = reportOf(*done);
  r.sessionId = session;
  return r;
}

}  // namespace tidemark::inject
