#include "gui/model/lanes.h"

#include <algorithm>
#include <climits>

namespace tidemark::gui {

Lanes layoutLanes(const std::vector<LaneSpan>& spans) {
  Lanes out;
  // Modules: the model itself (depth 0) says little; its children (the blocks) say most.
  int moduleDepth = INT_MAX, opDepth = INT_MAX;
  for (const LaneSpan& s : spans) {
    if (s.kind == LaneSpan::Kind::kModule && s.depth > 0)
      moduleDepth = std::min(moduleDepth, s.depth);
    if (s.kind == LaneSpan::Kind::kOp) opDepth = std::min(opDepth, s.depth);
  }
  for (const LaneSpan& s : spans) {
    switch (s.kind) {
      case LaneSpan::Kind::kModule:
        if (s.depth == moduleDepth || s.name.find(" [backward]") != std::string::npos)
          out.modules.push_back(s);
        break;
      case LaneSpan::Kind::kOp:
        if (s.depth == opDepth) out.ops.push_back(s);
        break;
      case LaneSpan::Kind::kKernel:
        out.kernels.push_back(s);
        break;
      case LaneSpan::Kind::kPhase:
        out.phases.push_back(s);
        break;
    }
  }
  auto byBegin = [](const LaneSpan& a, const LaneSpan& b) { return a.beginNs < b.beginNs; };
  std::sort(out.modules.begin(), out.modules.end(), byBegin);
  std::sort(out.ops.begin(), out.ops.end(), byBegin);
  std::sort(out.kernels.begin(), out.kernels.end(), byBegin);
  std::sort(out.phases.begin(), out.phases.end(), byBegin);
  return out;
}

}  // namespace tidemark::gui
