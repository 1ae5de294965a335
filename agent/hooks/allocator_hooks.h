#pragma once

namespace tidemark::agent {

class Recorder;

// Looks up the allocator functions that the hooks forward to. Call once, early (ELF constructor).
void resolveRealAllocators() noexcept;
// From now on the hooks report to recorder (they still forward every call either way).
void enableAllocatorHooks(Recorder* recorder) noexcept;

}  // namespace tidemark::agent
