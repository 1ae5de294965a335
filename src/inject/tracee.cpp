#include "src/inject/tracee.h"

#include <elf.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tidemark::inject {

namespace {

constexpr uint64_t kScratchBytes = 1 << 20;  // the calls' stack and their arguments
constexpr uint64_t kDataArea = 8192;         // arguments (paths, configuration), at its top
constexpr int kSafePointTries = 2000;

std::string errnoText() { return std::strerror(errno); }

// A thread inside these may hold the allocator's or the loader's locks: not a point to call
// dlopen from.
const std::vector<std::string> kUnsafeCode = {"/libc.so", "/ld-linux", "/libc-"};

// Syscalls the allocator makes while holding its lock.
bool allocatorSyscall(int64_t nr) {
  return nr == SYS_mmap || nr == SYS_munmap || nr == SYS_mremap || nr == SYS_brk ||
         nr == SYS_madvise || nr == SYS_mprotect;
}

std::string ptraceScopeAdvice() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  std::string advice =
      "run tidemark as the process's user or as root, or give it CAP_SYS_PTRACE "
      "(setcap cap_sys_ptrace+ep $(which tidemark))";
  if (in >> scope && scope > 0)
    advice += absl::StrCat("; Yama's ptrace_scope is ", scope,
                           scope >= 3 ? " (no attaching at all until reboot)"
                                      : ", which allows tracing only descendants: set it to 0 with "
                                        "`sysctl kernel.yama.ptrace_scope=0`");
  return advice;
}

}  // namespace

std::string statusField(pid_t pid, const std::string& name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key, value;
  while (in >> key) {
    std::getline(in >> std::ws, value);
    if (key == name + ":") return value;
  }
  return {};
}

absl::Status readMemory(pid_t pid, uint64_t address, void* out, size_t size) {
  iovec local{out, size};
  iovec remote{reinterpret_cast<void*>(address), size};
  const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(size)) return absl::OkStatus();
  if (n >= 0)  // errno is not set for a short read
    return absl::InternalError(absl::StrCat("reading process ", pid, ": ", n, " of ", size,
                                            " bytes at 0x", absl::Hex(address)));
  if (errno == EPERM || errno == EACCES)
    return absl::PermissionDeniedError(absl::StrCat("not permitted to read process ", pid));
  if (errno == ESRCH) return absl::NotFoundError(absl::StrCat("no process ", pid));
  return absl::InternalError(absl::StrCat("reading process ", pid, ": ", errnoText()));
}

