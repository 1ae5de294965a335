#include "gui/model/category_colors.h"

namespace tidemark::gui {

const std::array<Rgb, kCategories>& categoryColors() {
  static const std::array<Rgb, kCategories> colors = {{
      {76, 114, 176},   // WEIGHT: blue
      {221, 132, 82},   // GRADIENT: orange
      {129, 114, 179},  // OPTIMIZER_STATE: purple
      {85, 168, 104},   // ACTIVATION: green
      {147, 120, 96},   // CHECKPOINT_INPUT: brown
      {218, 139, 195},  // RECOMPUTED: pink
      {110, 110, 110},  // INPUT: dark grey
      {204, 185, 116},  // TEMPORARY: sand
      {100, 181, 205},  // WORKSPACE: cyan
      {196, 78, 82},    // ALLOCATOR_SLACK: red
      {208, 208, 208},  // UNKNOWN: light grey
  }};
  return colors;
}

std::string_view categoryLabel(int index) {
  static constexpr std::string_view kLabels[kCategories] = {
      "WEIGHT", "GRADIENT",  "OPTIMIZER_STATE", "ACTIVATION",      "CHECKPOINT_INPUT", "RECOMPUTED",
      "INPUT",  "TEMPORARY", "WORKSPACE",       "ALLOCATOR_SLACK", "UNKNOWN"};
  return index >= 0 && index < kCategories ? kLabels[index] : std::string_view("?");
}

}  // namespace tidemark::gui
