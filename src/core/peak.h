#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/breakdown.h"
#include "src/core/categorize.h"

namespace tidemark::core {

// What holds memory at a peak: a module or an op (the scope of that kind open on the allocating
// thread when the block was allocated) or a tensor (a block, named by its deciding tag).
struct PeakItem {
  std::string name;
  Category category = Category::kUnknown;       // for tensors; the largest category for modules
  CategoryRule rule = CategoryRule::kUntagged;  // for tensors: what decided the category
  int64_t bytes = 0;
  int64_t blocks = 0;
};

struct PeakReport {
  int64_t step = -1;  // -1: the whole recording
  MemoryState state;
  std::string phase;              // running at the peak
  std::string scope;              // innermost module scope open at the peak
  std::vector<PeakItem> modules;  // largest first
  std::vector<PeakItem> ops;      // largest first: the op scope open at allocation (if recorded)
  std::vector<PeakItem> tensors;  // largest first
};

// The peak of the whole recording, with the largest `topItems` modules and tensors live at it,
// then the peak of every step (in step order; categories only).
std::vector<PeakReport> computePeaks(const Recording& recording,
                                     const std::vector<BlockCategory>& categories,
                                     const LivenessReplay& replay, size_t topItems = 20);

}  // namespace tidemark::core
