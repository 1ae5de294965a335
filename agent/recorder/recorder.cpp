#include "agent/recorder/recorder.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "agent/recorder/futex.h"
#include "src/base/clock.h"

namespace tidemark::agent {

thread_local bool t_recursionGuard __attribute__((tls_model("initial-exec"))) = false;

namespace {
thread_local Ring* t_ring __attribute__((tls_model("initial-exec"))) = nullptr;
pthread_key_t g_ringKey;

// Storage for the singleton: constructed once, never destroyed, so that hooks running during
// static destruction or after exit() still find it intact.
alignas(Recorder) unsigned char g_recorderStorage[sizeof(Recorder)];
std::atomic<Recorder*> g_recorder{nullptr};
}  // namespace

Recorder& Recorder::instance() noexcept {
  Recorder* r = g_recorder.load(std::memory_order_acquire);
  if (r != nullptr) return *r;
  // The first call happens in the ELF constructor, before any other thread of ours exists.
  r = new (g_recorderStorage) Recorder();
  g_recorder.store(r, std::memory_order_release);
  return *r;
}

bool Recorder::init(uint32_t ringRecords, size_t tableBuckets) noexcept {
  if (m_initialized) return true;
  uint32_t capacity = 1024;
  while (capacity < ringRecords) capacity <<= 1;
  m_ringRecords = capacity;
  const size_t bytes = static_cast<size_t>(kMaxRings) * capacity * sizeof(Record);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) return false;
  m_ringMemory = static_cast<Record*>(mem);
  for (uint32_t i = 0; i < kMaxRings; ++i) {
    m_rings[i].init(m_ringMemory + static_cast<size_t>(i) * capacity, capacity);
  }
  if (!m_blocks.init(tableBuckets)) return false;
  try {
    // A first room for the collector's passes (address space only until used): a pass that
    // later finds no memory to grow it still takes this much (takeInOrder).
    m_taken.reserve(2 * static_cast<size_t>(capacity));
    m_ordered.reserve(2 * static_cast<size_t>(capacity));
    m_runs.reserve(kMaxRings);
  } catch (...) {
    return false;
  }
  if (pthread_key_create(&g_ringKey, &Recorder::releaseThreadRing) != 0) return false;
  m_initialized = true;
  return true;
}

void Recorder::releaseThreadRing(void* ring) noexcept {
  if (ring == nullptr) return;
  static_cast<Ring*>(ring)->state.store(Ring::kOrphaned, std::memory_order_release);
}

Ring* Recorder::claimRing() noexcept {
  for (uint32_t i = 0; i < kMaxRings; ++i) {
    uint32_t expected = Ring::kFree;
    if (m_rings[i].state.load(std::memory_order_relaxed) != Ring::kFree) continue;
    if (!m_rings[i].state.compare_exchange_strong(expected, Ring::kOwned,
                                                  std::memory_order_acq_rel)) {
      continue;
    }
    Ring* ring = &m_rings[i];
    ring->threadId = static_cast<uint32_t>(syscall(SYS_gettid));
    uint32_t used = m_ringsUsed.load(std::memory_order_relaxed);
    while (used < i + 1 &&
           !m_ringsUsed.compare_exchange_weak(used, i + 1, std::memory_order_acq_rel)) {
    }
    // Orphaned at thread exit, so the drain thread can hand the ring to a new thread.
    pthread_setspecific(g_ringKey, ring);
    return ring;
  }
  return nullptr;
}

inline Ring* Recorder::threadRing() noexcept {
  Ring* ring = t_ring;
  if (__builtin_expect(ring == nullptr, 0)) {
    ring = claimRing();
    t_ring = ring;
  }
  return ring;
}

