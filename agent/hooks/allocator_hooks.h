#pragma once

#include <cstddef>

namespace tidemark::agent {

class Recorder;

// Looks up the allocator functions that the hooks forward to. Call once, early (ELF constructor,
// or the attach thread). Preloaded: the next definitions after the agent; attached (the agent
// loaded last, by dlopen): the definitions the process's libraries bound to.
void resolveRealAllocators(bool attached = false) noexcept;
// From now on the hooks report to recorder (they still forward every call either way).
void enableAllocatorHooks(Recorder* recorder) noexcept;

// The hooks themselves. Under LD_PRELOAD they are exported under the C library's names; after an
// attach the GOT patcher points the process's GOT entries at them.
namespace hooks {
int posixMemalign(void** out, size_t alignment, size_t size);
void* alignedAlloc(size_t alignment, size_t size);
void* memalign(size_t alignment, size_t size);
void* valloc(size_t size);
void free(void* ptr);
void* realloc(void* ptr, size_t size);
}  // namespace hooks

}  // namespace tidemark::agent
