#include "agent/recorder/block_table.h"

#include <sys/mman.h>

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

bool BlockTable::init(size_t bucketCount) noexcept {
  size_t n = 1;
  while (n < bucketCount) n <<= 1;
  const size_t slots = n * kSlotsPerBucket;
  // MAP_NORESERVE: pages are committed only where slots get used.
  void* keys = mmap(nullptr, slots * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (keys == MAP_FAILED) return false;
  void* sizes = mmap(nullptr, slots * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (sizes == MAP_FAILED) {
    munmap(keys, slots * sizeof(uint64_t));
    return false;
  }
  m_keys = static_cast<std::atomic<uint64_t>*>(keys);
  m_sizes = static_cast<uint64_t*>(sizes);
  m_bucketCount = n;
  return true;
}

void BlockTable::clear() noexcept {
  if (m_keys == nullptr) return;
  // Private anonymous pages read back as zeros (empty slots) once dropped.
  madvise(m_keys, capacity() * sizeof(uint64_t), MADV_DONTNEED);
}

size_t BlockTable::bucketA(uint64_t address) const noexcept {
  return mix(address >> 4) & (m_bucketCount - 1);
}
size_t BlockTable::bucketB(uint64_t address) const noexcept {
  return mix((address >> 4) ^ 0x9e3779b97f4a7c15ULL) & (m_bucketCount - 1);
}

size_t BlockTable::emptySlots(size_t bucket) const noexcept {
  const size_t base = bucket * kSlotsPerBucket;
  size_t n = 0;
  for (size_t i = 0; i < kSlotsPerBucket; ++i) {
    n += m_keys[base + i].load(std::memory_order_relaxed) == 0 ? 1 : 0;
  }
  return n;
}

long BlockTable::find(uint64_t address) const noexcept {
  for (size_t bucket : {bucketA(address), bucketB(address)}) {
    const size_t base = bucket * kSlotsPerBucket;
    for (size_t i = 0; i < kSlotsPerBucket; ++i) {
      if (m_keys[base + i].load(std::memory_order_acquire) == address) {
        return static_cast<long>(base + i);
      }
    }
  }
  return -1;
}

bool BlockTable::insert(uint64_t address, uint64_t size) noexcept {
  if (m_keys == nullptr || address == 0) return false;
  // A stale entry (a free the table did not see) must not leave a second copy of the key.
  if (const long slot = find(address); slot >= 0) {
    m_sizes[slot] = size;
    return true;
  }
  // Two choices: the emptier bucket first. Filling the first bucket until it overflows (first
  // fit) failed inserts from half of the slots on (and, in a large table, one in a few hundred
  // thousand at a third); balanced, none up to seven tenths (tests/unit/block_table_test.cpp).
  size_t first = bucketA(address);
  size_t second = bucketB(address);
  if (emptySlots(second) > emptySlots(first)) std::swap(first, second);
  for (size_t bucket : {first, second}) {
    const size_t base = bucket * kSlotsPerBucket;
    for (size_t i = 0; i < kSlotsPerBucket; ++i) {
      uint64_t expected = 0;
      if (m_keys[base + i].load(std::memory_order_relaxed) != 0) continue;
      if (m_keys[base + i].compare_exchange_strong(expected, address, std::memory_order_acq_rel)) {
        // Written after the claim: a free of this address can only come after the allocation
        // hook has returned the block, and so after this store.
        m_sizes[base + i] = size;
        return true;
      }
    }
  }
  return false;
}

bool BlockTable::erase(uint64_t address, uint64_t* size) noexcept {
  if (m_keys == nullptr || address == 0) return false;
  const long slot = find(address);
  if (slot < 0) return false;
  uint64_t expected = address;
  const uint64_t sz = m_sizes[slot];
  if (!m_keys[slot].compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return false;
  if (size != nullptr) *size = sz;
  return true;
}

bool BlockTable::lookup(uint64_t address, uint64_t* size) const noexcept {
  if (m_keys == nullptr || address == 0) return false;
  const long slot = find(address);
  if (slot < 0) return false;
  if (size != nullptr) *size = m_sizes[slot];
  return true;
}

}  // namespace tidemark::agent
