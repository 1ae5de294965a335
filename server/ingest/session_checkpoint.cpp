// SessionIngest's state to and from the store's checkpoint (tidemark.v1.IngestCheckpoint).
#include <algorithm>

#include "server/ingest/session_ingest.h"

namespace tidemark::server {

namespace {
void toProto(const IntervalRow& r, v1::CheckpointInterval* p) {
  p->set_thread_id(r.threadId);
  p->set_name_iid(r.nameIid);
  p->set_phase(r.phase);
  p->set_depth(r.depth);
  p->set_kind(r.kind);
  p->set_correlation_id(r.correlationId);
  p->set_begin_seq(r.beginSeq);
  p->set_begin_ts_ns(r.beginTsNs);
}

IntervalRow fromProto(const v1::CheckpointInterval& p) {
  IntervalRow r;
  r.threadId = p.thread_id();
  r.nameIid = p.name_iid();
  r.phase = p.phase();
  r.depth = p.depth();
  r.kind = p.kind();
  r.correlationId = p.correlation_id();
  r.beginSeq = p.begin_seq();
  r.beginTsNs = p.begin_ts_ns();
  return r;
}

template <typename Map>
void stacksToProto(const Map& stacks,
                   google::protobuf::RepeatedPtrField<v1::CheckpointStack>* out) {
  for (const auto& [key, stack] : stacks) {
    if (stack.empty()) continue;
    v1::CheckpointStack* s = out->Add();
    s->set_key(key);
    for (const IntervalRow& r : stack) toProto(r, s->add_open());
  }
}
}  // namespace

SessionIngest::Checkpoint SessionIngest::takeCheckpoint(bool full) {
  Checkpoint out;
  out.full = full;
  v1::IngestCheckpoint& c = out.state;
  c.set_next_batch_seq(m_nextBatchSeq);
  c.set_next_seq(m_nextSeq);
  c.set_last_ts_ns(m_lastTs);
  c.set_string_bytes(m_stringBytes);
  for (const auto& [seq, e] : m_pending) *c.add_pending() = e;
  for (const auto& [begin, end] : m_skippedGaps) {
    c.add_skipped_gaps(begin);
    c.add_skipped_gaps(end);
  }
  if (full) {
    out.opened.reserve(m_open.size());
    for (const auto& [k, b] : m_open) out.opened.push_back(b);
  } else {
    out.opened.reserve(m_openedSinceCheckpoint.size());
    for (const OpenKey& k : m_openedSinceCheckpoint) out.opened.push_back(m_open.at(k));
    out.closed.reserve(m_closedSinceCheckpoint.size());
    for (const OpenKey& k : m_closedSinceCheckpoint) {
      BlockRow b;
      b.memoryKind = k.kind;
      b.device = k.device;
      b.address = k.address;
      out.closed.push_back(b);
    }
  }
  m_openedSinceCheckpoint.clear();
  m_closedSinceCheckpoint.clear();
  stacksToProto(m_scopeStacks, c.mutable_scope_stacks());
  stacksToProto(m_phaseStacks, c.mutable_phase_stacks());
  for (const auto& [step, s] : m_openSteps) {
    v1::CheckpointStep* p = c.add_open_steps();
    p->set_step(s.step);
    p->set_begin_seq(s.beginSeq);
    p->set_begin_ts_ns(s.beginTsNs);
  }
  for (const auto& [name, value] : m_stats) (*c.mutable_stats())[name] = value;
  if (m_agentCounters) *c.mutable_agent_counters() = *m_agentCounters;
  return out;
}

absl::Status SessionIngest::restore(const v1::IngestCheckpoint& c,
                                    const std::vector<BlockRow>& open, KeptLive kept) {
  if (c.next_batch_seq() == 0 || c.next_seq() == 0) {
    return absl::DataLossError("the session's checkpoint is damaged (sequence number 0)");
  }
  // A kept analysis that stands elsewhere (a later commit failed, or another daemon of a shared
  // store went on with the session) would count events twice or miss some: what came before
  // the checkpoint is then in the store only.
  const bool sameCut =
      kept.analysis && kept.nextBatchSeq == c.next_batch_seq() && kept.nextEventSeq == c.next_seq();
  m_live = sameCut ? std::move(kept.analysis) : nullptr;
  m_rebuild.reset();
  m_nextBatchSeq = c.next_batch_seq();
  m_nextSeq = c.next_seq();
  m_lastTs = c.last_ts_ns();
  m_stringBytes = c.string_bytes();
  m_pending.clear();
  for (const v1::Event& e : c.pending()) m_pending.emplace(e.seq(), e);
  m_skippedGaps.clear();
  for (int i = 0; i + 1 < c.skipped_gaps_size(); i += 2) {
    m_skippedGaps[c.skipped_gaps(i)] = c.skipped_gaps(i + 1);
  }
  m_open.clear();
  m_open.reserve(open.size());
  for (const BlockRow& b : open) m_open[OpenKey{b.memoryKind, b.device, b.address}] = b;
  m_openedSinceCheckpoint.clear();
  m_closedSinceCheckpoint.clear();
  m_scopeStacks.clear();
  for (const v1::CheckpointStack& s : c.scope_stacks()) {
    auto& stack = m_scopeStacks[s.key()];
    for (const v1::CheckpointInterval& r : s.open()) stack.push_back(fromProto(r));
  }
  m_phaseStacks.clear();
  for (const v1::CheckpointStack& s : c.phase_stacks()) {
    auto& stack = m_phaseStacks[static_cast<uint32_t>(s.key())];
    for (const v1::CheckpointInterval& r : s.open()) stack.push_back(fromProto(r));
  }
  m_openSteps.clear();
  for (const v1::CheckpointStep& p : c.open_steps()) {
    StepRow s;
    s.step = p.step();
    s.beginSeq = p.begin_seq();
    s.beginTsNs = p.begin_ts_ns();
    m_openSteps[s.step] = s;
  }
  m_stats.clear();
  for (const auto& [name, value] : c.stats()) m_stats[name] = value;
  m_agentCounters.reset();
  if (c.has_agent_counters()) m_agentCounters = c.agent_counters();
  return absl::OkStatus();
}

}  // namespace tidemark::server
