// A native program that allocates and frees on every thread without pause, for attach and detach
// while it runs (tests/e2e/test_attach.py): 4 threads, each in a loop of posix_memalign and free
// of small blocks, until stdin closes. `free` is called through its address read from the GOT at
// each call (a GLOB_DAT entry, which the GOT patcher reaches after the PLT's posix_memalign entry
// in the same object), so an attach that patched the allocator before `free` would let blocks be
// allocated through the hook and freed around it. Prints "ready" once every thread runs, and the
// number of pairs made at the end.
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {
constexpr int kThreads = 4;
std::atomic<bool> g_stop{false};
std::atomic<int> g_running{0};
std::atomic<unsigned long long> g_pairs{0};

// free() by the address the GOT holds now (not one kept from before an attach).
void release(void* p) {
  void (*volatile f)(void*) = &free;
  f(p);
}

void churn(int thread) {
  g_running.fetch_add(1);
  unsigned long long pairs = 0;
  while (!g_stop.load(std::memory_order_relaxed)) {
    void* p = nullptr;
    const size_t size = 64 + static_cast<size_t>((thread * 97 + pairs * 16) % 960);
    if (posix_memalign(&p, 64, size) != 0) std::abort();
    std::memset(p, 1, 8);
    release(p);
    ++pairs;
  }
  g_pairs.fetch_add(pairs);
}
}  // namespace

int main() {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(churn, t);
  while (g_running.load() < kThreads) std::this_thread::yield();
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  g_stop = true;
  for (std::thread& t : threads) t.join();
  std::printf("%llu pairs\n", g_pairs.load());
  return 0;
}
