#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tidemark::agent {

// The set of live blocks the agent tracks, so that free() records only the blocks the hooked
// allocators returned (free is called for every malloc'd block of the process too).
//
// Lock-free and allocation-free after init: keys live in buckets of 8 slots (one cache line);
// a key may sit in one of two buckets (two hash functions). Insert claims an empty slot with a
// CAS; erase CASes the key back to empty. No tombstones, so a lookup of an absent key (the
// common case: most frees are not ours) reads at most two cache lines.
// Invariant: a live address is in at most one slot; 0 is never a key.
class BlockTable {
 public:
  static constexpr size_t kSlotsPerBucket = 8;

  // Maps memory for buckets * 8 slots. Returns false if the memory could not be had.
  bool init(size_t bucketCount) noexcept;
  bool initialized() const noexcept { return m_keys != nullptr; }

  // False when both candidate buckets are full (the caller counts the drop).
  bool insert(uint64_t address, uint64_t size) noexcept;
  // True if address was tracked; then *size is its size and it is no longer tracked.
  bool erase(uint64_t address, uint64_t* size) noexcept;
  // True if address is tracked; then *size is its size. The entry stays.
  bool lookup(uint64_t address, uint64_t* size) const noexcept;
  size_t capacity() const noexcept { return m_bucketCount * kSlotsPerBucket; }
  // Forgets every block. Only while nothing inserts or erases (between attaches).
  void clear() noexcept;

 private:
  size_t bucketA(uint64_t address) const noexcept;
  size_t bucketB(uint64_t address) const noexcept;
  long find(uint64_t address) const noexcept;
  size_t emptySlots(size_t bucket) const noexcept;

  std::atomic<uint64_t>* m_keys = nullptr;
  uint64_t* m_sizes = nullptr;
  size_t m_bucketCount = 0;  // power of two
};

}  // namespace tidemark::agent
