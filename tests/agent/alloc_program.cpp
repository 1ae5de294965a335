// A program with a known allocation history, run under the agent by tests/e2e/test_agent_hooks.py:
// every hooked function is used, plain malloc/free (not tracked) is mixed in, some blocks stay
// live, and a second thread allocates and frees. It prints what the agent must have seen as JSON.
#include <malloc.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

int main() {
  std::vector<void*> blocks;
  long long liveBytes = 0;
  int allocs = 0;
  auto keep = [&](void* p, size_t n) {
    if (p == nullptr) std::exit(2);
    std::memset(p, 1, n);
    blocks.push_back(p);
    ++allocs;
  };
  for (int i = 0; i < 10; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, 1000 + i) != 0) return 2;
    keep(p, 1000 + i);
  }
  for (int i = 0; i < 5; ++i) keep(aligned_alloc(64, 128 * (i + 1)), 128 * (i + 1));
  for (int i = 0; i < 3; ++i) keep(memalign(32, 333), 333);
  for (int i = 0; i < 2; ++i) keep(valloc(5000), 5000);
  // Untracked traffic: the agent must ignore it.
  for (int i = 0; i < 1000; ++i) free(malloc(static_cast<size_t>(i) + 1));
  // realloc of a tracked block: its free and a new block.
  blocks[0] = realloc(blocks[0], 100000);
  ++allocs;
  // Another thread allocates and frees.
  std::thread([&] {
    for (int i = 0; i < 50; ++i) {
      void* p = nullptr;
      if (posix_memalign(&p, 64, 256) == 0) free(p);
    }
  }).join();
  allocs += 50;
  // Free all but the last four (a valloc, two memaligns and one more), which stay live.
  const size_t live = 4;
  for (size_t i = 0; i + live < blocks.size(); ++i) free(blocks[i]);
  liveBytes = 333 + 333 + 5000 + 5000;
  std::printf("{\"blocks\": %d, \"live\": %zu, \"live_bytes\": %lld}\n", allocs, live, liveBytes);
  return 0;
}
