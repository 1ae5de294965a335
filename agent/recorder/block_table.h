#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tidemark::agent {

// The set of live blocks the agent tracks, so that free() records only the blocks the hooked
// allocators returned (free is called for every malloc'd block of the process too).
//
// Lock-free and allocation-free after init: keys live in buckets of 8 slots (one cache line);
// a key may sit in one of two buckets. Its home bucket keeps the allocator's locality: blocks
// next to each other in memory have home buckets next to each other (64 bytes of address space
// per bucket, each 64 MiB region shifted by a hash of its number so that regions alike in layout,
// as the per-thread arenas of malloc are, do not share buckets). A burst of allocations and its
// frees then walk the table as they walk the heap, from cache, instead of missing it at random.
// A key goes to its other bucket (a hash of the whole address) only when home is crowded; each
// bucket counts the keys of its own that live elsewhere, so a lookup (most frees are not ours)
// reads a second cache line only where some have spilled. Insert claims an empty slot with a
// CAS; erase CASes the key back to empty. No tombstones.
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
  // Asks the processor for the buckets where the block after [address, address + size) in
  // memory would be found: an allocator serving a loop, and a loop freeing what it allocated,
  // walk the heap upwards, so the next insert or erase of this thread then finds its bucket in
  // cache instead of waiting for memory (the table is read at random otherwise).
  void prefetchNext(uint64_t address, uint64_t size) const noexcept;
  size_t capacity() const noexcept { return m_bucketCount * kSlotsPerBucket; }
  // Forgets every block. Only while nothing inserts or erases (between attaches).
  void clear() noexcept;

 private:
  std::atomic<uint64_t>& key(size_t slot) const noexcept {
    return m_keys[(slot & ~(kSlotsPerBucket - 1)) * 2 + (slot & (kSlotsPerBucket - 1))];
  }
  uint64_t& sizeAt(size_t slot) const noexcept {
    return m_sizes[(slot & ~(kSlotsPerBucket - 1)) * 2 + (slot & (kSlotsPerBucket - 1))];
  }
  size_t homeBucket(uint64_t address) const noexcept;
  size_t otherBucket(uint64_t address) const noexcept;
  long find(uint64_t address) const noexcept;
  long findIn(size_t bucket, uint64_t address) const noexcept;
  size_t emptySlots(size_t bucket) const noexcept;
  bool claim(size_t bucket, uint64_t address, uint64_t size) noexcept;

  std::atomic<uint64_t>* m_keys = nullptr;
  uint64_t* m_sizes = nullptr;
  // Per bucket: how many keys whose home it is live in their other bucket.
  std::atomic<uint32_t>* m_spilled = nullptr;
  size_t m_bucketCount = 0;  // power of two
  size_t m_mappedBytes = 0;
};

}  // namespace tidemark::agent
