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
// exactly: general registers, the FPU/SSE/AVX state, and the stack bytes the calls' arguments
// used. Signals that arrive meanwhile are delivered after. No gdb.
class Tracee {
 public:
  ~Tracee();
  Tracee(Tracee&&) = delete;

  // PTRACE_SEIZE + PTRACE_INTERRUPT of the thread `tid` (the process's main thread when tid ==
  // pid), retried until it stops outside the C library's allocator and the dynamic linker.
  static absl::StatusOr<std::unique_ptr<Tracee>> stop(pid_t pid);

  // Calls fn(args...) (at most 6 integer arguments) on the stopped thread; its return value.
  absl::StatusOr<uint64_t> call(uint64_t fn, const std::vector<uint64_t>& args);
  // Copies bytes onto the thread's stack, below the red zone; their address in the target.
  absl::StatusOr<uint64_t> pushData(const std::string& bytes);
  absl::StatusOr<std::string> readString(uint64_t address, size_t max);

  // Restores everything and lets the thread go. Called by the destructor if not before.
  absl::Status release();

  pid_t pid() const { return m_pid; }
  const std::vector<Mapping>& maps() const { return m_maps; }
  absl::Status refreshMaps();

 private:
  explicit Tracee(pid_t pid) : m_pid(pid) {}
  absl::Status waitStop(bool forCall, int* signalOut);
  absl::Status exitedError(int status) const;
  absl::Status saveState();

  pid_t m_pid;
  bool m_attached = false, m_saved = false, m_exited = false;
  bool m_legacyFp = false;     // no XSAVE: the FPU/SSE area only
  bool m_atCallFault = false;  // stopped at a call's return fault (a signal can replace it)
  user_regs_struct m_regs{};
  std::vector<uint8_t> m_xstate;
  std::vector<Mapping> m_maps;
  uint64_t m_dataTop = 0, m_dataUsed = 0;  // the argument area under the red zone
  std::string m_stackBytes;                // what it held before
  std::vector<int> m_pendingSignals;       // signals that arrived while it was ours
};

// Reads or writes the target's memory (process_vm_readv / writev).
absl::Status readMemory(pid_t pid, uint64_t address, void* out, size_t size);
absl::Status writeMemory(pid_t pid, uint64_t address, const void* data, size_t size);

}  // namespace tidemark::inject
