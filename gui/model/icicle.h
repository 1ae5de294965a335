#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tidemark::gui {

// Memory at one moment by module hierarchy, laid out as an icicle: a row per depth of the module
// names ("GPT.blocks.0.attn": GPT, then blocks, then 0, then attn), each module as wide as the
// bytes it and the modules inside it hold, its children left to right under it, largest first;
// what a module holds itself (allocated in it, not in a child) is the part of its width no child
// covers. Widths are fractions of the moment's tracked bytes, so memory no listed module holds
// (outside modules, or below the list's cut) is one grey cell at the end of the top row, named
// kIcicleRest, with no category.
struct IcicleModule {
  std::string name;      // a module's full name, its parts joined by '.'
  std::string category;  // the category of most of its bytes ("WEIGHT", ...)
  int64_t bytes = 0;
};

inline constexpr const char* kIcicleRest = "(in no module listed)";

struct IcicleCell {
  std::string path;   // the full name up to this part
  std::string label;  // this part
  int depth = 0;
  int64_t bytes = 0;      // in it and inside it
  int64_t ownBytes = 0;   // in it, not in a child
  double x0 = 0, x1 = 0;  // its span, as fractions of the total
  std::string category;   // of its largest own part, or its largest child's
};

// Cells in depth order, each depth left to right. totalBytes: the moment's tracked bytes (the
// modules' sum when larger).
std::vector<IcicleCell> icicleLayout(const std::vector<IcicleModule>& modules, int64_t totalBytes);

}  // namespace tidemark::gui
