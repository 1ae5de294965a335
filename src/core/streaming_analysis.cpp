#include "src/core/streaming_analysis.h"

#include <algorithm>
#include <deque>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>

#include "src/core/external_sort.h"
#include "src/core/scope_sweep.h"
#include "src/core/step_inference.h"

namespace tidemark::core {

namespace {

constexpr const char* kCancelled = "cancelled";
// The passes look at their cancel flag (and pace) every this many items plus one: about a
// millisecond of work.
constexpr uint64_t kCheckMask = 0xfff;
// StreamingOptions::pace of the pass running on this thread (set by analyzeStream).
thread_local const std::function<void()>* t_pace = nullptr;
bool cancelled(const std::atomic<bool>* cancel) {
  if (t_pace != nullptr && *t_pace) (*t_pace)();
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

struct ByAllocSeq {
  bool operator()(const Block& a, const Block& b) const { return a.allocSeq < b.allocSeq; }
};

// A block once its category is decided (at its free, or at the end).
struct DecidedBlock {
  int64_t id;
  uint64_t address;
  uint64_t sizeBytes;
  uint64_t allocSeq;
  int64_t allocTsNs;
  uint64_t freeSeq;
  int64_t freeTsNs;
  int64_t segmentId;  // the id of the block it lies in, -1 if none
  uint32_t threadId;
  uint32_t nameId;  // its deciding tag's name, 0 if none
  uint8_t category;
  uint8_t rule;
  bool live() const { return freeSeq == kOpenSeq; }
};
struct DecidedByAllocSeq {
  bool operator()(const DecidedBlock& a, const DecidedBlock& b) const {
    return a.allocSeq < b.allocSeq;
  }
};

struct BlockCode {
  int64_t id;
  uint8_t code;
};
struct CodeById {
  bool operator()(const BlockCode& a, const BlockCode& b) const { return a.id < b.id; }
};

using BlockSorter = ExternalSorter<Block, ByAllocSeq>;
using DecidedSorter = ExternalSorter<DecidedBlock, DecidedByAllocSeq>;
using CodeSorter = ExternalSorter<BlockCode, CodeById>;

// Answers "the innermost interval open at seq" (of those containing it, the one begun last:
// Recording::phaseAt / scopeAt) for increasing seq, from a cursor in begin order.
template <typename T>
class InnermostSweep {
 public:
  explicit InnermostSweep(std::unique_ptr<Cursor<T>> cursor) : m_cursor(std::move(cursor)) {
    m_have = m_cursor->next(m_next);
  }
  const T* at(uint64_t seq) {
    for (; m_have && m_next.beginSeq <= seq; m_have = m_cursor->next(m_next)) {
      if (m_next.endSeq > seq) m_open.push_back(m_next);
    }
    if (m_open.size() > 2 * m_sizeAfterPurge + 64) {  // drop the ended ones buried below
      std::erase_if(m_open, [seq](const T& t) { return t.endSeq <= seq; });
      m_sizeAfterPurge = m_open.size();
    }
    while (!m_open.empty()) {
      if (m_open.back().endSeq > seq) return &m_open.back();
      m_open.pop_back();
    }
    return nullptr;
  }

 private:
  std::unique_ptr<Cursor<T>> m_cursor;
  T m_next{};
  bool m_have = false;
  std::vector<T> m_open;  // begin order
  size_t m_sizeAfterPurge = 0;
};

// Of a cursor of phases, the backward ones only.
class BackwardPhases : public Cursor<PhaseInterval> {
 public:
  explicit BackwardPhases(std::unique_ptr<Cursor<PhaseInterval>> all) : m_all(std::move(all)) {}
  bool next(PhaseInterval& out) override {
    while (m_all->next(out)) {
      if (out.phase == Phase::kBackward) return true;
    }
    return false;
  }

 private:
  std::unique_ptr<Cursor<PhaseInterval>> m_all;
};

// The state of a block between its allocation and its free, while its category is not known.
struct OpenBlock {
  Block block;
  Category tagCategory = Category::kUnknown;
  uint32_t tagName = 0;
  int tagCount = 0;
  bool hasPhase = false;
  PhaseInterval phase;  // the innermost open at its allocation (when hasPhase)
  int64_t segmentId = -1;
  bool isSegment = false;
  bool freedByBackward = false;  // set at its free
};

// Pass 1: the categories, deciding each block at its free (by then every tag of it, every tensor
// in it and its phase are known), as categorize() does over the whole recording.
class Categorizer {
 public:
  Categorizer(RecordingStream& in, const std::set<int32_t>& tensorDevices, DecidedSorter& decided,
              CodeSorter& codes, const std::atomic<bool>* cancel)
      : m_cancel(cancel),
        m_in(in),
        m_tensorDevices(tensorDevices),
        m_decided(decided),
        m_codes(codes),
        m_tags(in.tags()),
        m_phases(in.phases()),
        m_backward(std::make_unique<BackwardPhases>(in.phases())) {
    m_haveTag = m_tags->next(m_tag);
  }

  bool run(BlockSorter& blocks, CategorizeStats& stats, std::string& error) {
    auto reader = blocks.read();
    Block next;
    bool haveBlock = reader.next(next);
    for (uint64_t n = 0;; ++n) {
      if ((n & kCheckMask) == 0 && cancelled(m_cancel)) {
        error = kCancelled;
        return false;
      }
      // In sequence order; at one seq, frees before allocations before tags.
      const uint64_t allocSeq = haveBlock ? next.allocSeq : kOpenSeq;
      const uint64_t tagSeq = m_haveTag ? m_tag.seq : kOpenSeq;
      const uint64_t freeSeq = m_frees.empty() ? kOpenSeq : m_frees.top().first;
      if (!haveBlock && !m_haveTag && m_frees.empty()) break;
      if (!m_frees.empty() && freeSeq <= allocSeq && freeSeq <= tagSeq) {
        const int64_t id = m_frees.top().second;
        m_frees.pop();
        if (!free(id)) return fail(error);
      } else if (haveBlock && allocSeq <= tagSeq) {
        alloc(next);
        haveBlock = reader.next(next);
      } else {
        tag(m_tag);
        m_haveTag = m_tags->next(m_tag);
      }
    }
    if (!reader.error().empty()) {
      error = reader.error();
      return false;
    }
    for (auto& [id, open] : m_open) {  // live at the end
      if (!decide(open)) return fail(error);
    }
    m_open.clear();
    stats = m_stats;
    return m_in.error().empty() || fail(error);
  }

 private:
  bool fail(std::string& error) {
    error = !m_decided.error().empty() ? m_decided.error()
            : !m_codes.error().empty() ? m_codes.error()
                                       : m_in.error();
    return false;
  }

  void alloc(const Block& b) {
    OpenBlock o;
    o.block = b;
    if (const PhaseInterval* p = m_phases.at(b.allocSeq)) {
      o.hasPhase = true;
      o.phase = *p;
    }
    m_byAddress[b.address] = b.id;
    if (b.kind != MemoryKind::kTensor) {
      m_segments[{b.device, b.address}] = b.id;
    } else {
      auto it = m_segments.upper_bound({b.device, b.address});
      if (it != m_segments.begin()) {
        --it;
        auto seg = m_open.find(it->second);
        if (seg != m_open.end() && it->first.first == b.device &&
            b.address < seg->second.block.address + seg->second.block.sizeBytes) {
          o.segmentId = it->second;
          seg->second.isSegment = true;
        }
      }
    }
    if (!b.live()) m_frees.emplace(b.freeSeq, b.id);
    m_open.emplace(b.id, o);
  }

  void tag(const TagRef& t) {
    auto it = m_byAddress.find(t.address);
    auto open = it == m_byAddress.end() ? m_open.end() : m_open.find(it->second);
    if (open == m_open.end()) {
      ++m_stats.tagsUnmatched;
      return;
    }
    ++m_stats.tagsMatched;
    OpenBlock& o = open->second;
    if (o.tagCount == 0 || tagPriority(t.category) > tagPriority(o.tagCategory)) {
      o.tagCategory = t.category;
      o.tagName = t.nameId;
    }
    ++o.tagCount;
  }

  bool free(int64_t id) {
    auto it = m_open.find(id);
    if (it == m_open.end()) return true;
    const Block& b = it->second.block;
    auto a = m_byAddress.find(b.address);
    if (a != m_byAddress.end() && a->second == id) m_byAddress.erase(a);
    if (b.kind != MemoryKind::kTensor) {
      auto s = m_segments.find({b.device, b.address});
      if (s != m_segments.end() && s->second == id) m_segments.erase(s);
    }
    const PhaseInterval* backward = m_backward.at(b.freeSeq);
    it->second.freedByBackward = backward != nullptr && backward->beginSeq > b.allocSeq;
    const bool ok = decide(it->second);
    m_open.erase(it);
    return ok;
  }

  bool decide(const OpenBlock& o) {
    const Block& b = o.block;
    BlockFacts facts;
    facts.isSegment = o.isSegment;
    facts.tagCount = o.tagCount;
    facts.tagCategory = o.tagCategory;
    facts.workspaceCandidate = b.kind == MemoryKind::kDevice && m_tensorDevices.count(b.device) > 0;
    facts.phase = o.hasPhase ? &o.phase : nullptr;
    facts.freeSeq = b.freeSeq;
    facts.freedByBackward = o.freedByBackward;
    const auto [c, rule] = decideCategory(facts);
    DecidedBlock d{b.id,
                   b.address,
                   b.sizeBytes,
                   b.allocSeq,
                   b.allocTsNs,
                   b.freeSeq,
                   b.freeTsNs,
                   o.segmentId,
                   b.threadId,
                   o.tagCount > 0 ? o.tagName : 0u,
                   static_cast<uint8_t>(c),
                   static_cast<uint8_t>(rule)};
    const auto code = static_cast<uint8_t>(static_cast<int>(c) | (static_cast<int>(rule) << 4));
    return m_decided.add(d) && m_codes.add({b.id, code});
  }

  const std::atomic<bool>* m_cancel;
  RecordingStream& m_in;
  const std::set<int32_t>& m_tensorDevices;
  DecidedSorter& m_decided;
  CodeSorter& m_codes;
  std::unique_ptr<Cursor<TagRef>> m_tags;
  TagRef m_tag;
  bool m_haveTag = false;
  InnermostSweep<PhaseInterval> m_phases;
  InnermostSweep<PhaseInterval> m_backward;  // at the frees, in their order
  std::unordered_map<int64_t, OpenBlock> m_open;
  std::priority_queue<std::pair<uint64_t, int64_t>, std::vector<std::pair<uint64_t, int64_t>>,
                      std::greater<>>
      m_frees;
  std::unordered_map<uint64_t, int64_t> m_byAddress;           // the last block allocated there
  std::map<std::pair<int32_t, uint64_t>, int64_t> m_segments;  // live blocks that are not tensors
  CategorizeStats m_stats;
};

// Replays the decided blocks in sequence order (LivenessReplay's edges, without holding them):
// fn(state) after every event, before(seq, state) just before it. False on a read error.
template <typename Before, typename After>
bool replay(const DecidedSorter& decided, const std::atomic<bool>* cancel, Before&& before,
            After&& after, std::string& error) {
  struct Free {
    uint64_t seq;
    int64_t tsNs;
    int64_t size;
    int32_t categoryIndex;
    bool fromSlack;
    bool operator>(const Free& o) const { return seq > o.seq; }
  };
  std::priority_queue<Free, std::vector<Free>, std::greater<>> frees;
  MemoryState s;
  auto apply = [&](uint64_t seq, int64_t ts, int64_t delta, int ci, bool fromSlack) {
    before(seq, static_cast<const MemoryState&>(s));
    applyBlockEdge(s, seq, ts, delta, ci, fromSlack);
    after(static_cast<const MemoryState&>(s));
  };
  auto reader = decided.read();
  DecidedBlock b;
  bool have = reader.next(b);
  for (uint64_t n = 0; have || !frees.empty(); ++n) {
    if ((n & kCheckMask) == 0 && cancelled(cancel)) {
      error = kCancelled;
      return false;
    }
    if (!frees.empty() && (!have || frees.top().seq < b.allocSeq)) {
      const Free f = frees.top();
      frees.pop();
      apply(f.seq, f.tsNs, -f.size, f.categoryIndex, f.fromSlack);
      continue;
    }
    const int ci = categoryIndex(static_cast<Category>(b.category));
    const auto size = static_cast<int64_t>(b.sizeBytes);
    const bool fromSlack = b.segmentId >= 0;
    apply(b.allocSeq, b.allocTsNs, size, ci, fromSlack);
    if (!b.live()) frees.push({b.freeSeq, b.freeTsNs, size, ci, fromSlack});
    have = reader.next(b);
  }
  error = reader.error();
  return error.empty();
}

std::vector<MemoryState> stepPeaks(const DecidedSorter& decided, const std::atomic<bool>* cancel,
                                   const std::vector<StepInterval>& steps, std::string& error) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const StepInterval& s : steps) ranges.emplace_back(s.beginSeq, s.endSeq);
  RangePeakTracker peaks(ranges);
  MemoryState last;
  replay(
      decided, cancel, [&](uint64_t seq, const MemoryState& s) { peaks.before(seq, s); },
      [&](const MemoryState& s) {
        peaks.after(s);
        last = s;
      },
      error);
  return peaks.finish(last);
}

// What is live at the whole recording's peak, by module, op and tensor (peak.cpp's fillItems).
bool fillItems(RecordingStream& in, const DecidedSorter& decided, PeakReport& report,
               size_t topItems, std::string& error) {
  const uint64_t seq = report.state.seq;
  auto liveAt = [seq](const DecidedBlock& b) { return b.allocSeq <= seq && seq < b.freeSeq; };
  std::unordered_map<int64_t, int64_t> carved;  // segment id -> its live tensors' bytes
  {
    auto reader = decided.read();
    DecidedBlock b;
    while (reader.next(b) && b.allocSeq <= seq) {
      if (b.segmentId >= 0 && liveAt(b)) carved[b.segmentId] += static_cast<int64_t>(b.sizeBytes);
    }
    if (!reader.error().empty()) {
      error = reader.error();
      return false;
    }
  }
  ThreadScopeSweep modules(in.scopes(false));
  ThreadScopeSweep ops(in.scopes(true));
  PeakItemsBuilder items(ops.any());
  std::unordered_map<uint32_t, std::string> names;
  auto nameOf = [&](const ScopeRef* s) -> const std::string* {
    if (s == nullptr) return nullptr;
    auto it = names.find(s->nameId);
    if (it == names.end()) it = names.emplace(s->nameId, in.name(s->nameId)).first;
    return &it->second;
  };
  auto reader = decided.read();
  DecidedBlock b;
  while (reader.next(b) && b.allocSeq <= seq) {
    if (!liveAt(b)) continue;
    auto c = carved.find(b.id);
    const int64_t size = static_cast<int64_t>(b.sizeBytes) - (c == carved.end() ? 0 : c->second);
    const std::string* module = nameOf(modules.innermostAt(b.threadId, b.allocSeq));
    const std::string* op = nameOf(ops.innermostAt(b.threadId, b.allocSeq));
    items.add(module, op, b.nameId != 0 ? in.name(b.nameId) : std::string(), b.address, size,
              static_cast<Category>(b.category), static_cast<CategoryRule>(b.rule));
  }
  if (!reader.error().empty()) {
    error = reader.error();
    return false;
  }
  items.finish(report, topItems);
  return true;
}

}  // namespace

