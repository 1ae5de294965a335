#include "src/core/categorize.h"

#include <algorithm>
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
  }
  return "untagged";
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

  for (size_t i = 0; i < rec.blocks.size(); ++i) {
    BlockCategory& bc = out[i];
    if (bc.tagCount > 0) continue;
    const Block& b = rec.blocks[i];
    const PhaseInterval* phase = rec.phaseAt(b.allocSeq);
    if (phase != nullptr && b.freeSeq != kOpenSeq && b.freeSeq < phase->endSeq) {
      bc.category = Category::kTemporary;
      bc.rule = CategoryRule::kWithinPhase;
    } else if (phase != nullptr && phase->phase == Phase::kRecompute) {
      bc.category = Category::kRecomputed;
      bc.rule = CategoryRule::kBornInRecompute;
    } else {
      bc.category = Category::kUnknown;
      bc.rule = CategoryRule::kUntagged;
    }
  }
  if (stats != nullptr) *stats = local;
  return out;
}

}  // namespace tidemark::core
