#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "agent/recorder/block_table.h"
#include "agent/recorder/record.h"
#include "agent/recorder/ring.h"

namespace tidemark::agent {

// Counters for everything the recorder could not keep. Relaxed atomics: touched only when a
// record is lost, never on the normal path.
struct DropCounters {
  std::atomic<uint64_t> ringFull{0};  // lossy or degraded mode only: lossless waits instead
  std::atomic<uint64_t> noRing{0};
  std::atomic<uint64_t> tableFull{0};
};

// True on threads that must not record: the agent's own threads, and any thread while it is
// inside a hook (so allocations made by the hook's callees are not recorded twice).
extern thread_local bool t_recursionGuard __attribute__((tls_model("initial-exec")));

class RecursionGuard {
 public:
  RecursionGuard() noexcept : m_previous(t_recursionGuard) { t_recursionGuard = true; }
  ~RecursionGuard() { t_recursionGuard = m_previous; }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;

 private:
  bool m_previous;
};

// The process-wide recording core shared by every source (hooks, C ABI). It owns a fixed pool
// of per-thread rings and the tracked-block table, both mapped once at init.
//
// Hot-path contract (DESIGN §3): push() and the hook entry points check a flag and the
// recursion guard, read the clock, and copy a fixed-size record into the calling thread's ring.
// They do not allocate, lock, log or make system calls, and write no memory another thread
// writes. The exception is a thread's first record, which claims a ring from the pool and asks
// the kernel for its thread id (once per thread).
//
// Sequence numbers are given by the drain (drainAll), not taken on the hot path: a counter
// shared by every thread cost each record a locked increment of a cache line that the job's
// threads took from each other (a tenth of an 8-thread allocating program's time). A record
// carries the time it was pushed (CLOCK_MONOTONIC: consistent across processors) in its seq
// field; the drain reads the clock, counts what each ring holds, takes from each ring those of
// its counted records pushed before that time, merges them by it and numbers them. The numbers keep
// every order the program made: a free is pushed before the block goes back to the allocator and an
// allocation after the allocator gave it, so whatever happens because of a record (the address
// allocated again, a tensor tagged) reads the clock after that record was pushed. Within a pass
// that order is the clocks'; across passes, a record not counted by its pass (pushed after the
// count, its time read before or after the pass's) waits for the next pass, and so does everything
// after it, which read the clock after the count and so after the pass's clock read.
class Recorder {
 public:
  static constexpr uint32_t kMaxRings = 256;
  static constexpr uint32_t kDefaultRingRecords = 1u << 14;

  static Recorder& instance() noexcept;

  // Maps the ring pool and the block table. Idempotent; false if memory could not be had.
  bool init(uint32_t ringRecords, size_t tableBuckets) noexcept;
  bool initialized() const noexcept { return m_initialized; }

  void setRecording(bool on) noexcept { m_recording.store(on, std::memory_order_release); }

  // Full rings. Lossless (the default): a thread whose ring is full wakes the collector and waits
  // for room (a short spin, then a futex wait), never longer than waitDeadlineMs in one wait; a
  // wait that reaches the deadline switches the whole process to the degraded mode, where full
  // rings drop and count, as the lossy mode (TIDEMARK_LOSSY=1) always does. Without a collector
  // running (not started yet, shut down, a forked child) nobody would make room: full rings drop.
  void setLossy(bool lossy) noexcept { m_lossy.store(lossy, std::memory_order_relaxed); }
  bool lossy() const noexcept { return m_lossy.load(std::memory_order_relaxed); }
  void setWaitDeadlineMs(int ms) noexcept { m_waitDeadlineNs = static_cast<int64_t>(ms) * 1000000; }
  bool degraded() const noexcept { return m_degraded.load(std::memory_order_relaxed); }
  // Waits on full rings (each counts once, however long it took).
  uint64_t ringWaits() const noexcept { return m_ringWaits.load(std::memory_order_relaxed); }
  // A hook of the framework adapter failed (tidemark_adapter_failed): nothing of the agent's own
  // lost, but the marks that call would have made.
  void noteAdapterFailure() noexcept { m_adapterFailures.fetch_add(1, std::memory_order_relaxed); }
  uint64_t adapterFailures() const noexcept {
    return m_adapterFailures.load(std::memory_order_relaxed);
  }
  uint32_t ringRecords() const noexcept { return m_ringRecords; }  // each thread's ring holds

