#include "gui/model/category_colors.h"

#include <cmath>

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

namespace {
double linear(uint8_t v) {
  const double c = v / 255.0;
  return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
}
}  // namespace

double contrastWithWhite(Rgb c) {
  const double l = 0.2126 * linear(c.r) + 0.7152 * linear(c.g) + 0.0722 * linear(c.b);
  return 1.05 / (l + 0.05);
}

Rgb readableOnWhite(Rgb c) {
  while (contrastWithWhite(c) < 4.5)
    c = Rgb{static_cast<uint8_t>(c.r * 9 / 10), static_cast<uint8_t>(c.g * 9 / 10),
            static_cast<uint8_t>(c.b * 9 / 10)};
  return c;
}

}  // namespace tidemark::gui
