#pragma once

#include <string_view>
#include <utility>
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
  // A block that holds tensors (a caching allocator's segment): ALLOCATOR_SLACK, less the bytes
  // of the tensors live in it at each moment (they count to their own categories).
  kAllocatorSegment = 5,
  // Untagged device memory that never holds a tensor, on a device whose tensors are seen
  // (NCCL buffers, library workspaces, raw cudaMalloc): WORKSPACE.
  kOutsideFramework = 6,
  // Untagged, born before a backward phase and freed inside it (what autograd saved for that
  // backward, which the adapter's saved-tensor hooks did not see: a forward no module hook saw
  // begin): ACTIVATION.
  kFreedByBackward = 7,
};
std::string_view ruleName(CategoryRule r);

struct BlockCategory {
  Category category = Category::kUnknown;
  CategoryRule rule = CategoryRule::kUntagged;
  int tagCount = 0;   // tags that matched this block
  int tagIndex = -1;  // the deciding tag in Recording::tags, -1 if none
  // A tensor (MemoryKind::kTensor): the block it lies in (its segment), whose ALLOCATOR_SLACK its
  // bytes are taken from while it lives; -1 when no such block was recorded.
  int64_t segment = -1;
};

struct CategorizeStats {
  int64_t tagsMatched = 0;
  int64_t tagsUnmatched = 0;  // no block was live at the tag's address at its moment
};

// What the rules look at for one block, once its tags, the tensors in it and its free are known.
struct BlockFacts {
  bool isSegment = false;                     // a tensor lies in it
  int tagCount = 0;                           // tags that matched it
  Category tagCategory = Category::kUnknown;  // the highest-priority one's
  bool workspaceCandidate = false;            // device memory on a device whose tensors are seen
  const PhaseInterval* phase = nullptr;       // the innermost phase open at its allocation
  uint64_t freeSeq = kOpenSeq;
  bool freedByBackward = false;  // freed inside a backward phase begun after its allocation
};
// The category and the rule that decides it: a segment's slack, then a tag, then workspace,
// then the lifetime and phase rules. categorize() and the streaming analysis both decide here.
std::pair<Category, CategoryRule> decideCategory(const BlockFacts& facts);

// One entry per block of recording.blocks (same order). Expects recording.sortBySeq().
// Reconciliation (GPU): a tensor block lies in a segment; the segment is ALLOCATOR_SLACK less its
// live tensors, so the bytes of a device add up to tensors by category + slack + workspace.
std::vector<BlockCategory> categorize(const Recording& recording, CategorizeStats* stats = nullptr);

}  // namespace tidemark::core