  // Collector side: a collector starts and stops (counted: a transport retired by a detach may
  // still be winding down while the next attach's runs). When none runs, every waiting thread
  // is released (it drops).
  void collectorStarted() noexcept;
  void collectorStopped() noexcept;
  // Sleeps until a thread asks for room (or requestDrain is called) or timeoutMs passes. The
  // collector reads drainRequests() before a pass and passes it here: a request made during the
  // pass then ends the wait at once instead of being slept through.
  uint32_t drainRequests() const noexcept { return m_drainRequest.load(std::memory_order_acquire); }
  void awaitDrainRequest(uint32_t seen, int timeoutMs) noexcept;
  void requestDrain() noexcept;
  // A ring reached its drain mark (half full): the collector, if asleep, is woken now rather
  // than at its next interval, so that a thread allocating fast rarely finds its ring full and
  // waits. A system call only when the collector sleeps.
  void wakeCollector() noexcept;
  // After a pass over the rings: wakes the threads waiting for room.
  void notifyDrained() noexcept;
  bool recording() const noexcept { return m_recording.load(std::memory_order_relaxed); }

  // Hook entry points. onAlloc after the real allocation returned; onFree before the real free,
  // so that a reused address always carries a larger sequence number than its free.
  // nativeNameIid != 0: a native library's own memory (native_callers.h), tagged WORKSPACE under
  // that name right after its alloc.
  void onAlloc(void* address, size_t size, uint32_t nativeNameIid = 0) noexcept;
  // The host block at address is a native library's own memory, named nameIid (WORKSPACE).
  bool pushNativeTag(uint64_t address, uint64_t size, uint32_t nameIid) noexcept;
  // True if the block was tracked (whether or not the free could be recorded).
  bool onFree(void* address) noexcept;

  // Allocations of at least minBytes are followed by a kStack record of the stack stackOf gives
  // (an interned string's id; 0: none): `tidemark run --stacks` (agent/python). 0: off.
  using StackFn = uint32_t (*)();
  void setStacks(uint64_t minBytes, StackFn stackOf) noexcept {
    m_stackOf = stackOf;
    m_stackMinBytes = stackOf != nullptr ? minBytes : 0;
  }
  // After an allocation's record: its stack's, when it is large enough and has one.
  void pushStackOf(uint64_t address, uint64_t size) noexcept {
    if (m_stackMinBytes != 0 && size >= m_stackMinBytes) pushStack(address);
  }

  // For the C ABI: fills ts and thread id, then pushes. False if the record was dropped. (A
  // kStepBegin's sizeBytes numbers after its own are reserved by the drain: record.h.)
  bool push(Record& record) noexcept;
  // For sources with their own times and lanes (GPU activity, on the calling thread's ring):
  // keeps record.tsNs and record.threadId. False if dropped.
  bool pushAt(Record& record) noexcept;

  // Drain thread: passes the records of every ring pushed before this call to sink, numbered
  // (seq) in the order they happened, and frees rings whose thread has exited once they are
  // empty. everything (the exit's last drain): passes again until the rings hold nothing —
  // records pushed meanwhile too, each pass taking what was pushed before it, in order — or
  // kLastPasses were made (a job whose threads go on pushing is not drained for ever). (One pass
  // taking every record the rings held put a record pushed during it after the records of later
  // rings made after it.)
  // One consumer at a time (the rings are single-consumer): a second caller meanwhile — the
  // collector of a transport that a detach gave up on, beside the next attach's — gets nothing.
  // sink(const Record* records, size_t n) is given each pass in one piece, only if there is one
  // (the collector copies it whole), while the pass's buffer is held for it.
  static constexpr int kLastPasses = 16;
  template <typename Sink>
  size_t drainAll(Sink&& sink, bool everything = false) noexcept {
    if (m_draining.exchange(true, std::memory_order_acquire)) return 0;
    struct Done {
      std::atomic<bool>& flag;
      ~Done() { flag.store(false, std::memory_order_release); }
    } done{m_draining};
    size_t taken = 0;
    for (int pass = 0; pass < (everything ? kLastPasses : 1); ++pass) {
      const size_t n = takeInOrder();
      if (n > 0) sink(m_ordered.data(), n);
      taken += n;
      // (A pass cut short for want of memory, or one whose time came before a record pushed
      // just then, leaves records for the next.)
      if (n == 0 && !holdsRecords()) break;
    }
    return taken;
  }

