// A job that runs into its address-space limit (RLIMIT_AS, as `ulimit -v` sets it) and carries on,
// as a batch-size finder does: it sets its own limit a little above what it maps now, takes
// 1 MiB blocks until one is refused, keeps allocating and freeing small blocks at the limit (some
// are refused), gives half of the large blocks back and takes them again, and frees everything.
// While it sits at the limit nothing else in the process finds memory either: a profiler's
// threads among them. Its blocks are aligned (posix_memalign), as torch's CPU allocator's are.
// Prints what it did as JSON (what succeeded, what was refused).
#include <stdlib.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {
constexpr size_t kLarge = 1 << 20;

// The process's mapped size (VmSize), in bytes; 0 if unreadable.
uint64_t mappedBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmSize:", 7) == 0) kib = std::strtoull(line + 7, nullptr, 10);
  }
  std::fclose(f);
  return kib << 10;
}

struct Counts {
  uint64_t allocs = 0;
  uint64_t frees = 0;
  uint64_t refused = 0;
  uint64_t live = 0;
  uint64_t peak = 0;
};

void* take(Counts& c, size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, size) != 0) {
    ++c.refused;
    return nullptr;
  }
  std::memset(p, 1, size < 4096 ? size : 4096);
  ++c.allocs;
  c.live += size;
  if (c.live > c.peak) c.peak = c.live;
  return p;
}

void give(Counts& c, void* p, size_t size) {
  std::free(p);
  ++c.frees;
  c.live -= size;
}

// Large blocks until one is refused (at most what `blocks` reserved), kept in `blocks`.
void fill(Counts& c, std::vector<void*>& blocks) {
  while (blocks.size() < blocks.capacity()) {
    void* p = take(c, kLarge);
    if (p == nullptr) break;
    blocks.push_back(p);
  }
}

// Small blocks taken and given back at the limit, `pairs` times, a few held at once.
void churn(Counts& c, int pairs) {
  void* held[16] = {};
  for (int i = 0; i < pairs; ++i) {
    const size_t size = 64 + static_cast<size_t>(i % 16) * 48;
    void*& slot = held[i % 16];
    if (slot != nullptr) give(c, slot, 64 + static_cast<size_t>(i % 16) * 48);
    slot = take(c, size);
  }
  for (int i = 0; i < 16; ++i) {
    if (held[i] != nullptr) give(c, held[i], 64 + static_cast<size_t>(i) * 48);
  }
}
}  // namespace

int main(int argc, char** argv) {
  const uint64_t headroom = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256) << 20;
  const int pairs = argc > 2 ? std::atoi(argv[2]) : 200000;
  // "wait": the limit comes mid-run, when a line arrives on stdin (a test sends it once the
  // profiler's connection is up); before it, the job runs as usual. Once the limit is first
  // reached the program says "full" and waits for another line: the test does what it wants
  // to happen while the job holds all the memory there is.
  const bool wait = argc > 3 && std::strcmp(argv[3], "wait") == 0;
  std::vector<void*> blocks;
  blocks.reserve(static_cast<size_t>(headroom / kLarge) + 64);
  Counts c;
  if (wait) {
    churn(c, pairs);
    std::printf("ready\n");
    std::fflush(stdout);
    char line[16];
    if (std::fgets(line, sizeof line, stdin) == nullptr) return 2;
  }
  const uint64_t mapped = mappedBytes();
  if (mapped == 0) return 2;
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0) return 2;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = mapped + headroom;
  if (setrlimit(RLIMIT_AS, &limit) != 0) return 2;
  int rounds = 0;
  uint64_t fullAt = 0;  // large blocks held when the first was refused
  for (; rounds < 3; ++rounds) {
    fill(c, blocks);
    if (rounds == 0) {
      fullAt = blocks.size();
      if (wait) {
        std::fputs("full\n", stdout);  // (the stdio buffer was made before the limit)
        std::fflush(stdout);
        char line[16];
        if (std::fgets(line, sizeof line, stdin) == nullptr) return 2;
      }
    }
    churn(c, pairs);
    // Half back, as a batch-size finder halves its batch.
    const size_t keep = blocks.size() / 2;
    while (blocks.size() > keep) {
      give(c, blocks.back(), kLarge);
      blocks.pop_back();
    }
    churn(c, pairs);
  }
  while (!blocks.empty()) {
    give(c, blocks.back(), kLarge);
    blocks.pop_back();
  }
  // The limit lifted: printing needs none, and a profiler's exit has room again.
  limit.rlim_cur = before;
  setrlimit(RLIMIT_AS, &limit);
  std::printf(
      "{\"allocs\": %llu, \"frees\": %llu, \"refused\": %llu, \"peak_bytes\": %llu, "
      "\"large_blocks_at_limit\": %llu, \"rounds\": %d}\n",
      static_cast<unsigned long long>(c.allocs), static_cast<unsigned long long>(c.frees),
      static_cast<unsigned long long>(c.refused), static_cast<unsigned long long>(c.peak),
      static_cast<unsigned long long>(fullAt), rounds);
  std::fflush(stdout);           // before the exit (and a profiler's work at it)
  return c.refused > 0 ? 0 : 3;  // 3: the limit was never reached (the test's premise failed)
}
