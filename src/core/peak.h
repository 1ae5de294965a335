#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
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
  uint64_t address = 0;  // a tensor's: its block's (tidemark block SESSION ADDRESS)
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
// A step's peak held by the live analysis and by the rows carrying it to the store at once (one
// copy for both: a long live session's steps not committed yet held every peak twice).
using SharedPeakReport = std::shared_ptr<const PeakReport>;

struct GroupSum {  // what a module or op holds at a peak
  int64_t bytes = 0;
  int64_t blocks = 0;
  std::array<int64_t, kCategoryCount> byCategory{};
  void add(int64_t size, Category c) {
    bytes += size;
    blocks += 1;
    byCategory[categoryIndex(c)] += size;
  }
};

// Gathers the blocks live at a peak, one at a time, into a report's modules, ops and tensors.
class PeakItemsBuilder {
 public:
  explicit PeakItemsBuilder(bool withOps) : m_withOps(withOps) {}
  // moduleScope / opScope: the innermost scope of that kind open on the allocating thread at the
  // block's allocation, or nullptr (a block outside every module goes to the module its tag
  // names). tagName: the deciding tag's name, "" if none. size: what the block holds (a segment:
  // less its live tensors).
  void add(const std::string* moduleScope, const std::string* opScope, const std::string& tagName,
           uint64_t address, int64_t size, Category c, CategoryRule rule);
  // The largest topItems of each kind (topItems at most kKeepTensors).
  void finish(PeakReport& report, size_t topItems);
  static constexpr size_t kKeepTensors = 1024;

 private:
  bool m_withOps;
  std::map<std::string, GroupSum> m_modules;
  std::map<std::string, GroupSum> m_ops;
  std::vector<PeakItem> m_tensors;
};

// How many of the largest modules, ops and tensors live at a session's peak its analysis keeps
// (a query for more computes them again at the peak's moment).
inline constexpr size_t kPeakItemsKept = 20;

// The largest `topItems` modules, ops and tensors live at report.state (its seq), into report.
// The recording's blocks sorted by allocSeq (Recording::sortBySeq).
void fillItems(const Recording& recording, const std::vector<BlockCategory>& categories,
               PeakReport& report, size_t topItems);

// The peak of the whole recording, with the largest `topItems` modules and tensors live at it,
// then the peak of every step (in step order; categories only).
std::vector<PeakReport> computePeaks(const Recording& recording,
                                     const std::vector<BlockCategory>& categories,
                                     const LivenessReplay& replay,
                                     size_t topItems = kPeakItemsKept);

}  // namespace tidemark::core
