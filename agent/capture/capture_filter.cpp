#include "agent/capture/capture_filter.h"

#include <algorithm>
#include <utility>

#include "src/core/category.h"

namespace tidemark::agent {

namespace {
constexpr int32_t kMemoryKindDevice = 2;
constexpr int32_t kMemoryKindTensor = 3;
int32_t memoryKind(const Record& r) { return r.small == 0 ? 1 : r.small; }
int priorityOf(uint8_t category) {
  return category == 0 ? -1 : core::tagPriority(static_cast<core::Category>(category));
}
}  // namespace

CaptureFilter::CaptureFilter(core::CaptureSchedule schedule,
                             std::function<uint64_t(uint64_t)> reserveSeqs,
                             uint32_t reservedCounterIid)
    : m_schedule(std::move(schedule)),
      m_reserveSeqs(std::move(reserveSeqs)),
      m_reservedIid(reservedCounterIid) {}

void CaptureFilter::process(const std::vector<Record>& in, std::vector<Record>& out) {
  // In sequence order across passes. The collector numbers each pass in order
  // (Recorder::drainAll), so the gaps are numbers reserved (a step's begin mark's, the filter's
  // own) or taken by another collector (a detach's, still winding down, beside the next
  // attach's): a missing number is waited for a few passes at most, then gone past.
  for (const Record& r : in) {
    if (m_nextSeq == 0) m_nextSeq = r.seq;
    if (r.seq < m_nextSeq) {
      handle(r, out);  // later than we could wait: as it comes (the late paths below)
    } else if (r.seq == m_nextSeq && m_waiting.empty()) {
      handle(r, out);
      advancePast(r);
    } else {
      m_waiting.emplace(r.seq, r);
    }
  }
  releaseWaiting(out);
  if (m_waiting.empty()) {
    m_waitedPasses = 0;
  } else if (++m_waitedPasses > kMaxWaitPasses || m_waiting.size() > kMaxWaiting) {
    // What is missing may never come (another collector's): go on without it.
    m_nextSeq = m_waiting.begin()->first;
    releaseWaiting(out);
    m_waitedPasses = 0;
  }
  m_processedUpTo.store(m_nextSeq, std::memory_order_release);
  flushRun(out);
}

void CaptureFilter::finish(std::vector<Record>& out) {
  while (!m_waiting.empty()) {
    m_nextSeq = std::max(m_nextSeq, m_waiting.begin()->first);
    releaseWaiting(out);
  }
  m_processedUpTo.store(m_nextSeq, std::memory_order_release);
  flushRun(out);
}

void CaptureFilter::releaseWaiting(std::vector<Record>& out) {
  while (!m_waiting.empty()) {
    skipOwnSeqs();
    auto it = m_waiting.begin();
    if (it->first > m_nextSeq) break;
    const Record r = it->second;
    m_waiting.erase(it);
    handle(r, out);
    if (r.seq >= m_nextSeq) advancePast(r);
  }
}

void CaptureFilter::advancePast(const Record& r) {
  m_nextSeq = r.seq + 1;
  // A step mark that reserved the numbers after it for the blocks sent again (C ABI).
  if (r.kind == RecordKind::kStepBegin) m_nextSeq += r.sizeBytes;
  skipOwnSeqs();
}

void CaptureFilter::skipOwnSeqs() {
  while (!m_ownSeqs.empty() && m_ownSeqs.begin()->first <= m_nextSeq) {
    m_nextSeq = std::max(m_nextSeq, m_ownSeqs.begin()->second);
    m_ownSeqs.erase(m_ownSeqs.begin());
  }
}

uint64_t CaptureFilter::takeSeqs(uint64_t n) {
  const uint64_t first = m_reserveSeqs(n);
  m_ownSeqs[first] = first + n;
  return first;
}

uint64_t CaptureFilter::restateBound(uint64_t recorded) const {
  const uint64_t processed = m_processedUpTo.load(std::memory_order_acquire);
  const uint64_t unprocessed = recorded >= processed ? recorded - processed + 1 : 0;
  // An alloc and a tag for each block unsent, and for each record not seen yet (an alloc, at
  // most), and a little to spare.
  return 2 * (static_cast<uint64_t>(std::max<int64_t>(0, m_unsentLive.load())) + unprocessed) + 16;
}

void CaptureFilter::handle(const Record& r, std::vector<Record>& out) {
  const bool detail = m_detail.load(std::memory_order_relaxed);
  switch (r.kind) {
    case RecordKind::kStepBegin: {
      const auto step = static_cast<int64_t>(r.address);
      if (m_schedule.detailed(step)) {
        m_stepSummarized = false;
        forward(r, out);
        if (!detail) {
          restateLiveBlocks(r, out);
          m_detail.store(true, std::memory_order_release);
        } else if (r.sizeBytes != 0) {
          tellUnused(r.seq + 1, r.seq + r.sizeBytes, r, out);
        }
      } else {
        m_detail.store(false, std::memory_order_release);
        forward(r, out);
        if (r.sizeBytes != 0) tellUnused(r.seq + 1, r.seq + r.sizeBytes, r, out);
        beginSummarizedStep(r);
      }
      break;
    }
    case RecordKind::kStepEnd:
      forward(r, out);
      if (m_stepSummarized && static_cast<int64_t>(r.address) == m_step) {
        endSummarizedStep(r, out);
      }
      break;
    case RecordKind::kAlloc: {
      const Key key{memoryKind(r), r.device, r.address};
      if (auto early = m_unmatchedFrees.find(key);
          early != m_unmatchedFrees.end() && early->second.seq > r.seq) {
        // Its free came first (this alloc was published late): born and dead, it goes where
        // its free went.
        const bool went = early->second.went;
        m_unmatchedFrees.erase(early);
        went ? forward(r, out) : leaveOut(r, out);
        break;
      }
      onAlloc(r);
      if (detail) {
        m_live[Key{memoryKind(r), r.device, r.address}].sent = true;
        m_unsentLive.fetch_sub(1, std::memory_order_relaxed);
        forward(r, out);
      } else {
        leaveOut(r, out);
      }
      break;
    }
    case RecordKind::kFree: {
      const Key key{memoryKind(r), r.device, r.address};
      auto it = m_live.find(key);
      const bool ofReplaced = it != m_live.end() && r.seq < it->second.allocSeq;
      if (ofReplaced || it == m_live.end()) {
        // The free of a block a later alloc replaced (this free was published late): it
        // goes where that block went.
        if (auto old = m_superseded.find(key); old != m_superseded.end()) {
          const bool went = old->second;
          m_superseded.erase(old);
          went ? forward(r, out) : leaveOut(r, out);
          break;
        }
        if (ofReplaced) {
          detail ? forward(r, out) : leaveOut(r, out);
          break;
        }
      }
      // A free goes when the daemon has its block; one of no block we know goes in detail
      // (the daemon counts it as it always does).
      const bool goes = it == m_live.end() ? detail : it->second.sent;
      const uint64_t restatedAt = it == m_live.end() ? 0 : it->second.restatedAt;
      if (it == m_live.end()) {
        if (m_unmatchedFrees.size() >= kMaxUnmatchedFrees) m_unmatchedFrees.clear();
        m_unmatchedFrees[key] = {r.seq, goes};
      }
      onFree(r);
      goes ? forwardAfter(r, restatedAt, out) : leaveOut(r, out);
      break;
    }
    case RecordKind::kTag: {
      // A tag goes with its block (or, of no block we know, as detail says).
      auto at = m_byAddress.find(r.address);
      const Live* block = at != m_byAddress.end() ? &m_live[at->second] : nullptr;
      const bool goes = block != nullptr ? block->sent : detail;
      const uint64_t restatedAt = block != nullptr ? block->restatedAt : 0;
      onTag(r);
      goes ? forwardAfter(r, restatedAt, out) : leaveOut(r, out);
      break;
    }
    case RecordKind::kStack: {
      // A stack goes with its block, as a tag does.
      auto at = m_byAddress.find(r.address);
      const Live* block = at != m_byAddress.end() ? &m_live[at->second] : nullptr;
      const bool goes = block != nullptr ? block->sent : detail;
      goes ? forwardAfter(r, block != nullptr ? block->restatedAt : 0, out) : leaveOut(r, out);
      break;
    }
    case RecordKind::kScopeBegin: {
      m_openScopes[(static_cast<uint64_t>(r.small) << 32) | r.threadId].push_back(detail);
      detail ? forward(r, out) : leaveOut(r, out);
      break;
    }
    case RecordKind::kScopeEnd: {
      endGoes(m_openScopes[(static_cast<uint64_t>(r.small) << 32) | r.threadId], detail)
          ? forward(r, out)
          : leaveOut(r, out);
      break;
    }
    case RecordKind::kPhaseBegin:
      m_openPhases[r.threadId].push_back(detail);
      detail ? forward(r, out) : leaveOut(r, out);
      break;
    case RecordKind::kPhaseEnd:
      endGoes(m_openPhases[r.threadId], detail) ? forward(r, out) : leaveOut(r, out);
      break;
    case RecordKind::kCounter:
      if (r.nameIid == m_reservedIid && m_reservedIid != 0) {
        m_reserved = static_cast<int64_t>(r.sizeBytes);
      }
      detail ? forward(r, out) : leaveOut(r, out);
      break;
    default:
      detail ? forward(r, out) : leaveOut(r, out);
      break;
  }
}

bool CaptureFilter::endGoes(std::vector<bool>& stack, bool detail) {
  if (stack.empty()) return detail;
  const bool begun = stack.back();
  stack.pop_back();
  return begun;
}

void CaptureFilter::onAlloc(const Record& r) {
  const Key key{memoryKind(r), r.device, r.address};
  if (auto old = m_live.find(key); old != m_live.end()) {
    // Its free was not seen (yet: a thread may publish it late): the old block ends here, as
    // the daemon ends it; a late free of it goes where it went.
    if (m_superseded.size() >= kMaxUnmatchedFrees) m_superseded.clear();
    m_superseded[key] = old->second.sent;
    Record gone = r;
    gone.kind = RecordKind::kFree;
    onFree(gone);
  }
  Live b;
  b.size = r.sizeBytes;
  b.allocSeq = r.seq;
  b.threadId = r.threadId;
  const auto size = static_cast<int64_t>(r.sizeBytes);
  if (key.kind == kMemoryKindTensor) {
    auto seg = m_segments.upper_bound({r.device, r.address});
    if (seg != m_segments.begin()) {
      --seg;
      b.inSegment = seg->first.first == r.device && r.address < seg->second;
    }
  } else if (key.kind == kMemoryKindDevice) {
    m_segments[{r.device, r.address}] = r.address + r.sizeBytes;
  }
  // A tensor in a segment takes bytes the segment holds (untagged until tagged); any other block
  // adds its own.
  addBytes(r.device, 0, b.inSegment ? 0 : size, b.inSegment ? 0 : size, r.seq, r.tsNs);
  m_live[key] = b;
  m_unsentLive.fetch_add(1, std::memory_order_relaxed);
  m_byAddress[r.address] = key;
}

void CaptureFilter::onFree(const Record& r) {
  const Key key{memoryKind(r), r.device, r.address};
  auto it = m_live.find(key);
  if (it == m_live.end()) return;
  const Live& b = it->second;
  const auto size = static_cast<int64_t>(b.size);
  if (b.inSegment) {
    addBytes(r.device, b.tagCategory, -size, 0, r.seq, r.tsNs);
    addBytes(r.device, 0, size, 0, r.seq, r.tsNs);
  } else {
    addBytes(r.device, b.tagCategory, -size, -size, r.seq, r.tsNs);
  }
  if (key.kind == kMemoryKindDevice) m_segments.erase({r.device, r.address});
  auto at = m_byAddress.find(r.address);
  if (at != m_byAddress.end() && at->second == key) m_byAddress.erase(at);
  if (!b.sent) m_unsentLive.fetch_sub(1, std::memory_order_relaxed);
  m_live.erase(it);
}

void CaptureFilter::onTag(const Record& r) {
  auto at = m_byAddress.find(r.address);
  if (at == m_byAddress.end()) return;
  Live& b = m_live[at->second];
  if (priorityOf(r.small) <= priorityOf(b.tagCategory)) return;  // the strongest tag decides
  const int from = b.tagCategory;
  b.tagCategory = r.small;
  b.tagName = r.nameIid;
  b.tagSize = r.sizeBytes;
  if (at->second.kind == kMemoryKindDevice) return;  // a segment's bytes stay the segment's
  const auto size = static_cast<int64_t>(b.size);
  const int32_t device = at->second.device;
  addBytes(device, from, -size, 0, r.seq, r.tsNs);
  addBytes(device, b.tagCategory, size, 0, r.seq, r.tsNs);
  // The daemon gives a block its tag's category for its whole life: a block live at the step's
  // peak moves there too.
  if (!m_stepSummarized) return;
  for (const int32_t d : {device, kAllDevices}) {
    DeviceFigures& f = m_devices[d];
    if (f.peak >= 0 && b.allocSeq <= f.peakSeq) {
      f.atPeak[static_cast<size_t>(from)] -= size;
      f.atPeak[b.tagCategory] += size;
    }
  }
}

void CaptureFilter::addBytes(int32_t device, int category, int64_t bytes, int64_t trackedDelta,
                             uint64_t seq, int64_t tsNs) {
  for (const int32_t d : {device, kAllDevices}) {
    DeviceFigures& f = m_devices[d];
    f.tracked += trackedDelta;
    f.byCategory[static_cast<size_t>(category)] += bytes;
    if (m_stepSummarized && f.tracked > f.peak) {
      f.peak = f.tracked;
      f.peakTsNs = tsNs;
      f.peakSeq = seq;
      f.atPeak = f.byCategory;
      f.reservedAtPeak = m_reserved;
    }
  }
}

void CaptureFilter::beginSummarizedStep(const Record& r) {
  m_stepSummarized = true;
  m_step = static_cast<int64_t>(r.address);
  m_stepEvents = 0;
  m_devices[kAllDevices];
  for (auto& [device, f] : m_devices) {
    f.peak = f.tracked;
    f.peakTsNs = r.tsNs;
    f.peakSeq = r.seq;
    f.atPeak = f.byCategory;
    f.reservedAtPeak = m_reserved;
  }
}

void CaptureFilter::endSummarizedStep(const Record& r, std::vector<Record>& out) {
  m_stepSummarized = false;
  std::vector<Record> figures;
  auto figure = [&](int32_t device, SummaryFigure which, int category, int64_t value, int64_t ts) {
    Record s{};
    s.kind = RecordKind::kStepSummary;
    s.small = static_cast<uint8_t>(which);
    s.reserved = static_cast<uint16_t>(category);
    s.address = static_cast<uint64_t>(m_step);
    s.sizeBytes = static_cast<uint64_t>(value);
    s.device = device;
    s.threadId = r.threadId;
    s.tsNs = ts;
    figures.push_back(s);
  };
  for (const auto& [device, f] : m_devices) {
    if (f.peak < 0) continue;
    figure(device, SummaryFigure::kPeakBytes, 0, f.peak, f.peakTsNs);
    for (size_t c = 0; c < f.atPeak.size(); ++c) {
      if (f.atPeak[c] != 0) {
        figure(device, SummaryFigure::kBytesAtPeak, static_cast<int>(c), f.atPeak[c], r.tsNs);
      }
    }
    if (device == kAllDevices && f.reservedAtPeak >= 0) {
      figure(device, SummaryFigure::kReservedAtPeak, 0, f.reservedAtPeak, r.tsNs);
    }
  }
  figure(kAllDevices, SummaryFigure::kEvents, 0, static_cast<int64_t>(m_stepEvents), r.tsNs);
  uint64_t seq = takeSeqs(figures.size());
  for (Record& s : figures) {
    s.seq = seq++;
    out.push_back(s);
  }
}

void CaptureFilter::restateLiveBlocks(const Record& stepBegin, std::vector<Record>& out) {
  std::vector<std::pair<const Key*, Live*>> unsent;
  size_t records = 0;
  for (auto& [key, b] : m_live) {
    if (b.sent) continue;
    unsent.emplace_back(&key, &b);
    records += b.tagCategory != 0 ? 2 : 1;
  }
  // The numbers the step mark reserved right after itself (C ABI), so that these blocks come
  // before anything of the step; more than reserved (never expected) take fresh ones.
  const uint64_t reserved = stepBegin.sizeBytes;
  if (records > reserved) m_restatedLate.fetch_add(1, std::memory_order_relaxed);
  uint64_t seq = records <= reserved && reserved != 0 ? stepBegin.seq + 1 : takeSeqs(records);
  if (records <= reserved)
    tellUnused(stepBegin.seq + 1 + records, stepBegin.seq + reserved, stepBegin, out);
  if (unsent.empty()) return;
  // Allocation order: a segment before the tensors in it, as when they were made.
  std::sort(unsent.begin(), unsent.end(),
            [](const auto& a, const auto& b) { return a.second->allocSeq < b.second->allocSeq; });
  for (auto& [key, b] : unsent) {
    Record a{};
    a.kind = RecordKind::kAlloc;
    a.small = static_cast<uint8_t>(key->kind);
    a.reserved = kAllocRestated;
    a.address = key->address;
    a.sizeBytes = b->size;
    a.device = key->device;
    a.threadId = b->threadId;
    a.tsNs = stepBegin.tsNs;
    a.seq = seq++;
    out.push_back(a);
    if (b->tagCategory != 0) {
      Record t{};
      t.kind = RecordKind::kTag;
      t.small = b->tagCategory;
      t.address = key->address;
      t.sizeBytes = b->tagSize;
      t.nameIid = b->tagName;
      t.device = -1;
      t.threadId = stepBegin.threadId;
      t.tsNs = stepBegin.tsNs;
      t.seq = seq++;
      out.push_back(t);
    }
    b->sent = true;
    b->restatedAt = a.seq;
    m_unsentLive.fetch_sub(1, std::memory_order_relaxed);
  }
  m_restated.fetch_add(unsent.size(), std::memory_order_relaxed);
}

void CaptureFilter::forward(const Record& r, std::vector<Record>& out) {
  flushRun(out);
  out.push_back(r);
}

void CaptureFilter::forwardAfter(const Record& r, uint64_t restatedAt, std::vector<Record>& out) {
  if (r.seq > restatedAt) {
    forward(r, out);
    return;
  }
  leaveOut(r, out);  // its own number is told as summarized; the event goes under a new one
  Record moved = r;
  moved.seq = takeSeqs(1);
  forward(moved, out);
}

void CaptureFilter::leaveOut(const Record& r, std::vector<Record>& out) {
  m_summarized.fetch_add(1, std::memory_order_relaxed);
  if (m_stepSummarized) ++m_stepEvents;
  if (m_runFirst != 0 && r.seq == m_runLast + 1) {
    m_runLast = r.seq;
    return;
  }
  flushRun(out);
  m_runFirst = m_runLast = r.seq;
  m_runTsNs = r.tsNs;
}

void CaptureFilter::tellUnused(uint64_t first, uint64_t last, const Record& at,
                               std::vector<Record>& out) {
  if (first > last) return;
  flushRun(out);
  Record s{};
  s.kind = RecordKind::kSummarized;
  s.small = 1;  // numbers reserved and not used, no events
  s.seq = first;
  s.address = last;
  s.tsNs = at.tsNs;
  s.threadId = at.threadId;
  s.device = -1;
  out.push_back(s);
}

void CaptureFilter::flushRun(std::vector<Record>& out) {
  if (m_runFirst == 0) return;
  Record s{};
  s.kind = RecordKind::kSummarized;
  s.seq = m_runFirst;
  s.address = m_runLast;
  s.tsNs = m_runTsNs;
  s.device = -1;
  out.push_back(s);
  m_runFirst = m_runLast = 0;
}

}  // namespace tidemark::agent
