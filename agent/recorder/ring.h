#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "agent/recorder/record.h"

namespace tidemark::agent {

// A single-producer single-consumer ring of Records over memory it does not own. The owning
// thread produces; the drain thread consumes. Capacity is a power of two.
// Invariant: 0 <= m_head - m_tail <= capacity; slots [m_tail, m_head) hold unread records.
class Ring {
 public:
  enum State : uint32_t { kFree = 0, kOwned = 1, kOrphaned = 2 };

  void init(Record* slots, uint32_t capacity) noexcept {
    m_slots = slots;
    m_mask = capacity - 1;
    m_drainMark = capacity / 2;
    m_head.store(0, std::memory_order_relaxed);
    m_tail.store(0, std::memory_order_relaxed);
  }

  // Producer side. The producer is the only one that adds, so space seen here stays available.
  bool hasSpace() const noexcept {
    const uint64_t head = m_head.load(std::memory_order_relaxed);
    const uint64_t tail = m_tail.load(std::memory_order_acquire);
    return head - tail <= m_mask;
  }
  // Precondition: hasSpace() returned true on this thread. True when this record filled the
  // ring to its drain mark (half of it): time to wake the consumer, so that it empties the ring
  // before the producer finds it full. (The tail was just read by hasSpace: no new miss.)
  bool push(const Record& r) noexcept {
    const uint64_t head = m_head.load(std::memory_order_relaxed);
    m_slots[head & m_mask] = r;
    m_head.store(head + 1, std::memory_order_release);
    return head + 1 - m_tail.load(std::memory_order_relaxed) == m_drainMark;
  }

  // Consumer side: passes the unread records to sink, oldest first, up to the first whose seq
  // field (in a ring: the time it was pushed, Recorder's order key) is cutoff or later and at
  // most max of them; they are then read. sink(const Record* first, size_t n) is given them in
  // at most two pieces of consecutive slots (the ring wraps round once at most), to be copied
  // whole. Returns how many.
  template <typename Sink>
  size_t drainBefore(uint64_t cutoff, size_t max, Sink&& sink) noexcept {
    const uint64_t tail = m_tail.load(std::memory_order_relaxed);
    const uint64_t head = m_head.load(std::memory_order_acquire);
    uint64_t end = tail;
    for (; end < head && end - tail < max; ++end)
      if (m_slots[end & m_mask].seq >= cutoff) break;
    const uint64_t firstSlot = tail & m_mask;
    const uint64_t n = end - tail;
    const uint64_t beforeWrap = std::min<uint64_t>(n, m_mask + 1 - firstSlot);
    if (beforeWrap > 0) sink(m_slots + firstSlot, static_cast<size_t>(beforeWrap));
    if (n > beforeWrap) sink(m_slots, static_cast<size_t>(n - beforeWrap));
    m_tail.store(end, std::memory_order_release);
    return static_cast<size_t>(n);
  }
  // How many unread records drainBefore(cutoff, ...) would give: a binary search (a ring's order
  // keys rise with its slots).
  size_t countBefore(uint64_t cutoff) const noexcept {
    uint64_t lo = m_tail.load(std::memory_order_acquire);
    uint64_t hi = m_head.load(std::memory_order_acquire);
    const uint64_t tail = lo;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (m_slots[mid & m_mask].seq < cutoff) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return static_cast<size_t>(lo - tail);
  }
  // Every unread record, to sink as drainBefore gives them.
  template <typename Sink>
  size_t drain(Sink&& sink) noexcept {
    return drainBefore(UINT64_MAX, SIZE_MAX, sink);
  }
  // Records pushed and not yet read, from any thread (a snapshot: either side may move
  // meanwhile). The tail is read first: the head only grows and the tail never passes it, so the
  // head read after it is no lower (read the other way round, a drain between the two reads
  // could move the tail past the head read, and the difference wrap round to ~2^64).
  size_t unread() const noexcept {
    const uint64_t tail = m_tail.load(std::memory_order_acquire);
    return static_cast<size_t>(m_head.load(std::memory_order_acquire) - tail);
  }
  bool empty() const noexcept {
    return m_head.load(std::memory_order_acquire) == m_tail.load(std::memory_order_acquire);
  }

  std::atomic<uint32_t> state{kFree};
  uint32_t threadId = 0;

 private:
  Record* m_slots = nullptr;
  uint64_t m_mask = 0;
  uint64_t m_drainMark = 0;
  alignas(64) std::atomic<uint64_t> m_head{0};
  alignas(64) std::atomic<uint64_t> m_tail{0};
};

}  // namespace tidemark::agent
