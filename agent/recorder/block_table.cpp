#include "agent/recorder/block_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <utility>

namespace tidemark::agent {

namespace {
// Blocks are at least 16-byte aligned (64 for torch), so the low bits carry no information.
inline uint64_t mix(uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
}  // namespace

namespace {
constexpr unsigned kRegionShift = 26;  // 64 MiB: the heap size of malloc's per-thread arenas
constexpr size_t kCrowded = 3;  // a home bucket with no more empty slots than this is crowded
}  // namespace

bool BlockTable::init(size_t bucketCount) noexcept {
  size_t n = 1;
  while (n < bucketCount) n <<= 1;
  const size_t slots = n * kSlotsPerBucket;
  const size_t bytes = 2 * slots * sizeof(uint64_t) + n * sizeof(uint32_t);
  // In huge pages where the kernel gives them for the asking (transparent huge pages, "madvise"
  // or "always"): the table is read at random, and with 4 KiB pages nearly every lookup of a
  // large table also missed the TLB; and the table is made in a few faults instead of 4,200 (the
  // agent's load took 9 ms more for them). Aligned to a huge page so that all of it can be.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t mapped = bytes + kHuge;
  void* region = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return false;
  const uintptr_t start = reinterpret_cast<uintptr_t>(region);
  const uintptr_t aligned = (start + kHuge - 1) & ~(uintptr_t{kHuge} - 1);
  if (aligned > start) munmap(region, aligned - start);
  if (const uintptr_t end = start + mapped, used = aligned + bytes; end > used)
    munmap(reinterpret_cast<void*>(used), end - used);
  void* memory = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  madvise(memory, bytes, MADV_HUGEPAGE);  // refused where there are none: 4 KiB pages, as before
#endif
  m_mappedBytes = bytes;
  // Every page written once now (16.5 MiB for the default 2^17 buckets): a page first read (a
  // lookup maps the shared zero page) and then written (an insert) costs a copy-on-write fault
  // whose TLB flush interrupts every processor running the job's threads, on the hot path
  // (measured on the 8-thread burst program: 2.3 % of its time).
  const long page = sysconf(_SC_PAGESIZE);
  for (size_t at = 0; at < bytes; at += static_cast<size_t>(page > 0 ? page : 4096))
    static_cast<volatile char*>(memory)[at] = 0;
  auto* words = static_cast<uint64_t*>(memory);
  static_assert(kSlotsPerBucket == 8, "a bucket's keys fill one cache line");
  // Bucket b: its 8 keys in words [16b, 16b+8), their sizes in the next cache line, which the
  // processor fetches with the keys' line (the two make an aligned 128-byte pair).
  m_keys = reinterpret_cast<std::atomic<uint64_t>*>(words);
  m_sizes = words + kSlotsPerBucket;
  m_spilled = reinterpret_cast<std::atomic<uint32_t>*>(words + 2 * slots);
  m_bucketCount = n;
  return true;
}

void BlockTable::clear() noexcept {
  if (m_keys == nullptr) return;
  // Private anonymous pages read back as zeros (empty slots, nothing spilled) once dropped.
  madvise(m_keys, m_mappedBytes, MADV_DONTNEED);
}

size_t BlockTable::homeBucket(uint64_t address) const noexcept {
  return ((address >> 6) + mix(address >> kRegionShift)) & (m_bucketCount - 1);
}
size_t BlockTable::otherBucket(uint64_t address) const noexcept {
  return mix(address >> 4) & (m_bucketCount - 1);
}

size_t BlockTable::emptySlots(size_t bucket) const noexcept {
  const size_t base = bucket * kSlotsPerBucket;
  size_t n = 0;
  for (size_t i = 0; i < kSlotsPerBucket; ++i) {
    n += key(base + i).load(std::memory_order_relaxed) == 0 ? 1 : 0;
  }
  return n;
}

long BlockTable::findIn(size_t bucket, uint64_t address) const noexcept {
  const size_t base = bucket * kSlotsPerBucket;
  for (size_t i = 0; i < kSlotsPerBucket; ++i) {
    if (key(base + i).load(std::memory_order_acquire) == address) {
      return static_cast<long>(base + i);
    }
  }
  return -1;
}

long BlockTable::find(uint64_t address) const noexcept {
  const size_t home = homeBucket(address);
  if (const long slot = findIn(home, address); slot >= 0) return slot;
  // The count is raised before a key is placed elsewhere, and a block is looked up only after
  // the hook that placed it returned (the program orders its free after its allocation).
  if (m_spilled[home].load(std::memory_order_relaxed) == 0) return -1;
  const size_t other = otherBucket(address);
  return other == home ? -1 : findIn(other, address);
}

bool BlockTable::claim(size_t bucket, uint64_t address, uint64_t size) noexcept {
  const size_t base = bucket * kSlotsPerBucket;
  for (size_t i = 0; i < kSlotsPerBucket; ++i) {
    uint64_t expected = 0;
    if (key(base + i).load(std::memory_order_relaxed) != 0) continue;
    if (key(base + i).compare_exchange_strong(expected, address, std::memory_order_acq_rel)) {
      // Written after the claim: a free of this address can only come after the allocation
      // hook has returned the block, and so after this store.
      sizeAt(base + i) = size;
      return true;
    }
  }
  return false;
}

bool BlockTable::insert(uint64_t address, uint64_t size) noexcept {
  if (m_keys == nullptr || address == 0) return false;
  // A stale entry (a free the table did not see) must not leave a second copy of the key.
  if (const long slot = find(address); slot >= 0) {
    sizeAt(static_cast<size_t>(slot)) = size;
    return true;
  }
  const size_t home = homeBucket(address);
  const size_t homeEmpty = emptySlots(home);
  if (homeEmpty > kCrowded && claim(home, address, size)) return true;
  // Home is crowded: the emptier of the two. Always the home first (first fit) failed inserts
  // from half of the slots on where addresses hash alike; balanced, none up to seven tenths
  // (tests/unit/block_table_test.cpp).
  const size_t other = otherBucket(address);
  const auto spill = [&]() noexcept {
    if (other == home) return false;
    m_spilled[home].fetch_add(1, std::memory_order_relaxed);
    if (claim(other, address, size)) return true;
    m_spilled[home].fetch_sub(1, std::memory_order_relaxed);
    return false;
  };
  if (emptySlots(other) > homeEmpty && spill()) return true;
  return claim(home, address, size) || spill();
}

bool BlockTable::erase(uint64_t address, uint64_t* size) noexcept {
  if (m_keys == nullptr || address == 0) return false;
  const long slot = find(address);
  if (slot < 0) return false;
  uint64_t expected = address;
  const uint64_t sz = sizeAt(static_cast<size_t>(slot));
  if (!key(static_cast<size_t>(slot))
           .compare_exchange_strong(expected, 0, std::memory_order_acq_rel))
    return false;
  const size_t home = homeBucket(address);
  if (static_cast<size_t>(slot) / kSlotsPerBucket != home) {
    m_spilled[home].fetch_sub(1, std::memory_order_relaxed);
  }
  if (size != nullptr) *size = sz;
  return true;
}

void BlockTable::prefetchNext(uint64_t address, uint64_t size) const noexcept {
  if (m_keys == nullptr) return;
  // The next chunk starts past this one's end and the allocator's header (16 bytes in glibc),
  // up to an alignment further: two buckets of 64 bytes of address space cover it.
  const uint64_t next = address + size + 16;
  __builtin_prefetch(&key(homeBucket(next) * kSlotsPerBucket), 1, 3);
  __builtin_prefetch(&key(homeBucket(next + 64) * kSlotsPerBucket), 1, 3);
}

bool BlockTable::lookup(uint64_t address, uint64_t* size) const noexcept {
  if (m_keys == nullptr || address == 0) return false;
  const long slot = find(address);
  if (slot < 0) return false;
  if (size != nullptr) *size = sizeAt(static_cast<size_t>(slot));
  return true;
}

}  // namespace tidemark::agent
