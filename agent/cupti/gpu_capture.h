#pragma once

#include <cstdint>
#include <string>

namespace tidemark::agent {

class Recorder;
class Interner;

// The CUPTI session: subscribes, enables the allocation callbacks of the runtime and driver APIs
// (device memory recorded on the calling thread, at host time, under that thread's scopes:
// api_callbacks.h), enables the activity kinds tidemark decodes (concurrent
// kernels, memcpy, memset, MEMORY2, memory pools, NVTX markers, synchronization, external
// correlation), puts CUPTI's timestamps on CLOCK_MONOTONIC (its timestamp callback, so GPU and
// host events share one clock), and hands CUPTI fixed-size buffers from a capped pool. Completed
// buffers are queued and parsed on the capture's own thread (decoder → GPU recorder → rings),
// which also flushes CUPTI periodically; dropped records are read per buffer and counted. CUPTI
// is never called while the capture's lock is held.
//
// If another subscriber holds CUPTI (torch.profiler, Nsight), start() says so once and returns
// false: the host hooks and the adapter go on, and the other tool is left alone.
namespace gpu_capture {

struct Stats {
  uint64_t buffersCompleted = 0;
  uint64_t records = 0;         // decoded and recorded
  uint64_t recordsSkipped = 0;  // kinds not used
  uint64_t cuptiDropped = 0;    // what CUPTI reported it dropped
  uint64_t buffersRefused = 0;  // requests refused because the pool was exhausted
  // Records not recorded for want of memory (the job at its memory limit); reported with what
  // CUPTI dropped (GpuRecorder::recordDropped).
  uint64_t recordsLostNoMemory = 0;
};

// True if capturing. *why says why not otherwise.
bool start(Recorder& recorder, Interner& interner, int flushIntervalMs, std::string* why);
// Forces CUPTI to hand over what it holds and waits (at most timeoutMs) until it is recorded.
void flush(int timeoutMs);
// Disables the activity kinds, flushes, unsubscribes and stops the thread. Idempotent; start()
// may follow (`tidemark detach`, then `attach` again).
void stop(int timeoutMs);
// Stops the capture (as stop(timeoutMs)) when the process exits, while libcupti is still loaded.
// The agent's own exit handler comes too late for CUPTI where the agent was preloaded: registered
// before the C library registered the loader's finalizer, it runs inside it, after libcupti (loaded
// later) has torn itself down, and a CUPTI call there crashes the job at exit (seen on a GPU with
// torch 2). Registered after start(), from the process's main program, this handler runs first.
// Once per process; a forked child does not stop its parent's capture.
void stopAtExit(int timeoutMs);
bool running();
Stats stats();

constexpr size_t kBufferBytes = 4u << 20;
constexpr size_t kMaxBuffers = 16;  // 64 MiB at most

}  // namespace gpu_capture
}  // namespace tidemark::agent
