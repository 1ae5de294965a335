#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace tidemark::agent::native_callers {

// Whose host allocation this is, told by the address it was called from. A framework names the
// library its tensor allocator lives in (torch: libc10, whose c10::alloc_cpu calls
// posix_memalign for every CPU tensor). From then on an aligned allocation called from inside
// that library is a tensor's, and one called from anywhere else is memory a native library
// keeps for itself (oneDNN's primitive caches and scratchpads, BLAS buffers): the hooks tag it
// WORKSPACE, named "[native] <the library it came from>". Until a framework names one (and in
// processes with no framework) nothing is told apart and no tag is made.

// Finds the loaded object whose file name starts with libraryPrefix and, if there is one,
// publishes its executable ranges and those of every object loaded now, each with its name
// interned by intern ("[native] libtorch_cpu.so"). Objects loaded later are named
// "[native] (a library loaded later)". Then earlyBlock(address, name) is called for each address
// whose last allocation before now (among the first kEarlyCallers recorded) came from a native
// library: the caller checks that the block is still live and tags it (the static initializers of
// libtorch_cpu allocate while it is loaded, before any framework code can name its allocator).
// True if the library was found. Call outside the hooks (it allocates); any thread; again to
// refresh the objects' list.
bool identifyTensorAllocator(std::string_view libraryPrefix,
                             const std::function<uint32_t(std::string_view)>& intern,
                             const std::function<void(uint64_t, uint32_t)>& earlyBlock);

// For a recorded allocation at address from caller: 0 when caller lies inside the tensor
// allocator's library, or when none is identified yet (then the caller is noted, while the early
// log has room); else the interned name of the object holding caller. Wait-free; safe inside the
// allocator hooks.
uint32_t nativeNameOf(uint64_t address, const void* caller) noexcept;

// How many allocations' callers are noted before identification; past that, none is (and no
// early block is tagged: a later allocation at a noted address could not be told from it).
inline constexpr uint32_t kEarlyCallers = 32768;

// Forgets the identification (tests).
void reset() noexcept;

}  // namespace tidemark::agent::native_callers