Ring* Recorder::ringWithRoom() noexcept {
  Ring* ring = threadRing();
  if (ring == nullptr) {
    m_drops.noRing.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  if (__builtin_expect(!ring->hasSpace(), 0) && !waitForRoom(ring)) {
    m_drops.ringFull.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return ring;
}

bool Recorder::waitForRoom(Ring* ring) noexcept {
  if (m_lossy.load(std::memory_order_relaxed) || m_degraded.load(std::memory_order_relaxed) ||
      m_collectors.load(std::memory_order_acquire) == 0) {
    return false;
  }
  m_ringWaits.fetch_add(1, std::memory_order_relaxed);
  m_waiters.fetch_add(1, std::memory_order_acq_rel);
  requestDrain();
  bool room = false;
  // A pass of the collector usually takes well under a millisecond: spin briefly first.
  for (int i = 0; i < 2000 && !(room = ring->hasSpace()); ++i) __builtin_ia32_pause();
  const int64_t deadline = base::monotonicNs() + m_waitDeadlineNs;
  while (!room) {
    const uint32_t epoch = m_drainEpoch.load(std::memory_order_acquire);
    if ((room = ring->hasSpace())) break;
    if (m_degraded.load(std::memory_order_relaxed) ||
        m_collectors.load(std::memory_order_acquire) == 0) {
      break;
    }
    const int64_t left = deadline - base::monotonicNs();
    if (left <= 0) {
      // The collector made no room in time: rather than stall the job, the whole process
      // drops from now on, and says so (the transport reports it).
      m_degraded.store(true, std::memory_order_relaxed);
      futexWakeAll(m_drainEpoch);
      break;
    }
    requestDrain();
    futexWait(m_drainEpoch, epoch, std::min<int64_t>(left, 10 * 1000000));
  }
  m_waiters.fetch_sub(1, std::memory_order_acq_rel);
  return room;
}

void Recorder::collectorStarted() noexcept { m_collectors.fetch_add(1, std::memory_order_acq_rel); }

void Recorder::collectorStopped() noexcept {
  if (m_collectors.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    m_drainEpoch.fetch_add(1, std::memory_order_acq_rel);
    futexWakeAll(m_drainEpoch);
  }
}

void Recorder::awaitDrainRequest(uint32_t seen, int timeoutMs) noexcept {
  if (m_waiters.load(std::memory_order_acquire) != 0) return;  // someone waits already
  // Set before the wait reads the request count (both sequentially consistent, as in
  // wakeCollector): a thread that raised the count after the collector read `seen` either sees
  // it asleep and wakes it, or the wait sees the raised count and returns at once.
  m_collectorAsleep.store(true, std::memory_order_seq_cst);
  futexWait(m_drainRequest, seen, static_cast<int64_t>(timeoutMs) * 1000000);
  m_collectorAsleep.store(false, std::memory_order_relaxed);
}

void Recorder::requestDrain() noexcept {
  m_drainRequest.fetch_add(1, std::memory_order_acq_rel);
  futexWakeAll(m_drainRequest);
}

void Recorder::wakeCollector() noexcept {
  m_drainRequest.fetch_add(1, std::memory_order_seq_cst);
  if (m_collectorAsleep.load(std::memory_order_seq_cst)) futexWakeAll(m_drainRequest);
}

void Recorder::notifyDrained() noexcept {
  m_drainEpoch.fetch_add(1, std::memory_order_acq_rel);
  if (m_waiters.load(std::memory_order_acquire) != 0) futexWakeAll(m_drainEpoch);
}

void Recorder::commit(Ring* ring, Record& record, int64_t orderNs) noexcept {
  record.seq = static_cast<uint64_t>(orderNs);
  if (__builtin_expect(ring->push(record), 0)) wakeCollector();
}

bool Recorder::push(Record& record) noexcept {
  Ring* ring = ringWithRoom();
  if (ring == nullptr) return false;
  record.threadId = ring->threadId;
  record.tsNs = base::monotonicNs();
  commit(ring, record, record.tsNs);
  return true;
}

bool Recorder::pushAt(Record& record) noexcept {
  Ring* ring = ringWithRoom();
  if (ring == nullptr) return false;
  commit(ring, record, base::monotonicNs());
  return true;
}

uint64_t Recorder::recordedCount() const noexcept {
  uint64_t n = m_seq.load(std::memory_order_acquire);
  const uint32_t used = m_ringsUsed.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < used && i < kMaxRings; ++i) n += m_rings[i].unread();
  return n;
}

bool Recorder::holdsRecords() const noexcept {
  const uint32_t used = std::min(m_ringsUsed.load(std::memory_order_acquire), kMaxRings);
  for (uint32_t i = 0; i < used; ++i)
    if (!m_rings[i].empty()) return true;
  return false;
}

size_t Recorder::takeInOrder() noexcept {
  // Read before any ring is looked at: a record pushed after its ring was counted has a later
  // time, or waits with everything after it (the class comment).
  uint64_t cutoff = static_cast<uint64_t>(base::monotonicNs());
  const uint32_t used = std::min(m_ringsUsed.load(std::memory_order_acquire), kMaxRings);
  // What each ring gives is what it held when counted, here: a record pushed since (with a time
  // before the cutoff, read before it was pushed) waits for the next pass, as does everything
  // made after it, which comes after the count. (One count for all the rings together let a ring
  // read early take such records, out of the room a later ring's counted ones then lacked: left
  // for the next pass, they were numbered after records of this one made after them.)
  size_t unread = 0;
  for (uint32_t i = 0; i < used; ++i) unread += (m_counted[i] = m_rings[i].unread());
  m_taken.clear();
  m_runs.clear();
  m_ordered.clear();
  try {
    // What a pass takes is bounded by this room (the rest stays in its rings for the next):
    // taking a record never allocates, so no record is lost to a failed allocation.
    m_taken.reserve(unread);
    m_ordered.reserve(unread);
    m_runs.reserve(used);
  } catch (...) {
    // No memory for the whole pass (the job at its memory limit): a smaller one, within the
    // room the vectors have, cut at an earlier time so that every ring gives all it holds before
    // it — the next pass goes on from there, and the order stays whole. (Without any room the
    // rings stay full: their threads wait, as for a slow link.)
    const size_t room = std::min(m_taken.capacity(), m_ordered.capacity());
    if (m_runs.capacity() < used || room == 0) return 0;
    // Counted again at the time chosen: records pushed meanwhile with earlier times may make it
    // too many, and an earlier time is chosen.
    do {
      cutoff = cutoffWithin(cutoff, room, used);
      if (cutoff == 0) return 0;
      unread = 0;
      for (uint32_t i = 0; i < used; ++i) unread += (m_counted[i] = m_rings[i].countBefore(cutoff));
    } while (unread > room);
  }
  for (uint32_t i = 0; i < used; ++i) {
    Ring& ring = m_rings[i];
    const uint32_t state = ring.state.load(std::memory_order_acquire);
    if (state == Ring::kFree) continue;
    const size_t begin = m_taken.size();
    ring.drainBefore(cutoff, m_counted[i], [this](const Record* first, size_t n) {
      m_taken.insert(m_taken.end(), first, first + n);
    });
    if (m_taken.size() > begin) m_runs.emplace_back(begin, m_taken.size());
    if (state == Ring::kOrphaned && ring.empty()) {
      uint32_t expected = Ring::kOrphaned;
      ring.state.compare_exchange_strong(expected, Ring::kFree, std::memory_order_acq_rel);
    }
  }
  // Merged by the time each was pushed; a ring's own order is kept whatever the times say. On
  // a busy machine the job's threads take turns on the processors, so a ring's records come in
  // stretches that no other ring's interleave: each stretch is copied whole.
  if (m_runs.size() == 1) {
    m_ordered.swap(m_taken);
  } else {
    while (!m_runs.empty()) {
      size_t first = 0;  // the run whose next record is the earliest (ties: the lower ring)
      uint64_t second = UINT64_MAX;  // the earliest next record of the others
      for (size_t i = 1; i < m_runs.size(); ++i) {
        const uint64_t t = m_taken[m_runs[i].first].seq;
        if (t < m_taken[m_runs[first].first].seq) {
          second = m_taken[m_runs[first].first].seq;
          first = i;
        } else {
          second = std::min(second, t);
        }
      }
      std::pair<size_t, size_t>& run = m_runs[first];
      size_t end = run.first + 1;
      while (end < run.second && m_taken[end].seq < second) ++end;
      m_ordered.insert(m_ordered.end(), m_taken.begin() + static_cast<long>(run.first),
                       m_taken.begin() + static_cast<long>(end));
      run.first = end;
      if (run.first == run.second) m_runs.erase(m_runs.begin() + static_cast<long>(first));
    }
  }
  // Numbered: one shared increment a pass. A step's begin mark reserves numbers after its own.
  uint64_t numbers = m_ordered.size();
  for (const Record& r : m_ordered)
    if (r.kind == RecordKind::kStepBegin) numbers += r.sizeBytes;
  uint64_t next = m_seq.fetch_add(numbers, std::memory_order_acq_rel) + 1;
  for (Record& r : m_ordered) {
    r.seq = next++;
    if (r.kind == RecordKind::kStepBegin) next += r.sizeBytes;
  }
  return m_ordered.size();
}

uint64_t Recorder::cutoffWithin(uint64_t cutoff, size_t room, uint32_t used) const noexcept {
  const auto before = [&](uint64_t t) {
    size_t n = 0;
    for (uint32_t i = 0; i < used; ++i) n += m_rings[i].countBefore(t);
    return n;
  };
  if (before(cutoff) <= room) return cutoff;
  // The latest time before which the rings hold no more than room records (0: none fits).
  uint64_t lo = 0;
  uint64_t hi = cutoff;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (before(mid) <= room) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

void Recorder::onAlloc(void* address, size_t size, uint32_t nativeNameIid) noexcept {
  // Room first, then tracking: a tracked block always has its alloc record.
  Ring* ring = ringWithRoom();
  if (ring == nullptr) return;
  const auto addr = reinterpret_cast<uint64_t>(address);
  if (!m_blocks.insert(addr, size)) {
    m_drops.tableFull.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  m_blocks.prefetchNext(addr, size);
  Record r{};
  r.kind = RecordKind::kAlloc;
  r.small = 1;  // MEMORY_KIND_HOST
  r.address = addr;
  r.sizeBytes = size;
  r.device = -1;
  r.threadId = ring->threadId;
  r.tsNs = base::monotonicNs();
  commit(ring, r, r.tsNs);
  if (nativeNameIid != 0) pushNativeTag(addr, size, nativeNameIid);
  pushStackOf(addr, size);
}

bool Recorder::pushNativeTag(uint64_t address, uint64_t size, uint32_t nameIid) noexcept {
  Record tag{};
  tag.kind = RecordKind::kTag;
  tag.small = kCategoryWorkspace;
  tag.address = address;
  tag.sizeBytes = size;
  tag.nameIid = nameIid;
  tag.device = -1;
  return push(tag);
}

void Recorder::pushStack(uint64_t address) noexcept {
  const uint32_t frames = m_stackOf();
  if (frames == 0) return;
  Record r{};
  r.kind = RecordKind::kStack;
  r.address = address;
  r.nameIid = frames;
  r.device = -1;
  push(r);
}

bool Recorder::onFree(void* address) noexcept {
  uint64_t size = 0;
  const auto addr = reinterpret_cast<uint64_t>(address);
  if (!m_blocks.erase(addr, &size)) return false;
  m_blocks.prefetchNext(addr, size);
  if (!recording()) return true;
  Record r{};
  r.kind = RecordKind::kFree;
  r.small = 1;
  r.address = addr;
  r.device = -1;
  push(r);
  return true;
}

void Recorder::forgetAfterFork() noexcept {
  m_recording.store(false, std::memory_order_release);
  // The child's only thread keeps its t_ring pointer; the rings stay as the parent left them
  // and are never drained here (nothing in the child talks to the parent's server).
}

}  // namespace tidemark::agent
