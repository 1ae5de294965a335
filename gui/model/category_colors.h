#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tidemark::gui {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

// The timeline's fixed colours, one per category in tidemark.v1.Category order (WEIGHT first),
// documented in docs/gui.md. Distinct from each other and from the peak marker.
inline constexpr int kCategories = 11;
const std::array<Rgb, kCategories>& categoryColors();
// Magenta: nothing else is drawn in it, so the marker is findable in screenshots.
inline constexpr Rgb kPeakMarker{255, 0, 255};
std::string_view categoryLabel(int index);  // "WEIGHT", ...
// A colour's text version for a white background: the same hue darkened until it contrasts
// 4.5:1 with white (WCAG AA), so UNKNOWN's light grey and TEMPORARY's sand read as text.
Rgb readableOnWhite(Rgb c);
// WCAG's contrast ratio of a colour against white (1 to 21).
double contrastWithWhite(Rgb c);

}  // namespace tidemark::gui
