#pragma once

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/inject/proc_maps.h"

namespace tidemark::inject {

// One thread of another process under ptrace (x86-64 Linux), stopped at a point where it may
// call into the C library, made to call functions in its own address space, and restored
// exactly: general registers and the FPU/SSE/AVX state. The calls run on a scratch mapping made
// for them (by an injected mmap system call) and removed after, so the thread's own stack is
// not touched. Signals that arrive meanwhile are delivered after. No gdb.
class Tracee {
 public:
  ~Tracee();
  Tracee(Tracee&&) = delete;

  // PTRACE_SEIZE + PTRACE_INTERRUPT of the thread `tid` (the process's main thread when tid ==
  // pid), retried until it stops outside the C library's allocator and the dynamic linker.
  static absl::StatusOr<std::unique_ptr<Tracee>> stop(pid_t pid);

  // Calls fn(args...) (at most 6 integer arguments) on the stopped thread; its return value.
  absl::StatusOr<uint64_t> call(uint64_t fn, const std::vector<uint64_t>& args);
  // Copies bytes into the scratch mapping; their address in the target.
  absl::StatusOr<uint64_t> pushData(const std::string& bytes);
  absl::StatusOr<std::string> readString(uint64_t address, size_t max);

  // Restores everything and lets the thread go. Called by the destructor if not before.
  absl::Status release();

  pid_t pid() const { return m_pid; }
  const std::vector<Mapping>& maps() const { return m_maps; }
  absl::Status refreshMaps();

 private:
  explicit Tracee(pid_t pid) : m_pid(pid) {}
  enum class Awaited { kInterrupt, kCallFault, kStep };
  absl::Status waitStop(Awaited awaited);
  absl::Status exitedError(int status) const;
  absl::Status saveState();
  // Runs one system call on the thread (a `syscall` instruction of its C library, single-stepped).
  absl::StatusOr<uint64_t> systemCall(uint64_t nr, const std::vector<uint64_t>& args);

  pid_t m_pid;
  bool m_attached = false, m_saved = false, m_exited = false;
  bool m_legacyFp = false;      // no XSAVE: the FPU/SSE area only
  bool m_atSignalStop = false;  // stopped at a signal (a call's fault, a step's trap): a signal
                                // given at detach replaces it
  user_regs_struct m_regs{};
  std::vector<uint8_t> m_xstate;
  std::vector<Mapping> m_maps;
  uint64_t m_syscallInsn = 0;              // a `syscall` instruction in the C library
  uint64_t m_scratch = 0;                  // the scratch mapping (0: none yet)
  uint64_t m_dataTop = 0, m_dataUsed = 0;  // the argument area at its top
  std::vector<int> m_pendingSignals;       // signals that arrived while it was ours
};

// Reads or writes the target's memory (process_vm_readv / writev).
absl::Status readMemory(pid_t pid, uint64_t address, void* out, size_t size);
absl::Status writeMemory(pid_t pid, uint64_t address, const void* data, size_t size);
// A field of /proc/PID/status ("" if absent or the process is gone).
std::string statusField(pid_t pid, const std::string& name);

}  // namespace tidemark::inject
