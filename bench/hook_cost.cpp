// Allocation-heavy program for measuring the agent's per-event hook cost: it runs N rounds of
// posix_memalign + free (torch's CPU allocation pattern) and prints the time per pair. Run it
// with and without the agent preloaded (bench/run.sh does) and compare.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const long rounds = argc > 1 ? std::atol(argv[1]) : 2000000;
  const int live = 64;  // a few blocks kept alive, as tensors would be
  std::vector<void*> keep(live, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < rounds; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, 64 + static_cast<size_t>(i % 512) * 64) != 0) return 1;
    void*& slot = keep[static_cast<size_t>(i % live)];
    free(slot);
    slot = p;
  }
  for (void* p : keep) free(p);
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"rounds\": %ld, \"ns_per_alloc_free\": %.1f}\n", rounds, ns / rounds);
  return 0;
}
