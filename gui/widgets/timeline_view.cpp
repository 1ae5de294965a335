#include "gui/widgets/timeline_view.h"

#include "gui/model/format.h"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

namespace tidemark::gui {

namespace {
QColor toQ(Rgb c) { return QColor(c.r, c.g, c.b); }

QString bytesText(int64_t b) { return QString::fromStdString(humanBytes(b)); }
}  // namespace

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
  setMinimumSize(400, 220);
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
}

void TimelineView::setLimits(int64_t fromNs, int64_t toNs) {
  m_range.setLimits(fromNs, toNs);
  m_range.reset();
  update();
}

void TimelineView::setData(const StackedTimeline& data) {
  m_data = data;
  update();
}

void TimelineView::setPeak(int64_t tsNs, int64_t bytes) {
  m_peakNs = tsNs;
  m_peakBytes = bytes;
  update();
}

void TimelineView::setPredictedPeak(std::optional<int64_t> bytes) {
  m_predicted = bytes;
  update();
}

void TimelineView::setBudget(std::optional<int64_t> bytes) {
  m_budget = bytes;
  update();
}

void TimelineView::setPredictedSeries(std::vector<std::pair<int64_t, int64_t>> points) {
  // In time order; moments at the same time keep the schedule's order.
  std::stable_sort(points.begin(), points.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  m_predictedSeries = std::move(points);
  update();
}

void TimelineView::setLanes(Lanes lanes) {
  m_lanes = std::move(lanes);
  update();
}

QPointF TimelineView::peakPoint() const {
  const QRectF r = plotRect();
  return QPointF(r.left() + m_range.xOf(m_peakNs, r.width()), r.center().y());
}

// Lanes (modules, ops, kernels) take 18 px each under the plot.
constexpr double kLaneHeight = 18;

QRectF TimelineView::plotRect() const {
  return QRectF(70, 10, width() - 80, height() - 40 - kLaneHeight * m_lanes.count());
}

double TimelineView::yOf(int64_t bytes, const QRectF& r) const {
  int64_t top = std::max<int64_t>(
      {m_data.yMax, m_peakBytes, m_predicted.value_or(0), m_budget.value_or(0), 1});
  top += top / 20;
  return r.bottom() - static_cast<double>(bytes) / static_cast<double>(top) * r.height();
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  const QRectF r = plotRect();
  p.setPen(palette().color(QPalette::Mid));
  p.drawRect(r);
  const size_t n = m_data.startNs.size();
  if (n == 0) {
    p.setPen(palette().color(QPalette::Text));
    p.drawText(r, Qt::AlignCenter, tr("no memory recorded in this range"));
    return;
  }
  p.setRenderHint(QPainter::Antialiasing, false);
  // Each category a band between its lower and upper edge, bucket by bucket (steps): one filled
  // rectangle per bucket and category (a path of thousands of rectangles fills far slower).
  const auto& colors = categoryColors();
  for (int c = 0; c < kCategories; ++c) {
    const QColor fill = toQ(colors[static_cast<size_t>(c)]);
    for (size_t i = 0; i < n; ++i) {
      if (m_data.stack[i][c + 1] == m_data.stack[i][c]) continue;
      const double x0 = r.left() + m_range.xOf(m_data.startNs[i], r.width());
      const double x1 = r.left() + m_range.xOf(m_data.endNs[i], r.width());
      p.fillRect(QRectF(QPointF(x0, yOf(m_data.stack[i][c + 1], r)),
                        QPointF(std::max(x1, x0 + 1.0), yOf(m_data.stack[i][c], r))),
                 fill);
    }
  }
  // The total's envelope.
  p.setPen(QPen(palette().color(QPalette::Text), 1));
  for (size_t i = 0; i < n; ++i) {
    const double x0 = r.left() + m_range.xOf(m_data.startNs[i], r.width());
    const double x1 = r.left() + m_range.xOf(m_data.endNs[i], r.width());
    const double y = yOf(m_data.envelope[i], r);
    p.drawLine(QPointF(x0, y), QPointF(std::max(x1, x0 + 1), y));
  }
  // Budget (dashed) and the plan's predicted peak (dotted).
  if (m_budget) {
    p.setPen(QPen(palette().color(QPalette::Text), 1, Qt::DashLine));
    p.drawLine(QPointF(r.left(), yOf(*m_budget, r)), QPointF(r.right(), yOf(*m_budget, r)));
    p.drawText(QPointF(r.left() + 4, yOf(*m_budget, r) - 3),
               tr("budget %1").arg(bytesText(*m_budget)));
  }
  if (m_predicted) {
    p.setPen(QPen(QColor(0, 150, 0), 2, Qt::DotLine));
    p.drawLine(QPointF(r.left(), yOf(*m_predicted, r)), QPointF(r.right(), yOf(*m_predicted, r)));
    p.drawText(QPointF(r.right() - 200, yOf(*m_predicted, r) - 3),
               tr("predicted peak %1").arg(bytesText(*m_predicted)));
  }
  // The plan's predicted memory over the recorded step (green): each moment of the schedule held
  // until the next one, as memory is (it changes at the moments, not between them).
  if (m_predictedSeries.size() > 1) {
    p.save();
    p.setClipRect(r);
    p.setPen(QPen(QColor(0, 150, 0), 2));
    for (size_t i = 0; i + 1 < m_predictedSeries.size(); ++i) {
      const auto& [ts, b] = m_predictedSeries[i];
      const auto& [nextTs, nextB] = m_predictedSeries[i + 1];
      if (nextTs < m_range.from() || ts > m_range.to()) continue;
      const double x0 = r.left() + m_range.xOf(ts, r.width());
      const double x1 = r.left() + m_range.xOf(nextTs, r.width());
      p.drawLine(QPointF(x0, yOf(b, r)), QPointF(x1, yOf(b, r)));
      p.drawLine(QPointF(x1, yOf(b, r)), QPointF(x1, yOf(nextB, r)));
    }
    p.restore();
  }
  // The peak: a magenta line and a dot.
  if (m_peakNs >= m_range.from() && m_peakNs <= m_range.to()) {
    const double x = r.left() + m_range.xOf(m_peakNs, r.width());
    const QColor marker = toQ(kPeakMarker);
    p.setPen(QPen(marker, 2));
    p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()));
    p.setBrush(marker);
    p.drawEllipse(QPointF(x, yOf(m_peakBytes, r)), 5, 5);
    p.drawText(QPointF(std::min(x + 6, r.right() - 120), r.top() + 14),
               tr("peak %1").arg(bytesText(m_peakBytes)));
  }
  // Lanes: each scope a box, named when there is room.
  double laneTop = r.bottom() + 22;
  auto lane = [&](const char* title, const std::vector<LaneSpan>& spans, QColor a, QColor b) {
    if (spans.empty()) return;
    p.setPen(palette().color(QPalette::Text));
    p.drawText(QRectF(0, laneTop, 66, kLaneHeight), Qt::AlignRight | Qt::AlignVCenter, tr(title));
    int k = 0;
    for (const LaneSpan& s : spans) {
      if (s.endNs < m_range.from() || s.beginNs > m_range.to()) continue;
      const double x0 = std::max(r.left(), r.left() + m_range.xOf(s.beginNs, r.width()));
      const double x1 = std::min(r.right(), r.left() + m_range.xOf(s.endNs, r.width()));
      const QRectF box(x0, laneTop + 1, std::max(1.0, x1 - x0), kLaneHeight - 2);
      p.fillRect(box, (k++ % 2) ? a : b);
      if (box.width() > 40) {
        p.setPen(palette().color(QPalette::Text));
        p.drawText(box.adjusted(2, 0, -2, 0), Qt::AlignVCenter | Qt::AlignLeft,
                   p.fontMetrics().elidedText(QString::fromStdString(s.name), Qt::ElideRight,
                                              static_cast<int>(box.width()) - 4));
      }
    }
    laneTop += kLaneHeight;
  };
  lane("modules", m_lanes.modules, QColor(176, 196, 222), QColor(205, 220, 236));
  lane("ops", m_lanes.ops, QColor(222, 206, 176), QColor(236, 226, 205));
  lane("kernels", m_lanes.kernels, QColor(196, 222, 176), QColor(220, 236, 205));
  // Axis labels.
  p.setPen(palette().color(QPalette::Text));
  for (int k = 0; k <= 4; ++k) {
    int64_t top = std::max<int64_t>({m_data.yMax, m_peakBytes, 1});
    const int64_t b = top * k / 4;
    p.drawText(QRectF(0, yOf(b, r) - 8, 66, 16), Qt::AlignRight | Qt::AlignVCenter, bytesText(b));
  }
  p.drawText(QRectF(r.left(), r.bottom() + 4, r.width(), 20), Qt::AlignLeft,
             tr("%1 ms").arg(static_cast<double>(m_range.from() - m_range.min()) / 1e6, 0, 'f', 1));
  p.drawText(QRectF(r.left(), r.bottom() + 4, r.width(), 20), Qt::AlignRight,
             tr("%1 ms").arg(static_cast<double>(m_range.to() - m_range.min()) / 1e6, 0, 'f', 1));
}

