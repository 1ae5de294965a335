#pragma once

#include <cstdint>

namespace tidemark::gui {

// The time range the timeline shows, inside the recording's [minNs, maxNs]: zoom about a point,
// pan, and the mapping between pixels and time. Never narrower than kMinSpanNs.
class ViewRange {
 public:
  static constexpr int64_t kMinSpanNs = 1000;

  void setLimits(int64_t minNs, int64_t maxNs);
  void reset() { m_from = m_min, m_to = m_max; }
  int64_t min() const { return m_min; }
  int64_t from() const { return m_from; }
  int64_t to() const { return m_to; }
  int64_t span() const { return m_to - m_from; }
  bool zoomed() const { return m_from > m_min || m_to < m_max; }

  // factor < 1 zooms in, > 1 out; the time at `anchorNs` stays where it is on screen.
  void zoom(double factor, int64_t anchorNs);
  void pan(int64_t deltaNs);
  void set(int64_t fromNs, int64_t toNs);

  int64_t timeAt(double x, double width) const;
  double xOf(int64_t ns, double width) const;

 private:
  void clamp();
  int64_t m_min = 0, m_max = 1, m_from = 0, m_to = 1;
};

}  // namespace tidemark::gui
