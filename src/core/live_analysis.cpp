#include "src/core/live_analysis.h"

#include <algorithm>
#include <functional>

namespace tidemark::core {

namespace {
uint8_t codeOf(Category c, CategoryRule r) {
  return static_cast<uint8_t>(static_cast<int>(c) | (static_cast<int>(r) << 4));
}
Category categoryOf(uint8_t code) { return static_cast<Category>(code & 0xf); }
CategoryRule ruleOf(uint8_t code) { return static_cast<CategoryRule>(code >> 4); }
const std::string kNoName;
}  // namespace

LiveAnalysis::LiveAnalysis(size_t maxWindowEdges)
    : m_maxWindowEdges(std::max<size_t>(maxWindowEdges, 1024)),
      m_timeline(1, [this](int level, int64_t, const std::vector<TimelineSample>& samples) {
        const auto l = static_cast<size_t>(level);
        if (m_levels.size() <= l) {
          m_levels.resize(l + 1);
          m_dropped.resize(l + 1, false);
        }
        // As the analysis pass stores them: chunks of kSamplesPerChunk.
        if (m_chunkPending.size() <= l) {
          m_chunkPending.resize(l + 1);
          m_chunkIndex.resize(l + 1, 0);
        }
        if (m_storeOutput) {
          auto& chunk = m_chunkPending[l];
          chunk.insert(chunk.end(), samples.begin(), samples.end());
          if (chunk.size() >= AnalysisSink::kSamplesPerChunk)
            m_chunksOut.push_back({level, m_chunkIndex[l]++, std::exchange(chunk, {})});
        }
        if (m_dropped[l]) return true;
        m_levels[l].insert(m_levels[l].end(), samples.begin(), samples.end());
        if (m_levels[l].size() > kMaxLevelSamples) {  // the next level holds half as many
          m_levels[l] = {};
          m_dropped[l] = true;
        }
        return true;
      }) {}

LiveAnalysis::~LiveAnalysis() = default;

void LiveAnalysis::name(uint32_t iid, std::string text) { m_names[iid] = std::move(text); }

const std::string& LiveAnalysis::nameOf(uint32_t iid) const {
  auto it = m_names.find(iid);
  return it == m_names.end() ? kNoName : it->second;
}

void LiveAnalysis::push(EdgeKind kind, uint64_t seq, int64_t tsNs, int64_t id) {
  ++m_version;
  if (seq < m_lastSeq) inexact("events released out of order");
  m_lastSeq = std::max(m_lastSeq, seq);
  m_window.push_back({kind, seq, tsNs, id, scopeNow(), phaseNow()});
  if (m_window.size() >= m_maxWindowEdges) commitWindow(m_maxWindowEdges / 4);
}

void LiveAnalysis::alloc(const Block& b, uint32_t moduleIid, uint32_t opIid) {
  if (m_firstTs == 0) m_firstTs = b.allocTsNs;
  m_lastTs = std::max(m_lastTs, b.allocTsNs);
  const int64_t id = m_nextId++;
  LiveBlock& lb = m_blocks[id];
  lb.block = b;
  lb.block.id = id;
  lb.block.freeSeq = kOpenSeq;
  lb.moduleIid = moduleIid;
  lb.opIid = opIid;
  if (!m_openPhases.empty()) lb.phase = m_openPhases.rbegin()->second;
  // A block at a key still live: its free was never seen (the ingest keeps it as live for good,
  // its row written now: the pass must run to put the categories in that order).
  auto [key, added] =
      m_byKey.try_emplace(BlockKey{static_cast<int32_t>(b.kind), b.device, b.address}, id);
  if (!added) {
    key->second = id;
    inexact("an allocation over a live block");
    m_codesKept = false;
    m_rowOrder.clear();
  }
  m_byAddress[b.address] = id;
  if (b.kind != MemoryKind::kTensor) {
    m_segments[{b.device, b.address}] = id;
  } else {
    if (m_tensorDevices.insert(b.device).second &&
        m_committed.devicesWithDeviceBlocks.count(b.device) > 0)
      inexact("device memory counted before the device's first tensor");
    auto it = m_segments.upper_bound({b.device, b.address});
    if (it != m_segments.begin()) {
      --it;
      auto seg = m_blocks.find(it->second);
      if (seg != m_blocks.end() && it->first.first == b.device &&
          b.address < seg->second.block.address + seg->second.block.sizeBytes) {
        lb.segment = it->second;
        seg->second.isSegment = true;
      }
    }
  }
  push(EdgeKind::kAlloc, b.allocSeq, b.allocTsNs, id);
}

void LiveAnalysis::free(MemoryKind kind, int32_t device, uint64_t address, uint64_t seq,
                        int64_t tsNs) {
  auto key = m_byKey.find(BlockKey{static_cast<int32_t>(kind), device, address});
  if (key == m_byKey.end()) return;  // allocated before the recording began
  const int64_t id = key->second;
  m_byKey.erase(key);
  m_lastTs = std::max(m_lastTs, tsNs);
  LiveBlock& b = m_blocks.at(id);
  b.block.freeSeq = seq;
  b.block.freeTsNs = tsNs;
  for (auto p = m_openPhases.upper_bound(b.block.allocSeq); p != m_openPhases.end(); ++p) {
    if (p->second->phase == Phase::kBackward) b.freedByBackward = true;
  }
  if (m_codesKept) m_rowOrder.push_back(id);
  auto a = m_byAddress.find(address);
  if (a != m_byAddress.end() && a->second == id) m_byAddress.erase(a);
  if (kind != MemoryKind::kTensor) {
    auto s = m_segments.find({device, address});
    if (s != m_segments.end() && s->second == id) m_segments.erase(s);
  }
  push(EdgeKind::kFree, seq, tsNs, id);
}

void LiveAnalysis::tag(uint64_t seq, uint64_t address, Category category, uint32_t nameIid) {
  auto a = m_byAddress.find(address);
  if (a == m_byAddress.end()) {
    ++m_tagStats.tagsUnmatched;
    return;
  }
  ++m_tagStats.tagsMatched;
  LiveBlock& b = m_blocks.at(a->second);
  if (b.tagCount == 0 || tagPriority(category) > tagPriority(b.tagCategory)) {
    b.tagCategory = category;
    b.tagName = nameIid;
  }
  ++b.tagCount;
  // Counted in a category already: from now on in the one the tag gives.
  if (b.replayed) push(EdgeKind::kRecheck, seq, m_lastTs, a->second);
}

void LiveAnalysis::phaseBegin(uint64_t beginSeq, Phase phase) {
  auto p = std::make_shared<PhaseRec>();
  p->phase = phase;
  p->beginSeq = beginSeq;
  m_openPhases[beginSeq] = std::move(p);
}

void LiveAnalysis::phaseEnd(uint64_t beginSeq, uint64_t endSeq) {
  auto it = m_openPhases.find(beginSeq);
  if (it == m_openPhases.end()) return;
  it->second->endSeq = endSeq;
  m_openPhases.erase(it);
}

void LiveAnalysis::moduleBegin(uint64_t beginSeq, uint32_t nameIid) {
  m_openModules[beginSeq] = nameIid;
}

void LiveAnalysis::moduleEnd(uint64_t beginSeq) { m_openModules.erase(beginSeq); }

void LiveAnalysis::stepBegin(int64_t step, uint64_t seq, int64_t tsNs) {
  if (m_stepIntervals.count(step) > 0) inexact("step " + std::to_string(step) + " began twice");
  if (step < m_storedBelow) inexact("step " + std::to_string(step) + " began after later ones");
  if (m_openSteps++ > 0) inexact("steps overlap");
  StepInterval s;
  s.step = step;
  s.beginSeq = seq;
  s.beginTsNs = tsNs;
  m_stepIntervals[step] = s;
  m_stepPeaks.erase(step);
  push(EdgeKind::kStepBegin, seq, tsNs, step);
}

void LiveAnalysis::stepEnd(int64_t step, uint64_t seq, int64_t tsNs) {
  auto it = m_stepIntervals.find(step);
  if (it == m_stepIntervals.end()) return;
  --m_openSteps;
  it->second.endSeq = seq;
  it->second.endTsNs = tsNs;
  push(EdgeKind::kStepEnd, seq, tsNs, step);
  commitWindow();  // the step's blocks are decided, or live past it
}

std::pair<Category, CategoryRule> LiveAnalysis::decide(const LiveBlock& b) const {
  BlockFacts f;
  f.isSegment = b.isSegment;
  f.tagCount = b.tagCount;
  f.tagCategory = b.tagCategory;
  f.workspaceCandidate =
      b.block.kind == MemoryKind::kDevice && m_tensorDevices.count(b.block.device) > 0;
  PhaseInterval phase;
  if (b.phase) {
    phase.phase = b.phase->phase;
    phase.beginSeq = b.phase->beginSeq;
    phase.endSeq = b.phase->endSeq;
    f.phase = &phase;
  }
  f.freeSeq = b.block.freeSeq;
  f.freedByBackward = b.freedByBackward;
  return decideCategory(f);
}

void LiveAnalysis::replay(ReplayState& rs, absl::flat_hash_map<int64_t, uint8_t>* overlay,
                          const std::function<void(const MemoryState&)>& onState,
                          size_t count) const {
  auto codeNow = [&](int64_t id, const LiveBlock& b) {
    if (overlay != nullptr) {
      auto o = overlay->find(id);
      if (o != overlay->end()) return o->second;
    }
    return b.code;
  };
  auto replayed = [&](int64_t id, const LiveBlock& b) {
    return b.replayed || (overlay != nullptr && overlay->count(id) > 0);
  };
  auto setCode = [&](int64_t id, const LiveBlock& b, uint8_t code) {
    if (overlay != nullptr) {
      (*overlay)[id] = code;
      return;
    }
    // commitWindow's own replay: the blocks are this analysis's, not const.
    auto& mutableBlock = const_cast<LiveBlock&>(b);
    mutableBlock.code = code;
    mutableBlock.replayed = true;
  };
  // A block counted in one category whose facts now say another: its bytes move.
  auto recategorize = [&](int64_t id, const LiveBlock& b) {
    const uint8_t was = codeNow(id, b);
    const auto [c, rule] = decide(b);
    setCode(id, b, codeOf(c, rule));
    if (c == categoryOf(was)) return;
    const auto size = static_cast<int64_t>(b.block.sizeBytes);
    const int from = categoryIndex(categoryOf(was));
    const int to = categoryIndex(c);
    rs.state.bytes[from] -= size;
    rs.state.blocks[from] -= 1;
    rs.state.bytes[to] += size;
    rs.state.blocks[to] += 1;
    ++rs.recategorized;
  };
  count = std::min(count, m_window.size());
  for (size_t i = 0; i < count; ++i) {
    const Edge& e = m_window[i];
    switch (e.kind) {
      case EdgeKind::kStepBegin: {
        OpenStep& s = rs.steps[e.id];
        s.interval = m_stepIntervals.at(e.id);
        s.best = rs.state;
        s.best.seq = e.seq;
        s.scopeIid = e.scopeIid;
        s.phase = e.phase;
        s.ended = false;
        continue;
      }
      case EdgeKind::kStepEnd: {
        auto it = rs.steps.find(e.id);
        if (it != rs.steps.end()) {
          it->second.ended = true;
          it->second.interval = m_stepIntervals.at(e.id);
        }
        continue;
      }
      case EdgeKind::kRecheck:
        recategorize(e.id, m_blocks.at(e.id));
        continue;
      case EdgeKind::kAlloc:
      case EdgeKind::kFree:
        break;
    }
    const LiveBlock& b = m_blocks.at(e.id);
    const auto size = static_cast<int64_t>(b.block.sizeBytes);
    uint8_t code;
    if (e.kind == EdgeKind::kAlloc) {
      const auto [c, rule] = decide(b);
      code = codeOf(c, rule);
      setCode(e.id, b, code);
      if (b.segment >= 0) {  // its segment holds slack from now on, if it did not yet
        auto seg = m_blocks.find(b.segment);
        if (seg != m_blocks.end() && replayed(b.segment, seg->second) &&
            categoryOf(codeNow(b.segment, seg->second)) != Category::kAllocatorSlack)
          recategorize(b.segment, seg->second);
      }
      if (b.block.kind == MemoryKind::kDevice) rs.devicesWithDeviceBlocks.insert(b.block.device);
    } else {
      code = codeNow(e.id, b);
      const auto [c, rule] = decide(b);
      if (codeOf(c, rule) != code) ++rs.diverged;  // counted as one thing, decided another
    }
    applyBlockEdge(rs.state, e.seq, e.tsNs, e.kind == EdgeKind::kAlloc ? size : -size,
                   categoryIndex(categoryOf(code)), b.segment >= 0);
    if (rs.state.trackedBytes > rs.peak.trackedBytes) {
      rs.peak = rs.state;
      rs.peakScope = e.scopeIid;
      rs.peakPhase = e.phase;
      rs.peakMoved = true;
    }
    for (auto& [step, s] : rs.steps) {
      if (!s.ended && rs.state.trackedBytes > s.best.trackedBytes) {
        s.best = rs.state;
        s.scopeIid = e.scopeIid;
        s.phase = e.phase;
      }
    }
    if (onState) onState(rs.state);
  }
}

std::vector<LiveAnalysis::ItemRow> LiveAnalysis::itemsAt(
    uint64_t seq, const absl::flat_hash_map<int64_t, uint8_t>* overlay) const {
  auto liveAt = [seq](const LiveBlock& b) {
    return b.block.allocSeq <= seq && seq < b.block.freeSeq;
  };
  absl::flat_hash_map<int64_t, int64_t> carved;  // segment -> its live tensors' bytes
  for (const auto& [id, b] : m_blocks) {
    if (b.segment >= 0 && liveAt(b)) carved[b.segment] += static_cast<int64_t>(b.block.sizeBytes);
  }
  std::vector<ItemRow> out;
  for (const auto& [id, b] : m_blocks) {
    if (!liveAt(b)) continue;
    uint8_t code = b.code;
    if (overlay != nullptr) {
      auto o = overlay->find(id);
      if (o == overlay->end() && !b.replayed) continue;
      if (o != overlay->end()) code = o->second;
    } else if (!b.replayed) {
      continue;
    }
    auto c = carved.find(id);
    out.push_back({b.moduleIid, b.opIid, b.tagCount > 0 ? b.tagName : 0u, b.block.address,
                   static_cast<int64_t>(b.block.sizeBytes) - (c == carved.end() ? 0 : c->second),
                   categoryOf(code), ruleOf(code)});
  }
  return out;
}

void LiveAnalysis::commitWindow(size_t keep) {
  if (m_window.size() <= keep) return;
  const size_t count = m_window.size() - keep;
  ++m_version;
  m_committed.peakMoved = false;
  replay(
      m_committed, nullptr, [this](const MemoryState& s) { m_timeline.add(s); }, count);
  m_recategorized = m_committed.recategorized;
  if (m_committed.peakMoved) m_peakItems = itemsAt(m_committed.peak.seq, nullptr);
  for (auto it = m_committed.steps.begin(); it != m_committed.steps.end();) {
    if (!it->second.ended) {
      ++it;
      continue;
    }
    PeakReport r;
    r.step = it->first;
    r.state = it->second.best;
    if (it->second.phase != Phase::kNone) r.phase = std::string(phaseName(it->second.phase));
    r.scope = nameOf(it->second.scopeIid);
    m_stepPeaks[it->first] = std::make_shared<const PeakReport>(std::move(r));
    m_peaksToHand.push_back(it->first);
    it = m_committed.steps.erase(it);
  }
  for (size_t i = 0; i < count; ++i) {
    const Edge& e = m_window[i];
    if (e.kind != EdgeKind::kFree) continue;
    auto it = m_blocks.find(e.id);
    if (m_codesKept) m_freedCodes[e.id] = it->second.code;
    m_blocks.erase(it);
  }
  m_window.erase(m_window.begin(), m_window.begin() + static_cast<long>(count));
  // No step yet and much held for the store: a session without step marks, which the pass
  // analyses (it infers the steps); nothing more is kept for the store.
  if (noSteps() && m_storeOutput && m_chunksOut.size() + m_codesOut.size() > kMaxHeldChunks) {
    inexact("no step marks: the pass infers the steps");
    m_storeOutput = false;
    m_chunksOut.clear();
    m_codesOut.clear();
    for (auto& c : m_chunkPending) c.clear();
    m_codesPending.clear();
  }
  // Every free of the window is replayed: the rows in line have their codes.
  while (!m_rowOrder.empty()) {
    auto c = m_freedCodes.find(m_rowOrder.front());
    if (c == m_freedCodes.end()) break;
    emitCode(c->second);
    m_freedCodes.erase(c);
    m_rowOrder.pop_front();
  }
}

const LiveAnalysis::WindowAnswer& LiveAnalysis::windowAnswer() const {
  if (m_answer.version == m_version) return m_answer;
  m_answer.rs = m_committed;
  m_answer.rs.peakMoved = false;
  m_answer.tail.clear();
  absl::flat_hash_map<int64_t, uint8_t> overlay;
  TimelineBuilder finest(
      SIZE_MAX, [this](int level, int64_t, const std::vector<TimelineSample>& samples) {
        if (level == 0) m_answer.tail.insert(m_answer.tail.end(), samples.begin(), samples.end());
        return true;
      });
  replay(m_answer.rs, &overlay, [&finest](const MemoryState& s) { finest.add(s); });
  finest.finish();
  m_answer.peakItems =
      m_answer.rs.peakMoved ? itemsAt(m_answer.rs.peak.seq, &overlay) : std::vector<ItemRow>{};
  m_answer.version = m_version;
  return m_answer;
}

PeakReport LiveAnalysis::wholePeak(size_t topItems) const {
  const WindowAnswer& w = windowAnswer();
  PeakReport r;
  r.state = w.rs.peak;
  if (w.rs.peakPhase != Phase::kNone) r.phase = std::string(phaseName(w.rs.peakPhase));
  r.scope = nameOf(w.rs.peakScope);
  PeakItemsBuilder builder(m_anyOps);
  for (const ItemRow& it : w.rs.peakMoved ? w.peakItems : m_peakItems) {
    builder.add(it.moduleIid ? &nameOf(it.moduleIid) : nullptr,
                it.opIid ? &nameOf(it.opIid) : nullptr, nameOf(it.tagIid), it.address, it.bytes,
                it.category, it.rule);
  }
  builder.finish(r, topItems);
  return r;
}

bool LiveAnalysis::answerStep(const ReplayState& rs, const StepInterval& interval,
                              StepAnswer* a) const {
  a->interval = interval;
  if (auto done = m_stepPeaks.find(interval.step); done != m_stepPeaks.end()) {
    a->peak = *done->second;
  } else if (auto open = rs.steps.find(interval.step); open != rs.steps.end()) {
    a->peak = PeakReport();
    a->peak.step = interval.step;
    a->peak.state = open->second.best;
    if (open->second.phase != Phase::kNone)
      a->peak.phase = std::string(phaseName(open->second.phase));
    a->peak.scope = nameOf(open->second.scopeIid);
  } else {
    return false;  // nothing of it replayed yet
  }
  return true;
}

std::vector<LiveAnalysis::StepAnswer> LiveAnalysis::steps() const {
  const ReplayState& rs = windowAnswer().rs;
  std::vector<StepAnswer> out;
  StepAnswer a;
  for (const auto& [step, interval] : m_stepIntervals)
    if (answerStep(rs, interval, &a)) out.push_back(std::move(a));
  return out;
}

std::vector<LiveAnalysis::StepAnswer> LiveAnalysis::stepPage(std::optional<int64_t> from,
                                                             size_t limit, bool last,
                                                             size_t* known) const {
  const ReplayState& rs = windowAnswer().rs;
  *known = m_stepIntervals.size() + m_storedSteps;
  std::vector<StepAnswer> out;
  StepAnswer a;
  if (last) {
    for (auto it = m_stepIntervals.rbegin(); it != m_stepIntervals.rend() && out.size() < limit;
         ++it)
      if (answerStep(rs, it->second, &a)) out.push_back(std::move(a));
    std::reverse(out.begin(), out.end());
    return out;
  }
  for (auto it = from ? m_stepIntervals.lower_bound(*from) : m_stepIntervals.begin();
       it != m_stepIntervals.end() && out.size() < limit; ++it)
    if (answerStep(rs, it->second, &a)) out.push_back(std::move(a));
  return out;
}

std::vector<SharedPeakReport> LiveAnalysis::takeStepPeaks() {
  const uint64_t ticket = ++m_ticket;
  std::vector<SharedPeakReport> out;
  for (int64_t step : std::exchange(m_peaksToHand, {})) {
    auto it = m_stepPeaks.find(step);
    if (it == m_stepPeaks.end()) continue;  // begun again since
    out.push_back(it->second);
    m_handed.emplace_back(ticket, step);
    m_handedSteps.insert(step);
  }
  return out;
}

void LiveAnalysis::storedThrough(uint64_t ticket) {
  while (!m_handed.empty() && m_handed.front().first <= ticket) {
    m_storedHeld.insert(m_handed.front().second);
    m_handedSteps.erase(m_handed.front().second);
    m_handed.pop_front();
  }
  // The steps from the first on that are stored and ended (one begun again is held again).
  while (!m_stepIntervals.empty()) {
    const int64_t step = m_stepIntervals.begin()->first;
    if (m_storedHeld.count(step) == 0 || m_handedSteps.count(step) > 0 ||
        m_stepPeaks.count(step) == 0)
      break;
    m_storedHeld.erase(step);
    m_stepPeaks.erase(step);
    m_stepIntervals.erase(m_stepIntervals.begin());
    m_storedBelow = step + 1;
    ++m_storedSteps;
  }
}

void LiveAnalysis::emitCode(uint8_t code) {
  if (!m_storeOutput) return;
  m_codesPending.push_back(static_cast<char>(code));
  if (m_codesPending.size() == AnalysisSink::kBlocksPerChunk)
    m_codesOut.emplace_back(m_codesChunk++, std::exchange(m_codesPending, {}));
}

LiveAnalysis::Final LiveAnalysis::finish(size_t topItems) {
  commitWindow();
  if (m_codesKept) {  // the blocks live at the end, by allocation, as the ingest writes them
    std::vector<std::pair<uint64_t, uint8_t>> live;
    for (const auto& [id, b] : m_blocks) live.emplace_back(b.block.allocSeq, b.code);
    std::sort(live.begin(), live.end());
    for (const auto& [seq, code] : live) emitCode(code);
    if (!m_codesPending.empty())
      m_codesOut.emplace_back(m_codesChunk++, std::exchange(m_codesPending, {}));
  }
  m_timeline.finish();
  for (size_t l = 0; l < m_chunkPending.size(); ++l) {
    if (!m_chunkPending[l].empty())
      m_chunksOut.push_back(
          {static_cast<int>(l), m_chunkIndex[l]++, std::exchange(m_chunkPending[l], {})});
  }
  Final f;
  f.stats = m_tagStats;
  if (m_committed.recategorized > 0) inexact("blocks moved to another category while live");
  if (m_committed.diverged > 0) inexact("blocks decided at their free otherwise than counted");
  for (const auto& [id, b] : m_blocks) {  // live at the end
    const auto [c, rule] = decide(b);
    if (b.replayed && codeOf(c, rule) != b.code) inexact("live blocks decided otherwise");
  }
  if (noSteps()) inexact("no step marks: the pass infers the steps");
  f.peaks.push_back(wholePeak(topItems));
  for (StepAnswer& s : steps()) {
    if (m_handedSteps.count(s.interval.step) > 0 || m_storedHeld.count(s.interval.step) > 0)
      continue;  // handed on with the rows
    f.peaks.push_back(std::move(s.peak));
  }
  m_peaksToHand.clear();
  f.exact = m_inexact.empty();
  f.why = m_inexact;
  return f;
}

int LiveAnalysis::keptLevels() const {
  int n = 0;
  for (size_t l = 0; l < m_levels.size(); ++l) n += !m_dropped[l] && !m_levels[l].empty();
  return n;
}

size_t LiveAnalysis::keptSamples() const {
  size_t n = 0;
  for (const auto& l : m_levels) n += l.size();
  return n;
}

size_t LiveAnalysis::heldBytes() const {
  size_t names = 0;
  for (const auto& [iid, text] : m_names) names += text.size() + 48;
  return (m_window.size() + m_blocks.size()) * kBytesPerWindowEdge +
         keptSamples() * sizeof(TimelineSample) + names +
         m_stepPeaks.size() * (sizeof(PeakReport) + 80) +
         m_stepIntervals.size() * (sizeof(StepInterval) + 48) + m_codesPending.size();
}

std::vector<TimelineBucket> LiveAnalysis::timeline(int64_t fromTs, int64_t toTs,
                                                   int buckets) const {
  if (toTs == 0) toTs = m_lastTs;
  // The window, replayed into finest samples (it is not in the levels yet).
  const std::vector<TimelineSample>& tail = windowAnswer().tail;
  // The coarsest kept level with at least `buckets` samples in the range, else the finest kept.
  auto inRange = [&](const std::vector<TimelineSample>& v) {
    auto first =
        std::lower_bound(v.begin(), v.end(), fromTs,
                         [](const TimelineSample& s, int64_t t) { return s.lastTsNs < t; });
    auto last = std::upper_bound(v.begin(), v.end(), toTs, [](int64_t t, const TimelineSample& s) {
      return t < s.firstTsNs;
    });
    return last > first ? static_cast<size_t>(last - first) : size_t{0};
  };
  int level = -1;
  for (size_t l = 0; l < m_levels.size(); ++l) {
    if (m_dropped[l] || m_levels[l].empty()) continue;
    if (level < 0 || inRange(m_levels[l]) >= static_cast<size_t>(buckets))
      level = static_cast<int>(l);
  }
  TimelineLevel all;
  if (level >= 0) all.samples = m_levels[static_cast<size_t>(level)];
  for (const TimelineSample& s : m_timeline.unemitted(std::max(level, 0))) all.samples.push_back(s);
  all.samples.insert(all.samples.end(), tail.begin(), tail.end());
  // A coarse sample across an idle stretch is read from the level below, where it is kept.
  auto finer = [this](int l, const TimelineSample& coarser) {
    if (l < 0 || static_cast<size_t>(l) >= m_levels.size() || m_dropped[static_cast<size_t>(l)])
      return std::vector<TimelineSample>{};
    return samplesWithin(m_levels[static_cast<size_t>(l)], coarser);
  };
  return foldTimeline(samplesInRange(all, fromTs, toTs), fromTs, toTs, buckets, std::max(level, 0),
                      finer);
}

}  // namespace tidemark::core