StreamingResult analyzeStream(RecordingStream& in, AnalysisSink& out,
                              const StreamingOptions& options) {
  struct Pacing {
    explicit Pacing(const std::function<void()>* pace) { t_pace = pace; }
    ~Pacing() { t_pace = nullptr; }
  } pacing(&options.pace);
  StreamingResult result;
  // A third of the memory to each sort: the blocks by allocation, the decided blocks, the codes.
  const size_t share = options.memoryBytes / 3;
  BlockSorter blocks(options.tempDir, share);
  std::set<int32_t> tensorDevices;
  {
    auto cursor = in.blocks();
    Block b;
    while (cursor->next(b)) {
      if ((result.blocks & kCheckMask) == 0 && cancelled(options.cancel)) {
        result.error = kCancelled;
        return result;
      }
      if (b.kind == MemoryKind::kTensor) tensorDevices.insert(b.device);
      if (!blocks.add(b)) {
        result.error = blocks.error();
        return result;
      }
      ++result.blocks;
    }
  }
  if (!in.error().empty() || !blocks.finish()) {
    result.error = in.error().empty() ? blocks.error() : in.error();
    return result;
  }

  // 1. categories
  DecidedSorter decided(options.tempDir, share);
  {
    CodeSorter codes(options.tempDir, share);
    Categorizer categorizer(in, tensorDevices, decided, codes, options.cancel);
    if (!categorizer.run(blocks, result.stats, result.error)) return result;
    blocks.release();  // its disk space, before the next sorts' runs take theirs
    if (!decided.finish() || !codes.finish()) {
      result.error = decided.error().empty() ? codes.error() : decided.error();
      return result;
    }
    auto reader = codes.read();
    BlockCode c;
    std::string chunk;
    int64_t index = 0;
    while (reader.next(c)) {
      chunk.push_back(static_cast<char>(c.code));
      if (chunk.size() == AnalysisSink::kBlocksPerChunk) {
        if (!out.blockCodes(index++, chunk)) return result.error = "the sink failed", result;
        chunk.clear();
      }
    }
    if (!reader.error().empty()) return result.error = reader.error(), result;
    if (!chunk.empty() && !out.blockCodes(index, chunk))
      return result.error = "the sink failed", result;
  }

  // 2. one replay: the timeline, the whole peak, the steps' peaks (or the totals to find them)
  std::vector<StepInterval> steps = in.steps();
  bool infer = steps.empty();
  if (infer) {
    auto phases = in.phases();
    PhaseInterval first;
    infer = !phases->next(first);  // as stepsToInfer (step_inference.h)
    if (!in.error().empty()) return result.error = in.error(), result;
  }
  TimelineBuilder timeline(AnalysisSink::kSamplesPerChunk,
                           [&out](int level, int64_t chunk, const std::vector<TimelineSample>& s) {
                             return out.timelineChunk(level, chunk, s);
                           });
  RangePeakTracker whole({{0, kOpenSeq}});  // as LivenessReplay::peak()
  MemoryState last;
  std::deque<TotalPoint> totals;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const StepInterval& s : steps) ranges.emplace_back(s.beginSeq, s.endSeq);
  RangePeakTracker peaks(ranges);
  bool sinkOk = true;
  const bool replayed = replay(
      decided, options.cancel,
      [&](uint64_t seq, const MemoryState& s) {
        whole.before(seq, s);
        peaks.before(seq, s);
      },
      [&](const MemoryState& s) {
        whole.after(s);
        peaks.after(s);
        last = s;
        sinkOk = sinkOk && timeline.add(s);
        if (infer) {
          totals.push_back({s.seq, s.tsNs, static_cast<double>(s.trackedBytes)});
          if (totals.size() > options.maxInferencePoints) totals.pop_front();
        }
      },
      result.error);
  if (!replayed) return result;
  if (!sinkOk || !timeline.finish()) return result.error = "the sink failed", result;
  result.timelineLevels = timeline.levelCount();

  std::vector<MemoryState> stepStates = peaks.finish(last);
  if (infer) {
    result.inferredSteps = inferSteps(std::vector<TotalPoint>(totals.begin(), totals.end()));
    totals.clear();
    steps = result.inferredSteps;
    if (!steps.empty()) {  // their peaks need a second replay
      stepStates = stepPeaks(decided, options.cancel, steps, result.error);
      if (!result.error.empty()) return result;
    }
  }
  PeakReport wholePeak;
  wholePeak.state = whole.finish(last).front();
  result.peaks.push_back(wholePeak);
  for (size_t i = 0; i < steps.size(); ++i) {
    PeakReport r;
    r.step = steps[i].step;
    r.state = stepStates[i];
    result.peaks.push_back(r);
  }

  // 3. the phase and the innermost module scope at each peak (in sequence order)
  {
    std::vector<size_t> order(result.peaks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return result.peaks[a].state.seq < result.peaks[b].state.seq;
    });
    InnermostSweep<PhaseInterval> phases(in.phases());
    InnermostSweep<ScopeRef> scopes(in.scopes(false));
    for (size_t i : order) {
      PeakReport& r = result.peaks[i];
      if (const PhaseInterval* p = phases.at(r.state.seq))
        r.phase = std::string(phaseName(p->phase));
      if (const ScopeRef* s = scopes.at(r.state.seq)) r.scope = in.name(s->nameId);
    }
  }

  // 4. what is live at the whole peak
  if (!fillItems(in, decided, result.peaks.front(), options.topItems, result.error)) return result;
  if (!in.error().empty()) result.error = in.error();
  return result;
}