void TimelineView::changed() {
  update();
  emit rangeChanged(m_range.from(), m_range.to());
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  const QRectF r = plotRect();
  const int64_t anchor = m_range.timeAt(e->position().x() - r.left(), r.width());
  m_range.zoom(e->angleDelta().y() > 0 ? 0.8 : 1.25, anchor);
  changed();
}

void TimelineView::mousePressEvent(QMouseEvent* e) {
  m_dragFrom = e->position();
  m_dragStartFrom = m_range.from();
  m_dragged = false;
}

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  const QRectF r = plotRect();
  if (m_dragFrom && (e->buttons() & Qt::LeftButton)) {
    const double dx = e->position().x() - m_dragFrom->x();
    if (std::abs(dx) > 3) m_dragged = true;
    if (m_dragged) {
      m_range.set(
          m_dragStartFrom - static_cast<int64_t>(dx / r.width() * m_range.span()),
          m_dragStartFrom - static_cast<int64_t>(dx / r.width() * m_range.span()) + m_range.span());
      changed();
    }
    return;
  }
  const QString tip = tipAt(e->position().x());
  if (!tip.isEmpty()) QToolTip::showText(e->globalPosition().toPoint(), tip, this);
}

QString TimelineView::tipAt(double x) const {
  const QRectF r = plotRect();
  const int i = m_data.bucketAt(m_range.timeAt(x - r.left(), r.width()));
  if (i < 0) return {};
  QString tip = tr("total %1 (highest %2)")
                    .arg(bytesText(m_data.stack[static_cast<size_t>(i)][kCategories]))
                    .arg(bytesText(m_data.envelope[static_cast<size_t>(i)]));
  for (int c = kCategories - 1; c >= 0; --c) {
    const int64_t b =
        m_data.stack[static_cast<size_t>(i)][c + 1] - m_data.stack[static_cast<size_t>(i)][c];
    if (b > 0)
      tip += QStringLiteral("\n%1: %2")
                 .arg(QString::fromLatin1(categoryLabel(c).data(),
                                          static_cast<int>(categoryLabel(c).size())),
                      bytesText(b));
  }
  return tip;
}

void TimelineView::mouseReleaseEvent(QMouseEvent* e) {
  if (m_dragFrom && !m_dragged) {
    const QRectF r = plotRect();
    emit momentClicked(m_range.timeAt(e->position().x() - r.left(), r.width()));
  }
  m_dragFrom.reset();
}

void TimelineView::keyPressEvent(QKeyEvent* e) {
  const int64_t mid = m_range.from() + m_range.span() / 2;
  switch (e->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal:
      m_range.zoom(0.5, mid);
      break;
    case Qt::Key_Minus:
      m_range.zoom(2.0, mid);
      break;
    case Qt::Key_Left:
      m_range.pan(-m_range.span() / 10);
      break;
    case Qt::Key_Right:
      m_range.pan(m_range.span() / 10);
      break;
    case Qt::Key_Home:
      m_range.reset();
      break;
    default:
      QWidget::keyPressEvent(e);
      return;
  }
  changed();
}

}  // namespace tidemark::gui
