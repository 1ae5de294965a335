#include "src/core/categorize.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

namespace tidemark::core {

std::string_view ruleName(CategoryRule r) {
  switch (r) {
    case CategoryRule::kTag:
      return "tag";
    case CategoryRule::kWithinPhase:
      return "within_phase";
    case CategoryRule::kBornInRecompute:
      return "born_in_recompute";
    case CategoryRule::kUntagged:
      return "untagged";
    case CategoryRule::kAllocatorSegment:
      return "allocator_segment";
    case CategoryRule::kOutsideFramework:
      return "outside_framework";
    case CategoryRule::kFreedByBackward:
      return "freed_by_backward";
  }
  return "untagged";
}

namespace {

// Ties every tensor block to the block of another kind it lies in on the same device, live at the
// tensor's allocation (its segment), by one sweep of allocations and frees in sequence order.
// Returns the devices on which tensors were seen.
std::set<int32_t> findSegments(const Recording& rec, std::vector<BlockCategory>& out) {
  std::set<int32_t> tensorDevices;
  bool anyTensor = false;
  for (const Block& b : rec.blocks) anyTensor = anyTensor || b.kind == MemoryKind::kTensor;
  if (!anyTensor) return tensorDevices;
  // Frees in sequence order; allocations are rec.blocks' order.
  std::vector<size_t> byFree;
  for (size_t i = 0; i < rec.blocks.size(); ++i)
    if (!rec.blocks[i].live() && rec.blocks[i].kind != MemoryKind::kTensor) byFree.push_back(i);
  std::sort(byFree.begin(), byFree.end(),
            [&](size_t a, size_t b) { return rec.blocks[a].freeSeq < rec.blocks[b].freeSeq; });
  std::map<std::pair<int32_t, uint64_t>, size_t> live;  // (device, address) -> block
  size_t nextFree = 0;
  for (size_t i = 0; i < rec.blocks.size(); ++i) {
    const Block& b = rec.blocks[i];
    for (; nextFree < byFree.size() && rec.blocks[byFree[nextFree]].freeSeq <= b.allocSeq;
         ++nextFree) {
      const Block& f = rec.blocks[byFree[nextFree]];
      auto it = live.find({f.device, f.address});
      if (it != live.end() && it->second == byFree[nextFree]) live.erase(it);
    }
    if (b.kind != MemoryKind::kTensor) {
      live[{b.device, b.address}] = i;
      continue;
    }
    tensorDevices.insert(b.device);
    auto it = live.upper_bound({b.device, b.address});
    if (it == live.begin()) continue;
    --it;
    const Block& seg = rec.blocks[it->second];
    if (it->first.first == b.device && b.address < seg.address + seg.sizeBytes)
      out[i].segment = static_cast<int64_t>(it->second);
  }
  return tensorDevices;
}

// For each block freed inside a backward phase begun after its allocation: true (the facts'
// freedByBackward). One sweep of the frees in sequence order against the backward phases in begin
// order; the innermost backward phase open at a free (the one begun last) decides.
std::vector<bool> freedByBackward(const Recording& rec) {
  std::vector<bool> out(rec.blocks.size(), false);
  std::vector<const PhaseInterval*> backward;
  for (const PhaseInterval& p : rec.phases)
    if (p.phase == Phase::kBackward) backward.push_back(&p);
  if (backward.empty()) return out;
  std::sort(backward.begin(), backward.end(), [](const PhaseInterval* a, const PhaseInterval* b) {
    return a->beginSeq < b->beginSeq;
  });
  std::vector<size_t> byFree;
  for (size_t i = 0; i < rec.blocks.size(); ++i)
    if (!rec.blocks[i].live()) byFree.push_back(i);
  std::sort(byFree.begin(), byFree.end(),
            [&](size_t a, size_t b) { return rec.blocks[a].freeSeq < rec.blocks[b].freeSeq; });
  std::vector<const PhaseInterval*> open;  // begin order
  size_t next = 0;
  for (size_t i : byFree) {
    const Block& b = rec.blocks[i];
    for (; next < backward.size() && backward[next]->beginSeq <= b.freeSeq; ++next) {
      if (backward[next]->endSeq > b.freeSeq) open.push_back(backward[next]);
    }
    while (!open.empty() && open.back()->endSeq <= b.freeSeq) open.pop_back();
    out[i] = !open.empty() && open.back()->beginSeq > b.allocSeq;
  }
  return out;
}

}  // namespace

std::pair<Category, CategoryRule> decideCategory(const BlockFacts& f) {
  if (f.isSegment) return {Category::kAllocatorSlack, CategoryRule::kAllocatorSegment};
  if (f.tagCount > 0) return {f.tagCategory, CategoryRule::kTag};
  if (f.workspaceCandidate) return {Category::kWorkspace, CategoryRule::kOutsideFramework};
  if (f.phase != nullptr && f.freeSeq != kOpenSeq && f.freeSeq < f.phase->endSeq)
    return {Category::kTemporary, CategoryRule::kWithinPhase};
  if (f.phase != nullptr && f.phase->phase == Phase::kRecompute)
    return {Category::kRecomputed, CategoryRule::kBornInRecompute};
  if (f.freedByBackward) return {Category::kActivation, CategoryRule::kFreedByBackward};
  return {Category::kUnknown, CategoryRule::kUntagged};
}

std::vector<BlockCategory> categorize(const Recording& rec, CategorizeStats* stats) {
  std::vector<BlockCategory> out(rec.blocks.size());

  // Blocks at each address, in allocation order (rec.blocks is sorted by allocSeq): an address is
  // reused over time, and a tag belongs to the block live at its address at the tag's moment.
  std::unordered_map<uint64_t, std::vector<size_t>> byAddress;
  byAddress.reserve(rec.blocks.size());
  for (size_t i = 0; i < rec.blocks.size(); ++i) byAddress[rec.blocks[i].address].push_back(i);

  CategorizeStats local;
  for (size_t ti = 0; ti < rec.tags.size(); ++ti) {
    const Tag& tag = rec.tags[ti];
    auto it = byAddress.find(tag.address);
    const Block* found = nullptr;
    size_t index = 0;
    if (it != byAddress.end()) {
      const auto& list = it->second;
      // Last block allocated before the tag.
      auto pos = std::upper_bound(list.begin(), list.end(), tag.seq, [&](uint64_t seq, size_t i) {
        return seq < rec.blocks[i].allocSeq;
      });
      if (pos != list.begin()) {
        index = *(pos - 1);
        if (rec.blocks[index].freeSeq > tag.seq) found = &rec.blocks[index];
      }
    }
    if (found == nullptr) {
      ++local.tagsUnmatched;
      continue;
    }
    ++local.tagsMatched;
    BlockCategory& bc = out[index];
    if (bc.tagCount == 0 || tagPriority(tag.category) > tagPriority(bc.category)) {
      bc.category = tag.category;
      bc.rule = CategoryRule::kTag;
      bc.tagIndex = static_cast<int>(ti);
    }
    ++bc.tagCount;
  }

  const std::set<int32_t> tensorDevices = findSegments(rec, out);
  std::vector<bool> isSegment(rec.blocks.size(), false);
  const std::vector<bool> byBackward = freedByBackward(rec);
  for (const BlockCategory& bc : out)
    if (bc.segment >= 0) isSegment[static_cast<size_t>(bc.segment)] = true;

  for (size_t i = 0; i < rec.blocks.size(); ++i) {
    BlockCategory& bc = out[i];
    const Block& b = rec.blocks[i];
    BlockFacts facts;
    facts.isSegment = isSegment[i];
    facts.tagCount = bc.tagCount;
    facts.tagCategory = bc.category;
    facts.workspaceCandidate = b.kind == MemoryKind::kDevice && tensorDevices.count(b.device) > 0;
    facts.phase = rec.phaseAt(b.allocSeq);
    facts.freeSeq = b.freeSeq;
    facts.freedByBackward = byBackward[i];
    std::tie(bc.category, bc.rule) = decideCategory(facts);
  }
  if (stats != nullptr) *stats = local;
  return out;
}

}  // namespace tidemark::core
