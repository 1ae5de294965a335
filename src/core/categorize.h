#pragma once

#include <string_view>
#include <vector>

#include "src/core/recording.h"

namespace tidemark::core {

// Why a block got its category. Framework tags decide first; lifetime and phase rules decide
// the rest, so a recording without the adapter still gets a sensible breakdown.
enum class CategoryRule : uint8_t {
  kTag = 1,              // a framework tag named it (the highest-priority tag wins)
  kWithinPhase = 2,      // untagged, born and freed inside one phase: TEMPORARY
  kBornInRecompute = 3,  // untagged, born in a recompute phase and outliving it: RECOMPUTED
  kUntagged = 4,         // nothing applied: UNKNOWN
};
std::string_view ruleName(CategoryRule r);

struct BlockCategory {
  Category category = Category::kUnknown;
  CategoryRule rule = CategoryRule::kUntagged;
  int tagCount = 0;   // tags that matched this block
  int tagIndex = -1;  // the deciding tag in Recording::tags, -1 if none
};

struct CategorizeStats {
  int64_t tagsMatched = 0;
  int64_t tagsUnmatched = 0;  // no block was live at the tag's address at its moment
};

// One entry per block of recording.blocks (same order). Expects recording.sortBySeq().
std::vector<BlockCategory> categorize(const Recording& recording, CategorizeStats* stats = nullptr);

}  // namespace tidemark::core