// ---------------------------------------------------------------------------------------------
// A recording in memory as a stream.

namespace {

template <typename T>
class VectorCursor : public Cursor<T> {
 public:
  explicit VectorCursor(std::vector<T> items) : m_items(std::move(items)) {}
  bool next(T& out) override {
    if (m_pos >= m_items.size()) return false;
    out = m_items[m_pos++];
    return true;
  }

 private:
  std::vector<T> m_items;
  size_t m_pos = 0;
};

class MemoryStream : public RecordingStream {
 public:
  explicit MemoryStream(const Recording& rec) : m_rec(rec) {
    m_rec.sortBySeq();
    m_names.push_back("");
  }
  std::unique_ptr<Cursor<Block>> blocks() override {
    return std::make_unique<VectorCursor<Block>>(m_rec.blocks);
  }
  std::unique_ptr<Cursor<TagRef>> tags() override {
    std::vector<TagRef> out;
    for (const Tag& t : m_rec.tags)
      out.push_back({t.seq, t.tsNs, t.address, t.sizeBytes, t.category, intern(t.name)});
    return std::make_unique<VectorCursor<TagRef>>(std::move(out));
  }
  std::unique_ptr<Cursor<PhaseInterval>> phases() override {
    return std::make_unique<VectorCursor<PhaseInterval>>(m_rec.phases);
  }
  std::unique_ptr<Cursor<ScopeRef>> scopes(bool ops) override {
    std::vector<ScopeRef> out;
    for (const ScopeInterval& s : ops ? m_rec.ops : m_rec.scopes)
      out.push_back({s.beginSeq, s.endSeq, s.threadId, intern(s.name)});
    return std::make_unique<VectorCursor<ScopeRef>>(std::move(out));
  }
  std::vector<StepInterval> steps() override { return m_rec.steps; }
  std::string name(uint32_t id) override { return id < m_names.size() ? m_names[id] : ""; }
  std::string error() const override { return ""; }

 private:
  uint32_t intern(const std::string& s) {
    if (s.empty()) return 0;
    auto [it, added] = m_ids.emplace(s, static_cast<uint32_t>(m_names.size()));
    if (added) m_names.push_back(s);
    return it->second;
  }
  Recording m_rec;
  std::vector<std::string> m_names;
  std::unordered_map<std::string, uint32_t> m_ids;
};

}  // namespace

std::unique_ptr<RecordingStream> streamOf(const Recording& recording) {
  return std::make_unique<MemoryStream>(recording);
}

}  // namespace tidemark::core
