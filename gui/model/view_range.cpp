#include "gui/model/view_range.h"

#include <algorithm>
#include <cmath>

namespace tidemark::gui {

void ViewRange::setLimits(int64_t minNs, int64_t maxNs) {
  m_min = minNs;
  m_max = std::max(maxNs, minNs + kMinSpanNs);
  clamp();
}

void ViewRange::zoom(double factor, int64_t anchorNs) {
  if (!(factor > 0)) return;
  const double from = static_cast<double>(anchorNs) - (anchorNs - m_from) * factor;
  const double to = static_cast<double>(anchorNs) + (m_to - anchorNs) * factor;
  m_from = static_cast<int64_t>(std::llround(from));
  m_to = static_cast<int64_t>(std::llround(to));
  clamp();
}

void ViewRange::pan(int64_t deltaNs) {
  const int64_t s = span();
  m_from += deltaNs;
  m_to = m_from + s;
  clamp();
}

void ViewRange::set(int64_t fromNs, int64_t toNs) {
  m_from = fromNs;
  m_to = toNs;
  clamp();
}

void ViewRange::clamp() {
  const int64_t full = m_max - m_min;
  int64_t s = std::clamp<int64_t>(m_to - m_from, std::min<int64_t>(kMinSpanNs, full), full);
  if (m_from < m_min) m_from = m_min;
  if (m_from + s > m_max) m_from = m_max - s;
  m_to = m_from + s;
}

int64_t ViewRange::timeAt(double x, double width) const {
  if (width <= 0) return m_from;
  return m_from + static_cast<int64_t>(std::llround(std::clamp(x / width, 0.0, 1.0) * span()));
}

double ViewRange::xOf(int64_t ns, double width) const {
  return span() > 0 ? static_cast<double>(ns - m_from) / static_cast<double>(span()) * width : 0;
}

}  // namespace tidemark::gui
