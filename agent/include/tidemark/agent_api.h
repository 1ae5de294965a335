/* The agent's C ABI: what the Python adapter (through ctypes) and any framework can call.
 * Every entry point is noexcept, never blocks for long, and is a no-op when the agent is not
 * loaded or not recording. Categories and phases use the numbers of tidemark.v1.Category and
 * tidemark.v1.Phase. */
#ifndef TIDEMARK_AGENT_API_H
#define TIDEMARK_AGENT_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDEMARK_ABI_VERSION 1

/* The ABI version this agent implements (TIDEMARK_ABI_VERSION). */
int tidemark_abi_version(void);
/* Starts the drain thread and the connection to tidemarkd (lazy start). 1 on success. */
int tidemark_agent_start(void);
/* Stops recording, sends everything and says goodbye (also done at exit). */
void tidemark_agent_stop(void);
/* 1 while the agent records. */
int tidemark_recording(void);
/* Waits up to timeout_ms until everything recorded so far is sent. 1 if it was. */
int tidemark_flush(int timeout_ms);
/* The server's id for this process's session, 0 while not connected. */
uint64_t tidemark_session_id(void);

/* A non-zero id for a name (module path, tensor name); the same name gives the same id. */
uint32_t tidemark_intern(const char* name);
void tidemark_scope_begin(uint32_t name_id);
void tidemark_scope_end(uint32_t name_id);
/* An op (e.g. "aten::mm") begins / ends: a scope of its own kind, beside the module scopes. */
void tidemark_op_begin(uint32_t name_id);
void tidemark_op_end(uint32_t name_id);
void tidemark_phase_begin(int phase);
void tidemark_phase_end(int phase);
void tidemark_step_begin(int64_t step);
void tidemark_step_end(int64_t step);
/* The block at address (the storage's data pointer) is a <category> named name_id. */
void tidemark_tag(uint64_t address, uint64_t size_bytes, int category, uint32_t name_id);

/* With TIDEMARK_STACKS=MIN_BYTES: the calling thread's Python stack is recorded with each of its
 * allocations of at least MIN_BYTES from now on, without the frames of code in files under
 * hidden_prefix (the adapter's own; NULL: none). Call with the GIL held (ctypes.PyDLL). 1 on, 0
 * not asked, -1 no Python interpreter's API in this process (or the GIL not held). */
int tidemark_python_stacks_here(const char* hidden_prefix);

/* The framework's tensor allocator lives in the loaded library whose file name starts with
 * library_prefix (torch: "libc10.so"). From now on a host allocation of the aligned family called
 * from anywhere else is a native library's own memory (oneDNN's caches, BLAS buffers): tagged
 * WORKSPACE, named "[native] <library>" after the object that called the allocator. 1 if the
 * library is loaded, 0 if not (nothing changes). */
int tidemark_tensor_allocator_library(const char* library_prefix);
/* A block allocated before `tidemark attach` (a parameter's storage, optimizer state): recorded
 * as allocated now, and tracked from here on like the blocks the hooks see. No-op for a block
 * already tracked. */
void tidemark_seed_block(uint64_t address, uint64_t size_bytes);
/* A framework's caching allocator handed out (size_delta > 0) or took back (size_delta < 0, the
 * block's size negated) the tensor block at address on device (-1: host memory), on the calling
 * thread, now. Recorded as memory of kind TENSOR, which the analysis places inside the device
 * memory (the segment) that holds it. total_reserved >= 0: what the allocator holds from that
 * device after the call (the counter "reserved_bytes", summed over devices); -1: not known.
 * torch's memory reporter (libtidemark_torch.so) calls it for torch's CUDA caching allocator. */
void tidemark_tensor_memory(uint64_t address, int64_t size_delta, int device,
                            int64_t total_reserved);
/* Counters, for tests and the adapter: recorded, sent, dropped (all kinds added up). */
void tidemark_counters(uint64_t* recorded, uint64_t* sent, uint64_t* dropped);
/* A hook or wrapper of the framework adapter failed (the job's call went on without it): counted,
 * and sent with the agent's counters (the session's stat "adapter_failures"). */
void tidemark_adapter_failed(void);

/* A recompute plan the server sent (`tidemark apply`), for the adapter to apply at its next step
 * boundary. Copies the plan's JSON, NUL-terminated, into buf and returns its length with
 * *plan_id set; returns 0 when no plan waits; when cap is too small, returns the size needed
 * (length + 1) and keeps the plan for the next call. */
int64_t tidemark_take_plan(char* buf, int64_t cap, uint64_t* plan_id);
/* What became of a plan: applied (1) from `step` on, or refused (0) with a message why. */
void tidemark_plan_result(uint64_t plan_id, int applied, const char* message, int64_t step);
/* The same for a plan the job applied itself (no plan id: the server knows it by its JSON and
 * its first step, `step`), so that plan-check measures it as it measures a plan it sent. */
void tidemark_job_plan_result(const char* plan_json, int applied, const char* message,
                              int64_t step);

#ifdef __cplusplus
}
#endif

#endif /* TIDEMARK_AGENT_API_H */