absl::Status writeMemory(pid_t pid, uint64_t address, const void* data, size_t size) {
  iovec local{const_cast<void*>(data), size};
  iovec remote{reinterpret_cast<void*>(address), size};
  if (process_vm_writev(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(size))
    return absl::OkStatus();
  return absl::InternalError(absl::StrCat("writing process ", pid, ": ", errnoText()));
}

absl::Status Tracee::exitedError(int status) const {
  if (WIFEXITED(status))
    return absl::AbortedError(absl::StrCat("process ", m_pid, " exited during the attach (status ",
                                           WEXITSTATUS(status), ")"));
  return absl::AbortedError(absl::StrCat("process ", m_pid, " was killed during the attach (",
                                         strsignal(WTERMSIG(status)), ")"));
}

// Waits for the thread's next stop of the kind awaited: the PTRACE_EVENT_STOP of an interrupt
// (a signal-delivery stop that comes first does too), the SIGSEGV of a call's return to address
// 0, or the SIGTRAP of a single step. Other signals are held back and delivered when the thread
// is let go; the thread is resumed (continued, or stepped again) past them.
absl::Status Tracee::waitStop(Awaited awaited) {
  const auto resume = [&] {
    ptrace(awaited == Awaited::kStep ? PTRACE_SINGLESTEP : PTRACE_CONT, m_pid, nullptr, nullptr);
  };
  for (;;) {
    int status = 0;
    if (waitpid(m_pid, &status, __WALL) < 0) {
      if (errno == EINTR) continue;
      m_exited = errno == ECHILD;
      return absl::AbortedError(absl::StrCat("process ", m_pid, " went away during the attach"));
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      m_exited = true;
      m_attached = false;
      return exitedError(status);
    }
    if (!WIFSTOPPED(status)) continue;
    const int sig = WSTOPSIG(status);
    if ((status >> 16) == PTRACE_EVENT_STOP) {
      if (awaited == Awaited::kInterrupt && (sig == SIGTRAP || sig == SIGSTOP))
        return absl::OkStatus();
      resume();  // a group stop while ours: the job is stopped by someone else
      continue;
    }
    if ((awaited == Awaited::kCallFault && sig == SIGSEGV) ||
        (awaited == Awaited::kStep && sig == SIGTRAP))
      return absl::OkStatus();
    m_pendingSignals.push_back(sig);
    if (awaited == Awaited::kInterrupt) return absl::OkStatus();  // a signal stop is a stop too
    resume();
  }
}

absl::StatusOr<std::unique_ptr<Tracee>> Tracee::stop(pid_t pid) {
  std::unique_ptr<Tracee> t(new Tracee(pid));
  if (ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) != 0) {
    const std::string why = errnoText();
    if (errno == ESRCH) return absl::NotFoundError(absl::StrCat("no process ", pid));
    if (errno == EPERM) {
      if (statusField(pid, "State").rfind("Z", 0) == 0 || statusField(pid, "State").empty())
        return absl::AbortedError(absl::StrCat("process ", pid, " has exited"));
      if (const int tracer = std::atoi(statusField(pid, "TracerPid").c_str()); tracer > 0)
        return absl::AlreadyExistsError(absl::StrCat("process ", pid, " is traced by process ",
                                                     tracer,
                                                     " (a debugger?); one tracer at a time"));
      return absl::PermissionDeniedError(absl::StrCat("not permitted to trace process ", pid, " (",
                                                      why, "): ", ptraceScopeAdvice()));
    }
    return absl::InternalError(absl::StrCat("ptrace(SEIZE, ", pid, "): ", errnoText()));
  }
  t->m_attached = true;
  for (int attempt = 0;; ++attempt) {
    if (ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr) != 0)
      return absl::InternalError(absl::StrCat("ptrace(INTERRUPT): ", errnoText()));
    if (absl::Status s = t->waitStop(Awaited::kInterrupt); !s.ok()) return s;
    if (absl::Status s = t->refreshMaps(); !s.ok()) return s;
    user_regs_struct regs{};
    if (ptrace(PTRACE_GETREGS, pid, nullptr, &regs) != 0)
      return absl::InternalError(absl::StrCat("ptrace(GETREGS): ", errnoText()));
    const auto nr = static_cast<int64_t>(regs.orig_rax);
    const bool inSyscall = nr >= 0;
    const bool safe =
        !inCodeOf(t->m_maps, regs.rip, kUnsafeCode) || (inSyscall && !allocatorSyscall(nr));
    if (safe) break;
    if (attempt >= kSafePointTries)
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid,
                       " never stopped outside the C library's allocator and the "
                       "dynamic linker in ",
                       kSafePointTries, " tries; it is untouched, try again"));
    // Let it run a little and look again.
    const int deliver = t->m_pendingSignals.empty() ? 0 : t->m_pendingSignals.back();
    if (deliver != 0) t->m_pendingSignals.pop_back();
    ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(deliver)));
    std::this_thread::sleep_for(std::chrono::microseconds(attempt < 100 ? 200 : 2000));
  }
  if (absl::Status s = t->saveState(); !s.ok()) return s;
  return t;
}

absl::Status Tracee::refreshMaps() {
  auto maps = readMaps(m_pid);
  if (!maps.ok()) return maps.status();
  m_maps = std::move(*maps);
  return absl::OkStatus();
}

