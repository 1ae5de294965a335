#pragma once

#include <cstdint>

namespace tidemark::agent {

class Interner;

// The Python call stacks of a training's allocations (`tidemark run --stacks`,
// TIDEMARK_STACKS=MIN_BYTES): each allocation of at least MIN_BYTES made on a thread that runs
// Python is followed by a Stack record naming the Python frames it was made under, innermost
// first, "function (file:line)" per line (the store's and `tidemark block`'s format).
//
// The agent links no Python: the interpreter's C API is looked up in the process (dlsym), and
// the adapter turns it on per thread (tidemark_python_stacks_here, with the GIL held). A C
// profile function (PyEval_SetProfile) then keeps a shadow of the thread's Python stack: a frame
// pushed at its call, popped at its return, and the line of the innermost frame refreshed at
// each call it makes (to Python or to C: torch's ops are C calls). An allocation hook reads only
// that shadow — never the interpreter's frames, and without the GIL (torch releases it inside
// its ops) — so a stack can be a few lines stale (arithmetic operators make no call event), but
// reading it can never touch freed memory.
namespace python_stacks {

// At the agent's load: stacks of allocations of at least minBytes (0: off), strings interned in
// interner.
void configure(uint64_t minBytes, Interner* interner) noexcept;
uint64_t minBytes() noexcept;

// For the calling thread, with the GIL held: follows its Python calls from now on (its frames
// so far included). Frames of code in files under hiddenPrefix (the adapter's package; the first
// call's counts) are left out of the stacks. 1 on; 0 not asked (TIDEMARK_STACKS unset); -1 the
// interpreter's functions are not in this process, or the GIL is not held.
int followThisThread(const char* hiddenPrefix) noexcept;

// The calling thread's Python stack as an interned string's id; 0 when it has none (not
// followed, no Python frame). Safe in an allocation hook: no GIL, no interpreter call.
uint32_t stackOfThisThread() noexcept;

}  // namespace python_stacks
}  // namespace tidemark::agent
