// A native program that allocates in bursts faster than any drain: 8 threads, each allocating a
// burst of aligned blocks (posix_memalign, as torch's CPU allocator does) and freeing them, in
// rounds held together by barriers, so that its peak of live bytes is known exactly: at the end of
// each round's allocation phase every thread's burst is live and nothing of the round is freed.
// Each thread also keeps one block per round until the end. Prints what it did as JSON.
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {
constexpr int kThreads = 8;
constexpr int kRounds = 4;

pthread_barrier_t g_barrier;

// Deterministic sizes: 64..1088 bytes, different per thread, round and index.
size_t sizeOf(int thread, int round, int i) {
  return 64 + static_cast<size_t>((thread * 131 + round * 977 + i * 37) % 1025);
}

struct ThreadResult {
  uint64_t allocs = 0;
  uint64_t roundBytes[kRounds] = {};
  uint64_t keptBytes = 0;
  std::vector<void*> kept;
  double cpuSeconds = 0;  // the thread's own processor time (what a recorder's hooks add to it)
};

void worker(int thread, int perBurst, ThreadResult* out) {
  std::vector<void*> blocks(static_cast<size_t>(perBurst));
  for (int round = 0; round < kRounds; ++round) {
    // Rounds grow, so the last one's allocation phase is the peak.
    const int n = perBurst * (round + 2) / (kRounds + 1);
    uint64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      const size_t size = sizeOf(thread, round, i);
      if (posix_memalign(&blocks[static_cast<size_t>(i)], 64, size) != 0) std::abort();
      bytes += size;
    }
    out->allocs += static_cast<uint64_t>(n);
    out->roundBytes[round] = bytes;
    pthread_barrier_wait(&g_barrier);  // every thread's burst is live here
    pthread_barrier_wait(&g_barrier);
    // All freed but the first, which stays live to the end.
    for (int i = 1; i < n; ++i) free(blocks[static_cast<size_t>(i)]);
    out->kept.push_back(blocks[0]);
    out->keptBytes += sizeOf(thread, round, 0);
  }
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  out->cpuSeconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                    static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}
}  // namespace

int main(int argc, char** argv) {
  const int perBurst = argc > 1 ? std::atoi(argv[1]) : 25000;
  pthread_barrier_init(&g_barrier, nullptr, kThreads);
  std::vector<ThreadResult> results(kThreads);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t, perBurst, &results[t]);
  for (std::thread& t : threads) t.join();
  // The job's own time: the bursts, not what a recorder does at exit.
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t allocs = 0;
  uint64_t kept = 0;
  uint64_t keptBytes = 0;
  double threadsCpu = 0;
  uint64_t peak = 0;
  uint64_t keptBefore = 0;  // blocks kept from earlier rounds are live during a round too
  for (int round = 0; round < kRounds; ++round) {
    uint64_t live = keptBefore;
    for (const ThreadResult& r : results) live += r.roundBytes[round];
    peak = std::max(peak, live);
    for (int t = 0; t < kThreads; ++t) keptBefore += sizeOf(t, round, 0);
  }
  for (const ThreadResult& r : results) {
    allocs += r.allocs;
    kept += r.kept.size();
    keptBytes += r.keptBytes;
    threadsCpu += r.cpuSeconds;
  }
  std::printf(
      "{\"allocs\": %llu, \"peak_bytes\": %llu, \"live_blocks\": %llu, \"live_bytes\": %llu, "
      "\"elapsed_s\": %.4f, \"threads_cpu_s\": %.4f}\n",
      static_cast<unsigned long long>(allocs), static_cast<unsigned long long>(peak),
      static_cast<unsigned long long>(kept), static_cast<unsigned long long>(keptBytes), elapsed,
      threadsCpu);
  return 0;
}