absl::Status Tracee::saveState() {
  if (ptrace(PTRACE_GETREGS, m_pid, nullptr, &m_regs) != 0)
    return absl::InternalError(absl::StrCat("ptrace(GETREGS): ", errnoText()));
  m_xstate.assign(64 * 1024, 0);
  iovec io{m_xstate.data(), m_xstate.size()};
  if (ptrace(PTRACE_GETREGSET, m_pid, reinterpret_cast<void*>(NT_X86_XSTATE), &io) == 0) {
    m_xstate.resize(io.iov_len);
  } else {
    // No XSAVE: the legacy FPU/SSE area.
    m_xstate.resize(sizeof(user_fpregs_struct));
    if (ptrace(PTRACE_GETFPREGS, m_pid, nullptr, m_xstate.data()) != 0)
      return absl::InternalError(absl::StrCat("ptrace(GETFPREGS): ", errnoText()));
    m_legacyFp = true;
  }
  m_saved = true;
  // A `syscall` instruction (0f 05) in the C library's code, to run mmap and munmap with.
  for (const Mapping& m : m_maps) {
    if (!m.executable() || m.path.find("/libc.so") == std::string::npos) continue;
    std::string code(std::min<uint64_t>(m.end - m.begin, 1 << 20), '\0');
    if (!readMemory(m_pid, m.begin, code.data(), code.size()).ok()) continue;
    const size_t at = code.find("\x0f\x05");
    if (at != std::string::npos) {
      m_syscallInsn = m.begin + at;
      break;
    }
  }
  if (m_syscallInsn == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("process ", m_pid, " has no C library code to run a system call with"));
  auto scratch = systemCall(SYS_mmap, {0, kScratchBytes, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, static_cast<uint64_t>(-1), 0});
  if (!scratch.ok()) return scratch.status();
  if (*scratch > static_cast<uint64_t>(-4096))
    return absl::InternalError(absl::StrCat(
        "mmap in process ", m_pid, " failed: ", std::strerror(static_cast<int>(-*scratch))));
  m_scratch = *scratch;
  m_dataTop = m_scratch + kScratchBytes;
  m_saved = true;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Tracee::pushData(const std::string& bytes) {
  const uint64_t size = (bytes.size() + 1 + 15) & ~uint64_t{15};
  if (m_dataUsed + size > kDataArea) return absl::ResourceExhaustedError("argument area full");
  m_dataUsed += size;
  const uint64_t at = m_dataTop - m_dataUsed;
  std::string z = bytes;
  z.push_back('\0');
  if (absl::Status s = writeMemory(m_pid, at, z.data(), z.size()); !s.ok()) return s;
  return at;
}

absl::StatusOr<std::string> Tracee::readString(uint64_t address, size_t max) {
  std::string out;
  char c = 0;
  while (out.size() < max) {
    if (absl::Status s = readMemory(m_pid, address + out.size(), &c, 1); !s.ok()) return s;
    if (c == '\0') break;
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<uint64_t> Tracee::systemCall(uint64_t nr, const std::vector<uint64_t>& args) {
  user_regs_struct r = m_regs;
  r.rip = m_syscallInsn;
  r.rax = nr;
  r.orig_rax = static_cast<uint64_t>(-1);
  unsigned long long* regs[] = {&r.rdi, &r.rsi, &r.rdx, &r.r10, &r.r8, &r.r9};
  for (size_t i = 0; i < args.size() && i < 6; ++i) *regs[i] = args[i];
  if (ptrace(PTRACE_SETREGS, m_pid, nullptr, &r) != 0)
    return absl::InternalError(absl::StrCat("ptrace(SETREGS): ", errnoText()));
  if (ptrace(PTRACE_SINGLESTEP, m_pid, nullptr, nullptr) != 0)
    return absl::InternalError(absl::StrCat("ptrace(SINGLESTEP): ", errnoText()));
  if (absl::Status s = waitStop(Awaited::kStep); !s.ok()) return s;
  m_atSignalStop = true;
  user_regs_struct after{};
  if (ptrace(PTRACE_GETREGS, m_pid, nullptr, &after) != 0)
    return absl::InternalError(absl::StrCat("ptrace(GETREGS): ", errnoText()));
  return after.rax;
}

absl::StatusOr<uint64_t> Tracee::call(uint64_t fn, const std::vector<uint64_t>& args) {
  if (!m_saved) return absl::FailedPreconditionError("the thread is not stopped");
  if (args.size() > 6) return absl::InvalidArgumentError("at most 6 arguments");
  user_regs_struct r = m_regs;
  // The call's stack is the scratch mapping under the argument area, 16-byte aligned before the
  // return address (0: returning faults, and the fault stops the thread again here).
  const uint64_t top = (m_dataTop - kDataArea - 64) & ~uint64_t{15};
  const uint64_t zero = 0;
  if (absl::Status s = writeMemory(m_pid, top - 8, &zero, sizeof zero); !s.ok()) return s;
  r.rsp = top - 8;
  r.rip = fn;
  r.rax = 0;
  r.orig_rax = static_cast<uint64_t>(-1);  // no syscall restart for the call
  unsigned long long* regs[] = {&r.rdi, &r.rsi, &r.rdx, &r.rcx, &r.r8, &r.r9};
  for (size_t i = 0; i < args.size(); ++i) *regs[i] = args[i];
  if (ptrace(PTRACE_SETREGS, m_pid, nullptr, &r) != 0)
    return absl::InternalError(absl::StrCat("ptrace(SETREGS): ", errnoText()));
  if (ptrace(PTRACE_CONT, m_pid, nullptr, nullptr) != 0)
    return absl::InternalError(absl::StrCat("ptrace(CONT): ", errnoText()));
  if (absl::Status s = waitStop(Awaited::kCallFault); !s.ok()) return s;
  user_regs_struct after{};
  if (ptrace(PTRACE_GETREGS, m_pid, nullptr, &after) != 0)
    return absl::InternalError(absl::StrCat("ptrace(GETREGS): ", errnoText()));
  m_atSignalStop = true;
  if (after.rip != 0)
    return absl::InternalError(
        absl::StrCat("the call into process ", m_pid, " faulted at 0x", absl::Hex(after.rip),
                     " (the fault is not delivered; the thread goes back to where it was)"));
  return after.rax;
}

absl::Status Tracee::release() {
  if (!m_attached) return absl::OkStatus();
  absl::Status result = absl::OkStatus();
  if (m_saved) {
    // The scratch mapping goes; the extended state and the registers are put back as they were.
    if (m_scratch != 0) {
      if (auto r = systemCall(SYS_munmap, {m_scratch, kScratchBytes}); !r.ok()) result = r.status();
      m_scratch = 0;
    }
    if (m_legacyFp) {
      if (ptrace(PTRACE_SETFPREGS, m_pid, nullptr, m_xstate.data()) != 0)
        result = absl::InternalError(absl::StrCat("ptrace(SETFPREGS): ", errnoText()));
    } else {
      iovec io{m_xstate.data(), m_xstate.size()};
      if (ptrace(PTRACE_SETREGSET, m_pid, reinterpret_cast<void*>(NT_X86_XSTATE), &io) != 0)
        result = absl::InternalError(absl::StrCat("ptrace(SETREGSET): ", errnoText()));
    }
    if (ptrace(PTRACE_SETREGS, m_pid, nullptr, &m_regs) != 0)
      result = absl::InternalError(absl::StrCat("ptrace(SETREGS): ", errnoText()));
    m_saved = false;
  }
  // Detaching from a call's fault stop delivers the signal given in its place (or none); from
  // any other stop the held signals are raised again.
  int deliver = 0;
  if (m_atSignalStop && !m_pendingSignals.empty()) {
    deliver = m_pendingSignals.front();
    m_pendingSignals.erase(m_pendingSignals.begin());
  }
  ptrace(PTRACE_DETACH, m_pid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(deliver)));
  for (int sig : m_pendingSignals) syscall(SYS_tgkill, m_pid, m_pid, sig);
  m_pendingSignals.clear();
  m_attached = false;
  return result;
}

Tracee::~Tracee() {
  if (m_attached && !m_exited) (void)release();
}

}  // namespace tidemark::inject
