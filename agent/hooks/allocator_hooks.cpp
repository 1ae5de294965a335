// Host allocator hooks, interposed under LD_PRELOAD. torch's CPU tensors come from
// posix_memalign(…, 64, n) and go back through free(); the aligned family is hooked, free and
// realloc act only on the blocks the aligned family returned (the block table knows them).
//
// Each hook is told the address it was called from (the exported definitions and the ones the GOT
// patcher points at each take their own return address): once a framework named its tensor
// allocator's library, an allocation from anywhere else is tagged a native library's
// (native_callers.h).
//
// Every hook forwards to the next definition in the lookup order (glibc's, or another
// interposer's). Until those are resolved (dlsym may itself allocate), glibc's __libc_* entry
// points stand in.
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "agent/hooks/allocator_hooks.h"
#include "agent/hooks/got_patcher.h"
#include "agent/hooks/native_callers.h"
#include "agent/recorder/recorder.h"

extern "C" {
void* __libc_memalign(size_t alignment, size_t size);
void __libc_free(void* ptr);
void* __libc_realloc(void* ptr, size_t size);
void* __libc_valloc(size_t size);
}

namespace tidemark::agent {
namespace {

using PosixMemalignFn = int (*)(void**, size_t, size_t);
using AlignedAllocFn = void* (*)(size_t, size_t);
using MemalignFn = void* (*)(size_t, size_t);
using VallocFn = void* (*)(size_t);
using FreeFn = void (*)(void*);
using ReallocFn = void* (*)(void*, size_t);

struct RealFunctions {
  PosixMemalignFn posixMemalign = nullptr;
  AlignedAllocFn alignedAlloc = nullptr;
  MemalignFn memalign = nullptr;
  VallocFn valloc = nullptr;
  FreeFn free = nullptr;
  ReallocFn realloc = nullptr;
};
RealFunctions g_real;
std::atomic<Recorder*> g_recorder{nullptr};

int bootstrapPosixMemalign(void** out, size_t alignment, size_t size) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

inline Recorder* activeRecorder() noexcept {
  Recorder* r = g_recorder.load(std::memory_order_relaxed);
  if (r == nullptr || t_recursionGuard || !r->recording()) return nullptr;
  return r;
}

inline void afterAlloc(void* p, size_t size, const void* caller) noexcept {
  if (p == nullptr) return;
  if (Recorder* r = activeRecorder()) {
    RecursionGuard guard;
    r->onAlloc(p, size, native_callers::nativeNameOf(reinterpret_cast<uint64_t>(p), caller));
  }
}

// The hooks' bodies, with the caller's address.
int posixMemalignFrom(const void* caller, void** out, size_t alignment, size_t size) {
  const int rc = g_real.posixMemalign ? g_real.posixMemalign(out, alignment, size)
                                      : bootstrapPosixMemalign(out, alignment, size);
  if (rc == 0) afterAlloc(*out, size, caller);
  return rc;
}

void* alignedAllocFrom(const void* caller, size_t alignment, size_t size) {
  void* p =
      g_real.alignedAlloc ? g_real.alignedAlloc(alignment, size) : __libc_memalign(alignment, size);
  afterAlloc(p, size, caller);
  return p;
}

void* memalignFrom(const void* caller, size_t alignment, size_t size) {
  void* p = g_real.memalign ? g_real.memalign(alignment, size) : __libc_memalign(alignment, size);
  afterAlloc(p, size, caller);
  return p;
}

void* vallocFrom(const void* caller, size_t size) {
  void* p = g_real.valloc ? g_real.valloc(size) : __libc_valloc(size);
  afterAlloc(p, size, caller);
  return p;
}

void* reallocFrom(const void* caller, void* ptr, size_t size) {
  Recorder* r = g_recorder.load(std::memory_order_relaxed);
  uint64_t oldSize = 0;
  bool tracked = false;
  if (ptr != nullptr && r != nullptr && !t_recursionGuard &&
      r->blocks().lookup(reinterpret_cast<uint64_t>(ptr), &oldSize)) {
    // A tracked block that is reallocated is freed, and a new block is born.
    RecursionGuard guard;
    tracked = r->onFree(ptr);
  }
  void* p = g_real.realloc ? g_real.realloc(ptr, size) : __libc_realloc(ptr, size);
  if (tracked) {
    if (p != nullptr && size != 0) {
      afterAlloc(p, size, caller);
    } else if (p == nullptr && size != 0) {
      afterAlloc(ptr, oldSize, caller);  // realloc failed: the old block lives on
    }
  }
  return p;
}

}  // namespace

void resolveRealAllocators(bool attached) noexcept {
  RecursionGuard guard;
  // Preloaded, the agent comes first: the real functions are the next definitions. Attached,
  // the agent comes last: the real functions are the definitions the process's libraries use.
  auto find = [attached](const char* name) {
    return attached ? firstDefinition(name) : dlsym(RTLD_NEXT, name);
  };
  g_real.posixMemalign = reinterpret_cast<PosixMemalignFn>(find("posix_memalign"));
  g_real.alignedAlloc = reinterpret_cast<AlignedAllocFn>(find("aligned_alloc"));
  g_real.memalign = reinterpret_cast<MemalignFn>(find("memalign"));
  g_real.valloc = reinterpret_cast<VallocFn>(find("valloc"));
  g_real.realloc = reinterpret_cast<ReallocFn>(find("realloc"));
  g_real.free = reinterpret_cast<FreeFn>(find("free"));
}

void enableAllocatorHooks(Recorder* recorder) noexcept {
  g_recorder.store(recorder, std::memory_order_release);
}

}  // namespace tidemark::agent

