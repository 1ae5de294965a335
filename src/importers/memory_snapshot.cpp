#include "src/importers/memory_snapshot.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "src/importers/pickle_reader.h"

namespace tidemark::core {

namespace {

struct Frame {
  std::string name;
  std::string filename;
  int64_t line = 0;
};

std::vector<Frame> readFrames(const PyValue* frames) {
  std::vector<Frame> out;
  if (frames == nullptr || frames->kind != PyValue::Kind::kList) return out;
  for (const auto& f : frames->items) {
    if (f->kind != PyValue::Kind::kDict) continue;
    Frame fr;
    if (const PyValue* v = f->get("name")) fr.name = std::string(v->asString());
    if (const PyValue* v = f->get("filename")) fr.filename = std::string(v->asString());
    if (const PyValue* v = f->get("line")) fr.line = v->asInt();
    out.push_back(std::move(fr));
  }
  return out;
}

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

struct Verdict {
  Category category = Category::kUnknown;
  std::string rule;  // empty: no rule applied
};

// What the code in a stack was doing: the phase of training that made (or freed) a block.
enum class StackPhase { kNone, kZeroGrad, kOptimizer, kBackward, kConstruction, kForward };

StackPhase phaseOf(const std::vector<Frame>& frames) {
  bool zeroGrad = false, optimizer = false, backward = false, construction = false, forward = false;
  for (const Frame& f : frames) {
    const bool python = endsWith(f.filename, ".py");
    if (python && f.name == "zero_grad") zeroGrad = true;
    if ((python && f.name == "step") || f.filename.find("/optim") != std::string::npos)
      optimizer = true;
    if (f.name.find("AccumulateGrad") != std::string::npos ||
        f.name.find("autograd::Engine") != std::string::npos ||
        f.name.find("run_backward") != std::string::npos || (python && f.name == "backward"))
      backward = true;
    if (python && (f.name == "__init__" || f.name == "_apply" || f.name == "reset_parameters"))
      construction = true;
    if (python && f.name == "forward") forward = true;
  }
  if (zeroGrad) return StackPhase::kZeroGrad;
  if (optimizer) return StackPhase::kOptimizer;
  if (backward) return StackPhase::kBackward;
  if (construction) return StackPhase::kConstruction;
  if (forward) return StackPhase::kForward;
  return StackPhase::kNone;
}

// The category of a block from the phase that allocated it, whether it is alive at the dump and
// the phase that freed it (kNone when alive). Rules in memory_snapshot.h.
Verdict classify(StackPhase allocated, bool aliveAtEnd, StackPhase freed) {
  switch (allocated) {
    case StackPhase::kOptimizer:
      return {aliveAtEnd ? Category::kOptimizerState : Category::kTemporary, "frames:optimizer"};
    case StackPhase::kBackward:
      if (aliveAtEnd || freed == StackPhase::kZeroGrad)
        return {Category::kGradient, "frames:backward"};
      return {Category::kTemporary, "frames:backward"};
    case StackPhase::kConstruction:
      return {Category::kWeight, "frames:construction"};
    case StackPhase::kForward:
      if (freed == StackPhase::kForward)
        return {Category::kTemporary, "frames:forward, freed there"};
      return {Category::kActivation, "frames:forward"};
    case StackPhase::kZeroGrad:
    case StackPhase::kNone:
      break;
  }
  return {};
}

// A block allocated before the trace, without frames, that the trace frees: the phase freeing it
// says what it was.
Verdict classifyByFree(StackPhase freed) {
  switch (freed) {
    case StackPhase::kZeroGrad:
      return {Category::kGradient, "freed by zero_grad"};
    case StackPhase::kOptimizer:
      return {Category::kOptimizerState, "replaced by the optimizer"};
    case StackPhase::kBackward:
      return {Category::kActivation, "freed in backward"};
    default:
      return {};
  }
}

// "[rule] name (file:line)" of the innermost Python frame, for the tag's name.
std::string label(const std::string& rule, const std::vector<Frame>& frames) {
  std::string where;
  for (const Frame& f : frames) {
    if (!endsWith(f.filename, ".py")) continue;
    const size_t slash = f.filename.rfind('/');
    where = absl::StrCat(f.name, " (",
                         slash == std::string::npos ? f.filename : f.filename.substr(slash + 1),
                         ":", f.line, ")");
    break;
  }
  return absl::StrCat("[", rule, "]", where.empty() ? "" : " ", where);
}

// Frames as a Stack event carries them: one per line, innermost first, "name (file:line)". The
// Python frames, which say where in the training code the block came from; the C++ frames below
// them (the unwinder, the caching allocator, the op's dispatch) are counted on a last line. A
// stack without Python frames (autograd's engine thread) keeps its C++ frames. At most 64 lines.
std::string stackText(const std::vector<Frame>& frames) {
  std::vector<const Frame*> shown;
  for (const Frame& f : frames)
    if (endsWith(f.filename, ".py")) shown.push_back(&f);
  if (shown.empty())
    for (const Frame& f : frames) shown.push_back(&f);
  std::string out;
  size_t n = 0;
  for (const Frame* f : shown) {
    if (n == 64) break;
    absl::StrAppend(&out, f->name.empty() ? "??" : f->name, " (",
                    f->filename.empty() ? "??" : f->filename, ":", f->line, ")\n");
    ++n;
  }
  if (frames.size() > n) absl::StrAppend(&out, "(and ", frames.size() - n, " more frames)\n");
  if (!out.empty()) out.pop_back();
  return out;
}

struct LiveBlock {
  uint64_t size = 0;
  std::vector<Frame> frames;
};

}  // namespace

absl::StatusOr<ImportedRecording> importMemorySnapshot(std::string_view bytes) {
  absl::StatusOr<std::shared_ptr<PyValue>> root = readPickle(bytes);
  if (!root.ok()) return root.status();
  const PyValue* segments = nullptr;
  const PyValue* traces = nullptr;
  if ((*root)->kind == PyValue::Kind::kList) {
    segments = root->get();  // the oldest form: a list of segments
  } else if ((*root)->kind == PyValue::Kind::kDict) {
    segments = (*root)->get("segments");
    traces = (*root)->get("device_traces");
  }
  if (segments == nullptr || segments->kind != PyValue::Kind::kList)
    return absl::InvalidArgumentError(
        "not a PyTorch memory snapshot: no list of segments (torch.cuda.memory._snapshot())");

  ImportedRecording out;
  out.format = "pytorch-memory-snapshot";
  int64_t reserved = 0, allocated = 0;
  // Blocks allocated at the dump, per device and address.
  std::map<int32_t, std::map<uint64_t, LiveBlock>> atDump;
  for (const auto& seg : segments->items) {
    if (seg->kind != PyValue::Kind::kDict)
      return absl::InvalidArgumentError("memory snapshot: a segment is not a dict");
    const auto device = static_cast<int32_t>(seg->get("device") ? seg->get("device")->asInt() : 0);
    const int64_t total = seg->get("total_size") ? seg->get("total_size")->asInt() : 0;
    if (total < 0 || total > kMaxImportedBlockBytes)
      return absl::InvalidArgumentError(
          absl::StrCat("memory snapshot: absurd segment size ", total));
    reserved += total;
    uint64_t cursor = seg->get("address") ? static_cast<uint64_t>(seg->get("address")->asInt()) : 0;
    const PyValue* blocks = seg->get("blocks");
    if (blocks == nullptr || blocks->kind != PyValue::Kind::kList) continue;
    for (const auto& b : blocks->items) {
      if (b->kind != PyValue::Kind::kDict) continue;
      const int64_t size = b->get("size") ? b->get("size")->asInt() : 0;
      if (size < 0 || size > total)
        return absl::InvalidArgumentError("memory snapshot: a block is larger than its segment");
      // The newer form names the block's address; the older one lays blocks out in order.
      const uint64_t address =
          b->get("address") ? static_cast<uint64_t>(b->get("address")->asInt()) : cursor;
      cursor = address + static_cast<uint64_t>(size);
      const std::string_view state = b->get("state") ? b->get("state")->asString() : "";
      if (state != "active_allocated" && state != "active_pending_free") continue;
      allocated += size;
      LiveBlock lb;
      lb.size = static_cast<uint64_t>(size);
      lb.frames = readFrames(b->get("frames"));
      if (lb.frames.empty()) {  // the older form keeps frames in the block's history
        if (const PyValue* h = b->get("history");
            h && h->kind == PyValue::Kind::kList && !h->items.empty())
          lb.frames = readFrames(h->items.back()->get("frames"));
      }
      atDump[device][address] = std::move(lb);
    }
  }
  out.reservedBytes = reserved;
  out.allocatedAtEndBytes = allocated;

  // The trace entries, with their device, in time order.
  struct Entry {
    int64_t timeUs = 0;
    int32_t device = 0;
    std::string action;
    uint64_t address = 0;
    uint64_t size = 0;
    uint64_t stream = 0;
    std::vector<Frame> frames;             // allocs' only
    StackPhase phase = StackPhase::kNone;  // what its frames were doing
  };
  std::vector<Entry> entries;
  if (traces != nullptr && traces->kind == PyValue::Kind::kList) {
    for (size_t d = 0; d < traces->items.size(); ++d) {
      const PyValue& list = *traces->items[d];
      if (list.kind != PyValue::Kind::kList) continue;
      for (const auto& e : list.items) {
        if (e->kind != PyValue::Kind::kDict)
          return absl::InvalidArgumentError("memory snapshot: a trace entry is not a dict");
        Entry en;
        en.device = static_cast<int32_t>(d);
        en.action = std::string(e->get("action") ? e->get("action")->asString() : "");
        en.address = e->get("addr") ? static_cast<uint64_t>(e->get("addr")->asInt()) : 0;
        const int64_t size = e->get("size") ? e->get("size")->asInt() : 0;
        if (size < 0 || size > kMaxImportedBlockBytes)
          return absl::InvalidArgumentError(absl::StrCat("memory snapshot: absurd size ", size));
        en.size = static_cast<uint64_t>(size);
        en.stream = e->get("stream") ? static_cast<uint64_t>(e->get("stream")->asInt()) : 0;
        en.timeUs = e->get("time_us") ? e->get("time_us")->asInt() : 0;
        // Microseconds that do not fit nanoseconds in an int64 are no time a trace can hold.
        if (en.timeUs > int64_t{3'000'000'000'000'000} ||
            en.timeUs < -int64_t{3'000'000'000'000'000})
          return absl::InvalidArgumentError(
              absl::StrCat("memory snapshot: absurd time_us ", en.timeUs));
        if (en.action == "alloc" || en.action == "free_requested" ||
            en.action == "free_completed") {
          std::vector<Frame> frames = readFrames(e->get("frames"));
          en.phase = phaseOf(frames);
          if (en.action == "alloc") en.frames = std::move(frames);
        }
        entries.push_back(std::move(en));
      }
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.timeUs < b.timeUs; });

  // Repeated entries (a trace merged twice, say) would count memory twice: an alloc of an address
  // open with that size, a completed free of an address already freed. Left out, and said.
  {
    std::map<std::pair<int32_t, uint64_t>, std::pair<bool, uint64_t>> last;  // open?, size
    size_t kept = 0, repeated = 0;
    for (size_t k = 0; k < entries.size(); ++k) {
      Entry& e = entries[k];
      const bool alloc = e.action == "alloc", freed = e.action == "free_completed";
      if (alloc || freed) {
        auto [it, first] = last.try_emplace({e.device, e.address}, alloc, e.size);
        if (!first &&
            (alloc ? it->second.first && it->second.second == e.size : !it->second.first)) {
          ++repeated;
          continue;
        }
        it->second = {alloc, e.size};
      }
      if (kept != k) entries[kept] = std::move(e);
      ++kept;
    }
    entries.resize(kept);
    if (repeated > 0)
      out.notes.push_back(absl::StrCat(repeated,
                                       " trace entries repeat the one before them (the "
                                       "same address and size): left out"));
  }
  // A completed free without frames was requested by the code of its request.
  {
    std::map<std::pair<int32_t, uint64_t>, StackPhase> requested;
    for (Entry& e : entries) {
      if (e.action == "free_requested") requested[{e.device, e.address}] = e.phase;
      if (e.action == "free_completed" && e.phase == StackPhase::kNone) {
        auto r = requested.find({e.device, e.address});
        if (r != requested.end()) e.phase = r->second;
      }
    }
  }
  // Which allocations of the trace are still alive at the dump, and what freed the others.
  std::vector<bool> aliveAtEnd(entries.size(), false);
  std::vector<StackPhase> freedBy(entries.size(), StackPhase::kNone);
  {
    std::map<std::pair<int32_t, uint64_t>, size_t> open;
    for (size_t k = 0; k < entries.size(); ++k) {
      const Entry& e = entries[k];
      if (e.action == "alloc") {
        open[{e.device, e.address}] = k;
      } else if (e.action == "free_completed") {
        auto it = open.find({e.device, e.address});
        if (it != open.end()) {
          freedBy[it->second] = e.phase;
          open.erase(it);
        }
      }
    }
    for (const auto& [key, k] : open) aliveAtEnd[k] = true;
  }
  // The blocks allocated when the trace began: the dump's, replayed backwards.
  std::map<int32_t, std::map<uint64_t, LiveBlock>> atStart = atDump;
  for (size_t k = entries.size(); k-- > 0;) {
    const Entry& e = entries[k];
    if (e.action == "alloc") {
      atStart[e.device].erase(e.address);
    } else if (e.action == "free_completed") {
      auto& dev = atStart[e.device];
      if (!dev.count(e.address)) dev[e.address] = LiveBlock{e.size, {}};
    }
  }

  // The first alloc or free of each address in the trace.
  std::map<std::pair<int32_t, uint64_t>, const Entry*> firstTouch;
  for (const Entry& e : entries)
    if (e.action == "alloc" || e.action == "free_completed")
      firstTouch.emplace(std::make_pair(e.device, e.address), &e);

  // Classify everything, then let sizes name the frameless parameters.
  struct Pending {
    ImportEvent alloc;
    Verdict verdict;
    std::vector<Frame> frames;
    bool preexisting = false;
    bool alive = false;
  };
  std::vector<Pending> allocs;
  const int64_t t0 = entries.empty() ? 0 : entries.front().timeUs * 1000 - 1000;
  int64_t stateTs = t0;
  for (const auto& [device, blocks] : atStart) {
    for (const auto& [address, lb] : blocks) {
      Pending p;
      p.alloc.kind = ImportEvent::Kind::kAlloc;
      p.alloc.tsNs = entries.empty() ? stateTs++ : t0;
      p.alloc.address = address;
      p.alloc.sizeBytes = lb.size;
      p.alloc.device = device;
      p.preexisting = true;
      // It survives unless the trace frees it: its address's first event is then a free.
      auto first = firstTouch.find({device, address});
      p.alive = first == firstTouch.end() || first->second->action != "free_completed";
      const StackPhase freed = p.alive ? StackPhase::kNone : first->second->phase;
      p.frames = lb.frames;
      p.verdict =
          lb.frames.empty() ? classifyByFree(freed) : classify(phaseOf(lb.frames), p.alive, freed);
      out.preexistingBytes += static_cast<int64_t>(lb.size);
      allocs.push_back(std::move(p));
    }
  }
  std::set<uint64_t> optimizerSizes;
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (e.action != "alloc") continue;
    Verdict v = classify(e.phase, aliveAtEnd[k], freedBy[k]);
    if (v.category != Category::kOptimizerState) continue;
    optimizerSizes.insert(e.size);
    // The dump holds sizes as the allocator rounded them, as it does for the parameters.
    auto dev = atDump.find(e.device);
    if (dev != atDump.end()) {
      auto b = dev->second.find(e.address);
      if (b != dev->second.end()) optimizerSizes.insert(b->second.size);
    }
  }
  for (const Pending& p : allocs)
    if (p.verdict.category == Category::kOptimizerState) optimizerSizes.insert(p.alloc.sizeBytes);
  for (Pending& p : allocs) {
    if (p.verdict.rule.empty() && p.frames.empty() && p.alive &&
        optimizerSizes.count(p.alloc.sizeBytes))
      p.verdict = {Category::kWeight, "kept, parameter-sized"};
  }

  auto emitAlloc = [&](const ImportEvent& a, const Verdict& v, const std::vector<Frame>& frames) {
    out.events.push_back(a);
    if (!frames.empty()) {
      ImportEvent st = a;
      st.kind = ImportEvent::Kind::kStack;
      st.name = stackText(frames);
      out.events.push_back(std::move(st));
    }
    if (v.rule.empty()) return;
    ImportEvent t = a;
    t.kind = ImportEvent::Kind::kTag;
    t.category = v.category;
    t.name = label(v.rule, frames);
    out.events.push_back(std::move(t));
  };
  // The trace records requested sizes, the dump rounded ones: what the allocator's rounding adds
  // at the dump is a block of its own at the start, so that the replay ends at the dump's total.
  int64_t net = 0;
  for (const Entry& e : entries) {
    if (e.action == "alloc") net += static_cast<int64_t>(e.size);
    if (e.action == "free_completed") net -= static_cast<int64_t>(e.size);
  }
  const int64_t rounding = (allocated - net) - out.preexistingBytes;
  if (!entries.empty() && rounding > 0) {
    Pending p;
    p.alloc.kind = ImportEvent::Kind::kAlloc;
    p.alloc.tsNs = t0;
    p.alloc.address = uint64_t{1} << 62;  // outside any device's address range
    p.alloc.sizeBytes = static_cast<uint64_t>(rounding);
    p.alloc.device = atDump.empty() ? 0 : atDump.begin()->first;
    p.verdict = {Category::kUnknown, "allocator rounding at the dump"};
    out.preexistingBytes += rounding;
    allocs.push_back(std::move(p));
  } else if (rounding < 0) {
    out.notes.push_back(
        absl::StrCat("the trace frees ", -rounding, " bytes more than the dump explains"));
  }
  // Reserved bytes: the dump's, less the segments the trace allocated, plus those it freed.
  int64_t reservedNow = reserved;
  for (const Entry& e : entries) {
    if (e.action == "segment_alloc") reservedNow -= static_cast<int64_t>(e.size);
    if (e.action == "segment_free") reservedNow += static_cast<int64_t>(e.size);
  }
  auto reservedEvent = [&](int64_t tsNs) {
    ImportEvent c;
    c.kind = ImportEvent::Kind::kCounter;
    c.tsNs = tsNs;
    c.name = "reserved_bytes";
    c.value = reservedNow;
    out.events.push_back(std::move(c));
  };
  // Steps: a step ends where the optimizer's work ends (the last entry of a run of them that
  // forward or backward work ends); the first begins with the trace. Without an optimizer step
  // the recording has no step marks.
  std::vector<bool> endsStep(entries.size(), false);
  {
    std::optional<size_t> lastOptimizer;
    for (size_t k = 0; k < entries.size(); ++k) {
      const StackPhase ph = entries[k].phase;
      if (ph == StackPhase::kOptimizer) {
        lastOptimizer = k;
      } else if (lastOptimizer && (ph == StackPhase::kForward || ph == StackPhase::kBackward ||
                                   ph == StackPhase::kConstruction)) {
        endsStep[*lastOptimizer] = true;
        lastOptimizer.reset();
      }
    }
    if (lastOptimizer) endsStep[*lastOptimizer] = true;
  }
  const int64_t stepCount = std::count(endsStep.begin(), endsStep.end(), true);
  int64_t step = 0;
  auto stepMark = [&](ImportEvent::Kind kind, int64_t tsNs) {
    ImportEvent m;
    m.kind = kind;
    m.tsNs = tsNs;
    m.step = step;
    out.events.push_back(std::move(m));
  };
  if (stepCount > 0) {
    step = 1;
    stepMark(ImportEvent::Kind::kStepBegin, t0);
  }
  reservedEvent(t0);
  for (const Pending& p : allocs) emitAlloc(p.alloc, p.verdict, p.frames);
  int64_t frees = 0, ooms = 0;
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (k > 0 && endsStep[k - 1]) {
      const int64_t at = entries[k - 1].timeUs * 1000;
      stepMark(ImportEvent::Kind::kStepEnd, at);
      if (step < stepCount) {
        ++step;
        stepMark(ImportEvent::Kind::kStepBegin, at);
      }
    }
    ImportEvent ev;
    ev.tsNs = e.timeUs * 1000;
    ev.address = e.address;
    ev.sizeBytes = e.size;
    ev.device = e.device;
    ev.stream = e.stream;
    if (e.action == "alloc") {
      ev.kind = ImportEvent::Kind::kAlloc;
      emitAlloc(ev, classify(e.phase, aliveAtEnd[k], freedBy[k]), e.frames);
    } else if (e.action == "free_completed") {
      ev.kind = ImportEvent::Kind::kFree;
      out.events.push_back(ev);
      ++frees;
    } else if (e.action == "segment_alloc" || e.action == "segment_free") {
      reservedNow += (e.action == "segment_alloc" ? 1 : -1) * static_cast<int64_t>(e.size);
      reservedEvent(ev.tsNs);
    } else if (e.action == "oom") {
      ++ooms;
    }
  }
  if (!entries.empty() && endsStep.back())
    stepMark(ImportEvent::Kind::kStepEnd, entries.back().timeUs * 1000);
  if (ooms) out.notes.push_back(absl::StrCat(ooms, " out-of-memory events in the trace"));
  if (entries.empty())
    out.notes.push_back(
        "no device_traces: the blocks allocated at the dump only (state-only snapshot)");
  return out;
}

}  // namespace tidemark::core