  // Takes n sequence numbers for records made by the drain's consumer (a capture schedule's);
  // the first. They come after every record drained so far.
  uint64_t reserveSeqs(uint64_t n) noexcept {
    return m_seq.fetch_add(n, std::memory_order_acq_rel) + 1;
  }

  // Records pushed so far: the numbers given (and reserved), and the records the rings hold.
  // From any thread; a snapshot.
  uint64_t recordedCount() const noexcept;
  const DropCounters& drops() const noexcept { return m_drops; }
  BlockTable& blocks() noexcept { return m_blocks; }

  // After fork, in the child: the parent's rings are left as they are (leaked), recording stops.
  void forgetAfterFork() noexcept;

  // Called by the thread-exit destructor of the ring key.
  static void releaseThreadRing(void* ring) noexcept;

 private:
  void pushStack(uint64_t address) noexcept;
  Ring* threadRing() noexcept;
  // The calling thread's ring if it has room for a record; else counts the drop, nullptr.
  Ring* ringWithRoom() noexcept;
  // Copies the record in, with the time it was pushed (orderNs) where its number will go.
  void commit(Ring* ring, Record& record, int64_t orderNs) noexcept;
  // drainAll's work, one pass: takes the rings' records into m_ordered, merged and numbered.
  // How many.
  size_t takeInOrder() noexcept;
  // Some ring holds an unread record.
  bool holdsRecords() const noexcept;
  // The latest time no later than cutoff before which the first `used` rings hold at most room
  // unread records (0 when none does).
  uint64_t cutoffWithin(uint64_t cutoff, size_t room, uint32_t used) const noexcept;
  Ring* claimRing() noexcept;
  // Lossless mode's slow path: true once the ring has room, false (drop) if the process is or
  // becomes degraded, or no collector runs.
  bool waitForRoom(Ring* ring) noexcept;

  bool m_initialized = false;
  std::atomic<bool> m_lossy{false};
  uint64_t m_stackMinBytes = 0;  // set once at load, before any hook runs
  StackFn m_stackOf = nullptr;
  std::atomic<bool> m_degraded{false};
  std::atomic<uint32_t> m_collectors{0};
  int64_t m_waitDeadlineNs = 2000ll * 1000000;
  std::atomic<uint64_t> m_ringWaits{0};
  std::atomic<uint64_t> m_adapterFailures{0};
  // Futex words: m_drainRequest rises when a thread wants room (the collector sleeps on it),
  // m_drainEpoch after each collector pass (waiting threads sleep on it).
  alignas(64) std::atomic<uint32_t> m_drainRequest{0};
  std::atomic<bool> m_collectorAsleep{false};
  alignas(64) std::atomic<uint32_t> m_drainEpoch{0};
  std::atomic<uint32_t> m_waiters{0};
  std::atomic<bool> m_recording{false};
  alignas(64) std::atomic<uint64_t> m_seq{0};  // the last number given or reserved
  DropCounters m_drops;
  BlockTable m_blocks;
  Ring m_rings[kMaxRings];
  std::atomic<uint32_t> m_ringsUsed{0};  // high-water mark of claimed ring slots
  std::atomic<bool> m_draining{false};   // a drainAll under way
  // drainAll's, reused between passes: the rings' records as taken (one run a ring), the runs,
  // and the records merged.
  std::vector<Record> m_taken;
  std::vector<std::pair<size_t, size_t>> m_runs;
  std::vector<Record> m_ordered;
  size_t m_counted[kMaxRings] = {};  // what each ring gives this pass (takeInOrder)
  Record* m_ringMemory = nullptr;
  uint32_t m_ringRecords = kDefaultRingRecords;
};

}  // namespace tidemark::agent
