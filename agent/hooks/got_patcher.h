#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tidemark::agent {

// After an attach the agent cannot interpose by load order (it came last), so it points the
// GOT entries of the loaded objects at its hooks instead: for every object but the agent, the C
// library and the dynamic linker, the JUMP_SLOT and GLOB_DAT relocations naming a hooked
// allocator function. Read-only (RELRO) pages are made writable for the write and restored.
// restore() puts every patched entry back as it was.
class GotPatcher {
 public:
  struct Hook {
    const char* symbol;
    void* replacement;
  };
  struct Patch {
    uintptr_t slot;
    uintptr_t original;
  };

  // Patches every loaded object; returns the number of entries patched. Objects loaded later
  // are not patched. The entries are written object by object while the process runs: hooks
  // that must be in place before others (free before the allocators) go in an earlier call.
  // restore() undoes the calls in reverse order.
  size_t patchAll(const std::vector<Hook>& hooks);
  // Puts back what patchAll changed. Idempotent.
  void restore();
  const std::vector<Patch>& patches() const { return m_patches; }
  // The objects patched (their paths; "" for the main program), for the attach report.
  const std::vector<std::string>& objects() const { return m_objects; }

 private:
  std::vector<Patch> m_patches;
  std::vector<std::string> m_objects;
};

// The definition of `symbol` the process's libraries use, found in link-map order (so an
// allocator preloaded before the C library wins), skipping the main program (whose symbol may be
// a PLT entry that jumps through its own, patched, GOT) and the agent. nullptr if none.
void* firstDefinition(const char* symbol);

}  // namespace tidemark::agent