namespace tidemark::agent::hooks {

// Not inlined anywhere: each is entered through a GOT entry, and its return address is its caller.
__attribute__((noinline)) int posixMemalign(void** out, size_t alignment, size_t size) {
  return posixMemalignFrom(__builtin_return_address(0), out, alignment, size);
}

__attribute__((noinline)) void* alignedAlloc(size_t alignment, size_t size) {
  return alignedAllocFrom(__builtin_return_address(0), alignment, size);
}

__attribute__((noinline)) void* memalign(size_t alignment, size_t size) {
  return memalignFrom(__builtin_return_address(0), alignment, size);
}

__attribute__((noinline)) void* valloc(size_t size) {
  return vallocFrom(__builtin_return_address(0), size);
}

void free(void* ptr) {
  if (ptr != nullptr) {
    // The table is consulted even while not recording, and even on the agent's own threads
    // (which record no allocation, but may free a block another thread allocated), so that a
    // tracked block's free is never missed and the table never keeps stale entries.
    if (tidemark::agent::Recorder* r = g_recorder.load(std::memory_order_relaxed)) {
      const bool outer = t_recursionGuard;
      t_recursionGuard = true;
      r->onFree(ptr);
      t_recursionGuard = outer;
    }
  }
  if (g_real.free) {
    g_real.free(ptr);
  } else {
    __libc_free(ptr);
  }
}

__attribute__((noinline)) void* realloc(void* ptr, size_t size) {
  return reallocFrom(__builtin_return_address(0), ptr, size);
}

}  // namespace tidemark::agent::hooks

// The interposed definitions (LD_PRELOAD): the same functions under the C library's names, each
// with its own caller.
namespace agent = tidemark::agent;
extern "C" {
__attribute__((visibility("default"))) int posix_memalign(void** out, size_t alignment,
                                                          size_t size) {
  return agent::posixMemalignFrom(__builtin_return_address(0), out, alignment, size);
}
__attribute__((visibility("default"))) void* aligned_alloc(size_t alignment, size_t size) {
  return agent::alignedAllocFrom(__builtin_return_address(0), alignment, size);
}
__attribute__((visibility("default"))) void* memalign(size_t alignment, size_t size) {
  return agent::memalignFrom(__builtin_return_address(0), alignment, size);
}
__attribute__((visibility("default"))) void* valloc(size_t size) {
  return agent::vallocFrom(__builtin_return_address(0), size);
}
__attribute__((visibility("default"))) void free(void* ptr) { agent::hooks::free(ptr); }
__attribute__((visibility("default"))) void* realloc(void* ptr, size_t size) {
  return agent::reallocFrom(__builtin_return_address(0), ptr, size);
}
}  // extern "C"
