#include "server/ingest/session_ingest.h"

#include <algorithm>
#include <utility>

namespace tidemark::server {

namespace {
struct StatInfo {
  const char* name;
  const char* severity;
  const char* description;
};
// Every counter the ingest can raise, with what it means.
constexpr StatInfo kStatInfo[] = {
    {"free_of_untracked", "info",
     "frees of addresses with no live block (allocated before recording began)"},
    {"alloc_over_live", "error", "allocs at an address whose block was never freed"},
    {"seq_gap", "data_loss", "sequence numbers never received (events lost in transit)"},
    {"scope_end_unmatched", "error", "scope ends without a matching begin"},
    {"phase_end_unmatched", "error", "phase ends without a matching begin"},
    {"step_end_unmatched", "error", "step ends without a matching begin"},
    {"reorder_overflow", "data_loss", "events released early because the reorder buffer was full"},
    {"released_late", "error",
     "events that came after the reorder buffer had given up waiting for them (released out of "
     "order; counted in seq_gap no longer)"},
    {"events_summarized", "info",
     "events a capture schedule measured into step summaries in the agent and did not send "
     "(tidemark run --steps / --every): not lost"},
    {"blocks_restated", "info",
     "blocks allocated while the agent summarized and sent when full detail began (their "
     "allocation time is that moment)"},
    {"summarized_overlap", "error",
     "events that came with sequence numbers the agent had said it summarized (released as "
     "they came)"},
    {"batches_resent", "info",
     "batches the agent sent again after a reconnect that were already stored (skipped)"},
};
}  // namespace

absl::Status SessionIngest::addBatch(const v1::EventBatch& batch) {
  if (batch.batch_seq() < m_nextBatchSeq) {
    count("batches_resent");
    return absl::OkStatus();
  }
  if (batch.batch_seq() != m_nextBatchSeq) {
    return absl::InvalidArgumentError("batch_seq " + std::to_string(batch.batch_seq()) + " where " +
                                      std::to_string(m_nextBatchSeq) + " was expected");
  }
  uint64_t stringBytes = 0;
  for (const v1::InternedString& s : batch.strings()) {
    if (s.iid() == 0) return absl::InvalidArgumentError("interned string with id 0");
    if (s.value().size() > kMaxStringBytes) {
      return absl::InvalidArgumentError("interned string " + std::to_string(s.iid()) + " of " +
                                        std::to_string(s.value().size()) +
                                        " bytes is over the limit of 65536");
    }
    stringBytes += s.value().size();
  }
  if (m_stringBytes + stringBytes > kMaxSessionStringBytes) {
    return absl::InvalidArgumentError(
        "the session's interned strings would pass the limit of 64 MiB");
  }
  std::vector<uint64_t> seqs;
  seqs.reserve(static_cast<size_t>(batch.events_size()));
  for (const v1::Event& e : batch.events()) {
    seqs.push_back(e.seq());
    if (e.payload_case() == v1::Event::PAYLOAD_NOT_SET) {
      return absl::InvalidArgumentError("event seq " + std::to_string(e.seq()) + " has no payload");
    }
    if (e.seq() == 0) return absl::InvalidArgumentError("event with sequence number 0");
    const uint64_t size =
        e.has_alloc() ? e.alloc().size_bytes() : (e.has_tag() ? e.tag().size_bytes() : 0);
    if (size > kMaxSizeBytes) {
      return absl::InvalidArgumentError("event seq " + std::to_string(e.seq()) + ": size " +
                                        std::to_string(size) + " bytes is over the limit of " +
                                        std::to_string(kMaxSizeBytes) + " (256 TiB)");
    }
    if (e.has_summarized() && (e.summarized().last_seq() < e.seq() ||
                               e.summarized().last_seq() - e.seq() >= kMaxSummarizedRange)) {
      return absl::InvalidArgumentError("event seq " + std::to_string(e.seq()) +
                                        ": a summarized range ending before it begins or "
                                        "longer than 2^40");
    }
    if ((e.seq() < m_nextSeq && !inSkippedGap(e.seq())) || m_pending.count(e.seq()) != 0) {
      return absl::InvalidArgumentError("sequence number " + std::to_string(e.seq()) +
                                        " received twice");
    }
  }
  std::sort(seqs.begin(), seqs.end());
  if (std::adjacent_find(seqs.begin(), seqs.end()) != seqs.end()) {
    return absl::InvalidArgumentError("a sequence number appears twice in one batch");
  }
  // Validated as a whole: a refused batch leaves nothing half-applied.
  ++m_nextBatchSeq;
  m_stringBytes += stringBytes;
  m_rowStringBytes += stringBytes;
  adoptRebuiltLive();
  for (const v1::InternedString& s : batch.strings()) {
    m_rows.strings.emplace_back(s.iid(), s.value());
    if (m_live) {
      m_live->name(s.iid(), s.value());
    } else if (m_rebuild) {
      m_rebuild->logName(s.iid(), s.value());
    }
  }
  m_rows.eventsReceived += batch.events_size();
  if (batch.has_counters()) {
    m_agentCounters = batch.counters();
    // Only the counters this build knows go into the checkpoint: whatever else an agent put in
    // the message is not kept for the rest of the session.
    m_agentCounters->DiscardUnknownFields();
  }
  for (const v1::Event& e : batch.events()) {
    // The common case: the agent sends events in order, so the next one is released at once
    // without a trip through the reorder buffer.
    if (e.seq() == m_nextSeq && m_pending.empty()) {
      m_nextSeq = seqAfter(e);
      release(e);
    } else if (e.seq() < m_nextSeq && !inSkippedGap(e.seq())) {
      // Inside a range this batch said summarized: released as it comes, counted.
      count("summarized_overlap");
      release(e);
    } else if (e.seq() < m_nextSeq) {
      // Late: the reorder buffer gave up waiting for it (its gap was counted); released now,
      // out of order, and no longer counted as lost.
      takeFromSkippedGap(e.seq());
      count("released_late");
      count("seq_gap", -1);
      release(e);
    } else {
      m_pending.emplace(e.seq(), e);
      releaseReady();
    }
  }
  return absl::OkStatus();
}

void SessionIngest::releaseReady() {
  while (!m_pending.empty()) {
    auto it = m_pending.begin();
    if (it->first < m_nextSeq) {
      // Inside a range the agent said it summarized: released as it came, counted.
      count("summarized_overlap");
      release(it->second);
      m_pending.erase(it);
      continue;
    }
    if (it->first != m_nextSeq) {
      if (m_pending.size() <= kMaxPendingEvents) break;
      count("reorder_overflow");
      count("seq_gap", static_cast<int64_t>(it->first - m_nextSeq));
      // Remembered: an event of the gap that still comes is late, not a duplicate.
      m_skippedGaps[m_nextSeq] = it->first;
      while (m_skippedGaps.size() > kMaxSkippedGaps) m_skippedGaps.erase(m_skippedGaps.begin());
    }
    m_nextSeq = seqAfter(it->second);
    release(it->second);
    m_pending.erase(it);
  }
}

bool SessionIngest::inSkippedGap(uint64_t seq) const {
  auto it = m_skippedGaps.upper_bound(seq);
  if (it == m_skippedGaps.begin()) return false;
  --it;
  return seq >= it->first && seq < it->second;
}

void SessionIngest::takeFromSkippedGap(uint64_t seq) {
  auto it = m_skippedGaps.upper_bound(seq);
  if (it == m_skippedGaps.begin()) return;
  --it;
  const uint64_t begin = it->first;
  const uint64_t end = it->second;
  if (seq < begin || seq >= end) return;
  m_skippedGaps.erase(it);
  if (begin < seq) m_skippedGaps[begin] = seq;
  if (seq + 1 < end) m_skippedGaps[seq + 1] = end;
}

void SessionIngest::release(const v1::Event& e) {
  m_lastTs = std::max(m_lastTs, e.ts_ns());
  switch (e.payload_case()) {
    case v1::Event::kAlloc: {
      const v1::Alloc& a = e.alloc();
      BlockRow b;
      b.address = a.address();
      b.sizeBytes = a.size_bytes();
      b.memoryKind = a.kind() == v1::MEMORY_KIND_UNSPECIFIED ? 1 : a.kind();
      b.device = a.device();
      b.stream = a.stream();
      b.threadId = e.thread_id();
      b.allocSeq = e.seq();
      b.allocTsNs = e.ts_ns();
      if (a.restated()) count("blocks_restated");
      const OpenKey key{b.memoryKind, b.device, b.address};
      auto [it, inserted] = m_open.try_emplace(key, b);
      if (!inserted) {
        // The old block's free was never seen: keep it as live, start the new one.
        count("alloc_over_live");
        m_rows.blocks.push_back(it->second);
        m_rows.eventsStored += 1;
        it->second = b;
        noteClosed(key);
      }
      noteOpened(key);
      if (!feedingLive()) break;
      core::LiveCall c;
      c.kind = core::LiveCall::Kind::kAlloc;
      c.memoryKind = core::memoryKindFromWire(b.memoryKind);
      c.device = b.device;
      c.threadId = b.threadId;
      c.address = b.address;
      c.sizeBytes = b.sizeBytes;
      c.seq = b.allocSeq;
      c.tsNs = b.allocTsNs;
      c.iid = innermostScope(b.threadId, v1::SCOPE_KIND_MODULE);
      c.opIid = innermostScope(b.threadId, v1::SCOPE_KIND_OP);
      feedLive(c);
      break;
    }
    case v1::Event::kFree: {
      const v1::Free& f = e.free();
      const int32_t kind = f.kind() == v1::MEMORY_KIND_UNSPECIFIED ? 1 : f.kind();
      auto it = m_open.find(OpenKey{kind, f.device(), f.address()});
      if (it == m_open.end()) {
        count("free_of_untracked");
        break;
      }
      BlockRow b = it->second;
      noteClosed(it->first);
      m_open.erase(it);
      b.freeSeq = e.seq();
      b.freeTsNs = e.ts_ns();
      m_rows.blocks.push_back(b);
      m_rows.eventsStored += 2;
      if (feedingLive()) {
        core::LiveCall c;
        c.kind = core::LiveCall::Kind::kFree;
        c.memoryKind = core::memoryKindFromWire(kind);
        c.device = f.device();
        c.address = f.address();
        c.seq = e.seq();
        c.tsNs = e.ts_ns();
        feedLive(c);
      }
      break;
    }
    case v1::Event::kScopeBegin: {
      auto& stack = m_scopeStacks[stackKey(e.thread_id(), e.scope_begin().kind())];
      IntervalRow row;
      row.kind = e.scope_begin().kind();
      row.nameIid = e.scope_begin().name_iid();
      row.correlationId = e.scope_begin().correlation_id();
      row.depth = static_cast<int>(stack.size());
      openInterval(stack, row, e);
      if (feedingLive() && (row.kind == v1::SCOPE_KIND_MODULE || row.kind == v1::SCOPE_KIND_OP)) {
        core::LiveCall c;
        c.kind = row.kind == v1::SCOPE_KIND_MODULE ? core::LiveCall::Kind::kModuleBegin
                                                   : core::LiveCall::Kind::kOpScopeSeen;
        c.seq = e.seq();
        c.iid = row.nameIid;
        feedLive(c);
      }
      break;
    }
    case v1::Event::kScopeEnd: {
      const uint32_t name = e.scope_end().name_iid();
      const size_t closedFrom = m_rows.scopes.size();
      if (!closeInnermost(
              m_scopeStacks[stackKey(e.thread_id(), e.scope_end().kind())],
              [name](const IntervalRow& r) { return r.nameIid == name; }, e, m_rows.scopes)) {
        count("scope_end_unmatched");
      }
      for (size_t i = closedFrom; i < m_rows.scopes.size(); ++i) {
        if (feedingLive() && m_rows.scopes[i].kind == v1::SCOPE_KIND_MODULE) {
          core::LiveCall c;
          c.kind = core::LiveCall::Kind::kModuleEnd;
          c.seq = m_rows.scopes[i].beginSeq;
          feedLive(c);
        }
      }
      break;
    }
    case v1::Event::kPhaseBegin: {
      IntervalRow row;
      row.phase = e.phase_begin().phase();
      openInterval(m_phaseStacks[e.thread_id()], row, e);
      if (feedingLive()) {
        core::LiveCall c;
        c.kind = core::LiveCall::Kind::kPhaseBegin;
        c.seq = e.seq();
        c.phase = core::phaseFromWire(row.phase).value_or(core::Phase::kNone);
        feedLive(c);
      }
      break;
    }
    case v1::Event::kPhaseEnd: {
      const int phase = e.phase_end().phase();
      const size_t closedFrom = m_rows.phases.size();
      if (!closeInnermost(
              m_phaseStacks[e.thread_id()],
              [phase](const IntervalRow& r) { return r.phase == phase; }, e, m_rows.phases)) {
        count("phase_end_unmatched");
      }
      for (size_t i = closedFrom; i < m_rows.phases.size() && feedingLive(); ++i) {
        core::LiveCall c;
        c.kind = core::LiveCall::Kind::kPhaseEnd;
        c.seq = m_rows.phases[i].beginSeq;
        c.endSeq = m_rows.phases[i].endSeq;
        feedLive(c);
      }
      break;
    }
    case v1::Event::kStepBegin: {
      StepRow s;
      s.step = e.step_begin().step();
      s.beginSeq = e.seq();
      s.beginTsNs = e.ts_ns();
      m_openSteps[s.step] = s;
      if (feedingLive())
        feedLive(core::LiveCall::stepMark(core::LiveCall::Kind::kStepBegin, s.step, s.beginSeq,
                                          s.beginTsNs));
      break;
    }
    case v1::Event::kStepEnd: {
      auto it = m_openSteps.find(e.step_end().step());
      if (it == m_openSteps.end()) {
        count("step_end_unmatched");
        break;
      }
      StepRow s = it->second;
      m_openSteps.erase(it);
      s.endSeq = e.seq();
      s.endTsNs = e.ts_ns();
      m_rows.steps.push_back(s);
      m_rows.eventsStored += 2;
      if (feedingLive())
        feedLive(
            core::LiveCall::stepMark(core::LiveCall::Kind::kStepEnd, s.step, s.endSeq, s.endTsNs));
      break;
    }
    case v1::Event::kTag: {
      const v1::Tag& t = e.tag();
      TagRow row;
      row.seq = e.seq();
      row.tsNs = e.ts_ns();
      row.address = t.address();
      row.sizeBytes = t.size_bytes();
      row.category = t.category();
      row.nameIid = t.name_iid();
      m_rows.tags.push_back(row);
      if (feedingLive()) {
        core::LiveCall c;
        c.kind = core::LiveCall::Kind::kTag;
        c.seq = row.seq;
        c.address = row.address;
        c.category = core::categoryFromWire(row.category).value_or(core::Category::kUnknown);
        c.iid = row.nameIid;
        feedLive(c);
      }
      m_rows.eventsStored += 1;
      break;
    }
    case v1::Event::kStack: {
      StackRow row;
      row.seq = e.seq();
      row.tsNs = e.ts_ns();
      row.address = e.stack().address();
      row.framesIid = e.stack().frames_iid();
      m_rows.stacks.push_back(row);
      m_rows.eventsStored += 1;
      break;
    }
    case v1::Event::kLaunch: {
      LaunchRow row;
      row.seq = e.seq();
      row.tsNs = e.ts_ns();
      row.threadId = e.thread_id();
      row.correlationId = e.launch().correlation_id();
      m_rows.launches.push_back(row);
      m_rows.eventsStored += 1;
      break;
    }
    case v1::Event::kCounter: {
      CounterRow row;
      row.seq = e.seq();
      row.tsNs = e.ts_ns();
      row.nameIid = e.counter().name_iid();
      row.value = e.counter().value();
      m_rows.counters.push_back(row);
      m_rows.eventsStored += 1;
      break;
    }
    case v1::Event::kSummarized:
      if (!e.summarized().unused()) {
        count("events_summarized", static_cast<int64_t>(e.summarized().last_seq() - e.seq() + 1));
      }
      break;
    case v1::Event::kStepFigure: {
      const v1::StepFigure& f = e.step_figure();
      StepFigureRow row;
      row.step = f.step();
      row.device = f.device();
      row.figure = f.figure();
      row.category = f.category();
      row.tsNs = e.ts_ns();
      row.value = f.value();
      m_rows.stepFigures.push_back(row);
      m_rows.eventsStored += 1;
      break;
    }
    case v1::Event::PAYLOAD_NOT_SET:
      break;
  }
}

void SessionIngest::openInterval(std::vector<IntervalRow>& stack, IntervalRow row,
                                 const v1::Event& e) {
  row.threadId = e.thread_id();
  row.beginSeq = e.seq();
  row.beginTsNs = e.ts_ns();
  stack.push_back(row);
}

template <typename Match>
bool SessionIngest::closeInnermost(std::vector<IntervalRow>& stack, Match match, const v1::Event& e,
                                   std::vector<IntervalRow>& out) {
  size_t i = stack.size();
  while (i > 0 && !match(stack[i - 1])) --i;
  if (i == 0) return false;
  // Intervals left open inside the matched one end with it (an exception skipped their end).
  while (stack.size() >= i) {
    IntervalRow row = stack.back();
    row.endSeq = e.seq();
    row.endTsNs = e.ts_ns();
    out.push_back(row);
    m_rows.eventsStored += stack.size() == i ? 2 : 1;
    stack.pop_back();
  }
  return true;
}

void SessionIngest::rebuildLive(LiveRebuild::Options options, v1::IngestCheckpoint state,
                                std::vector<BlockRow> open) {
  if (m_live) return;
  m_rebuild = std::make_unique<LiveRebuild>(std::move(options), std::move(state), std::move(open));
}

void SessionIngest::adoptRebuiltLive() const {
  if (!m_rebuild) return;
  if (m_rebuild->failed()) {
    m_rebuild.reset();
    return;
  }
  if (auto live = m_rebuild->takeIfCaughtUp()) {
    m_live = std::move(live);
    m_rebuild.reset();
  }
}

void SessionIngest::feedLive(const core::LiveCall& c) {
  if (m_live) {
    c.applyTo(*m_live);
  } else if (m_rebuild && !m_rebuild->log(c)) {
    m_rebuild.reset();  // given up: the session answers from its recording
  }
}

SessionRows SessionIngest::takeRows() {
  adoptRebuiltLive();
  if (m_live) {
    for (core::TimelineChunk& c : m_live->takeChunks())
      m_rows.timelineChunks.push_back(std::move(c));
    for (auto& c : m_live->takeBlockCodes()) m_rows.blockCodes.push_back(std::move(c));
    for (core::SharedPeakReport& p : m_live->takeStepPeaks())
      m_rows.stepPeaks.push_back(std::move(p));
  }
  SessionRows out;
  out.sessionId = m_rows.sessionId;
  std::swap(out, m_rows);
  m_rowStringBytes = 0;
  return out;
}

SessionRows SessionIngest::finish() {
  // Whatever is left is released in order; the holes are lost events.
  while (!m_pending.empty()) {
    auto it = m_pending.begin();
    if (it->first > m_nextSeq) count("seq_gap", static_cast<int64_t>(it->first - m_nextSeq));
    if (it->first < m_nextSeq) count("summarized_overlap");
    m_nextSeq = std::max(m_nextSeq, seqAfter(it->second));
    release(it->second);
    m_pending.erase(it);
  }
  // Live blocks in allocation order (the map's order is the hash's, not reproducible).
  const size_t firstLive = m_rows.blocks.size();
  for (auto& [address, b] : m_open) {
    m_rows.blocks.push_back(b);
    m_rows.eventsStored += 1;
  }
  std::sort(m_rows.blocks.begin() + static_cast<long>(firstLive), m_rows.blocks.end(),
            [](const BlockRow& a, const BlockRow& b) { return a.allocSeq < b.allocSeq; });
  m_liveAtEnd = static_cast<int64_t>(m_open.size());
  m_open.clear();
  for (auto& [key, stack] : m_scopeStacks) {
    for (const IntervalRow& row : stack) m_rows.scopes.push_back(row);
    m_rows.eventsStored += static_cast<int64_t>(stack.size());
    stack.clear();
  }
  for (auto& [thread, stack] : m_phaseStacks) {
    for (const IntervalRow& row : stack) m_rows.phases.push_back(row);
    m_rows.eventsStored += static_cast<int64_t>(stack.size());
    stack.clear();
  }
  for (auto& [step, s] : m_openSteps) {
    m_rows.steps.push_back(s);
    m_rows.eventsStored += 1;
  }
  m_openSteps.clear();
  m_rebuild.reset();  // not caught up: the pass analyses the session
  if (m_live) m_liveFinal = m_live->finish();
  return takeRows();
}

std::vector<StatRow> SessionIngest::stats() const {
  std::vector<StatRow> out;
  for (const StatInfo& info : kStatInfo) {
    auto it = m_stats.find(info.name);
    if (it == m_stats.end() || it->second == 0) continue;
    out.push_back({info.name, info.severity, it->second, info.description});
  }
  return out;
}

}  // namespace tidemark::server
