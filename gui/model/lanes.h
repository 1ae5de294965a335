#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tidemark::gui {

// A scope drawn in a lane under the timeline.
struct LaneSpan {
  enum class Kind { kModule, kOp, kKernel, kPhase };  // phases: no lane, the tooltip's
  Kind kind = Kind::kModule;
  std::string name;
  int depth = 0;
  int64_t beginNs = 0, endNs = 0;
};

// The lanes: modules (the outermost modules below the model, and "[backward]" scopes), ops (the
// outermost ones) and kernels. A lane is shown only when it has something.
struct Lanes {
  std::vector<LaneSpan> modules, ops, kernels;
  std::vector<LaneSpan> phases;  // not drawn: what the tooltip names
  bool empty() const { return modules.empty() && ops.empty() && kernels.empty(); }
  int count() const { return !modules.empty() + !ops.empty() + !kernels.empty(); }
};
Lanes layoutLanes(const std::vector<LaneSpan>& spans);

}  // namespace tidemark::gui
