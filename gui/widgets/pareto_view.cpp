#include "gui/widgets/pareto_view.h"

#include <QPainter>
#include <algorithm>

namespace tidemark::gui {

ParetoView::ParetoView(QWidget* parent) : QWidget(parent) { setMinimumSize(260, 140); }

void ParetoView::setCurve(std::vector<std::pair<int64_t, int64_t>> points, int64_t baseStepNs) {
  m_points = std::move(points);
  m_baseStepNs = baseStepNs;
  update();
}

void ParetoView::setChosen(std::optional<int64_t> budgetBytes) {
  m_chosen = budgetBytes;
  update();
}

void ParetoView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  const QRectF r(40, 8, width() - 48, height() - 30);
  p.setPen(palette().color(QPalette::Mid));
  p.drawRect(r);
  p.setPen(palette().color(QPalette::Text));
  p.drawText(QRectF(0, height() - 20, width(), 20), Qt::AlignCenter,
             tr("budget →   (extra time per step ↑)"));
  if (m_points.empty()) return;
  const double x0 = static_cast<double>(m_points.front().first);
  const double x1 = std::max(x0 + 1, static_cast<double>(m_points.back().first));
  const double y1 = std::max(1.0, static_cast<double>(m_points.front().second));
  auto at = [&](int64_t b, int64_t e) {
    return QPointF(r.left() + (static_cast<double>(b) - x0) / (x1 - x0) * r.width(),
                   r.bottom() - static_cast<double>(e) / y1 * r.height());
  };
  p.setRenderHint(QPainter::Antialiasing);
  p.setPen(QPen(QColor(76, 114, 176), 2));
  for (size_t i = 1; i < m_points.size(); ++i) {
    // A step function: the extra time holds until the next budget.
    const QPointF a = at(m_points[i - 1].first, m_points[i - 1].second);
    const QPointF b = at(m_points[i].first, m_points[i].second);
    p.drawLine(a, QPointF(b.x(), a.y()));
    p.drawLine(QPointF(b.x(), a.y()), b);
  }
  if (m_baseStepNs > 0) {
    p.setPen(palette().color(QPalette::Text));
    p.drawText(
        QRectF(0, r.top(), 38, 16), Qt::AlignRight,
        QStringLiteral("%1%").arg(100.0 * y1 / static_cast<double>(m_baseStepNs), 0, 'f', 0));
  }
  if (m_chosen) {
    const double x =
        at(std::clamp<int64_t>(*m_chosen, m_points.front().first, m_points.back().first), 0).x();
    p.setPen(QPen(QColor(0, 150, 0), 2, Qt::DashLine));
    p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()));
  }
}

}  // namespace tidemark::gui
