#include "gui/widgets/pareto_view.h"

#include "gui/model/axis_ticks.h"
#include "gui/model/format.h"

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
  // Axes: the budget along the bottom, the extra time per step up the left, both at round
  // values; the chosen budget dashed, with its extra time.
  const QRectF r(58, 18, width() - 66, height() - 52);
  p.setPen(palette().color(QPalette::Mid));
  p.drawRect(r);
  p.setPen(palette().color(QPalette::Text));
  p.drawText(QRectF(r.left(), height() - 16, r.width(), 16), Qt::AlignCenter, tr("budget"));
  p.drawText(QRectF(0, 0, width(), 16), Qt::AlignLeft | Qt::AlignVCenter,
             tr("extra time per step (least, for each budget)"));
  if (m_points.empty()) return;
  const double x0 = static_cast<double>(m_points.front().first);
  const double x1 = std::max(x0 + 1, static_cast<double>(m_points.back().first));
  const double y1 = std::max(1.0, static_cast<double>(m_points.front().second));
  auto at = [&](double b, double e) {
    return QPointF(r.left() + (b - x0) / (x1 - x0) * r.width(), r.bottom() - e / y1 * r.height());
  };
  const QColor grid = palette().color(QPalette::Midlight);
  for (const Tick& t :
       timeTicks(0, static_cast<int64_t>(y1), std::max(2, static_cast<int>(r.height() / 30)))) {
    const double y = at(x0, static_cast<double>(t.value)).y();
    p.setPen(grid);
    if (t.value > 0) p.drawLine(QPointF(r.left(), y), QPointF(r.right(), y));
    p.setPen(palette().color(QPalette::Text));
    p.drawText(QRectF(0, y - 8, 54, 16), Qt::AlignRight | Qt::AlignVCenter,
               QString::fromStdString(t.label));
  }
  for (const Tick& t : byteTicks(static_cast<int64_t>(x0), static_cast<int64_t>(x1),
                                 std::max(2, static_cast<int>(r.width() / 70)))) {
    const double x = at(static_cast<double>(t.value), 0).x();
    p.setPen(palette().color(QPalette::Text));
    p.drawLine(QPointF(x, r.bottom()), QPointF(x, r.bottom() + 3));
    p.drawText(QRectF(x - 40, r.bottom() + 3, 80, 14), Qt::AlignHCenter | Qt::AlignTop,
               QString::fromStdString(t.label));
  }
  p.setRenderHint(QPainter::Antialiasing);
  p.setPen(QPen(QColor(76, 114, 176), 2));
  for (size_t i = 1; i < m_points.size(); ++i) {
    // A step function: the extra time holds until the next budget.
    const QPointF a =
        at(static_cast<double>(m_points[i - 1].first), static_cast<double>(m_points[i - 1].second));
    const QPointF b =
        at(static_cast<double>(m_points[i].first), static_cast<double>(m_points[i].second));
    p.drawLine(a, QPointF(b.x(), a.y()));
    p.drawLine(QPointF(b.x(), a.y()), b);
  }
  if (m_chosen) {
    const int64_t chosen =
        std::clamp<int64_t>(*m_chosen, m_points.front().first, m_points.back().first);
    const double x = at(static_cast<double>(chosen), 0).x();
    p.setPen(QPen(QColor(0, 150, 0), 2, Qt::DashLine));
    p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()));
    // The extra time at the chosen budget: the least of the points it affords.
    int64_t extra = m_points.front().second;
    for (const auto& [budget, ns] : m_points)
      if (budget <= chosen) extra = std::min(extra, ns);
    QString text = tr("%1: +%2 ms")
                       .arg(QString::fromStdString(humanBytes(*m_chosen)))
                       .arg(static_cast<double>(extra) / 1e6, 0, 'f', 1);
    if (m_baseStepNs > 0)
      text += tr(" (+%1 %)")
                  .arg(100.0 * static_cast<double>(extra) / static_cast<double>(m_baseStepNs), 0,
                       'f', 1);
    const double w = p.fontMetrics().horizontalAdvance(text) + 6;
    const double left = std::clamp(x + 4, r.left(), r.right() - w);
    QColor back = palette().color(QPalette::Base);
    back.setAlpha(230);
    const QRectF box(left, r.top() + 2, w, 16);
    p.fillRect(box, back);
    p.setPen(QColor(0, 110, 0));
    p.drawText(box, Qt::AlignCenter, text);
  }
}

}  // namespace tidemark::gui
