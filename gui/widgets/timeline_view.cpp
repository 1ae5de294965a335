#include "gui/widgets/timeline_view.h"

#include "gui/model/axis_ticks.h"
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
QString q(const std::string& s) { return QString::fromStdString(s); }

// A scope's name in `width` px: whole, or its last path components ("…blocks.3.attn": the end
// tells scopes apart, "TinyGPT." does not), or cut in the middle.
QString laneLabel(const QFontMetrics& fm, const QString& name, int width) {
  if (fm.horizontalAdvance(name) <= width) return name;
  for (qsizetype dot = name.indexOf(QLatin1Char('.')); dot >= 0;
       dot = name.indexOf(QLatin1Char('.'), dot + 1)) {
    const QString tail = QStringLiteral("…") + name.mid(dot + 1);
    if (fm.horizontalAdvance(tail) <= width) return tail;
  }
  return fm.elidedText(name, Qt::ElideMiddle, width);
}
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

void TimelineView::setSteps(std::vector<std::pair<int64_t, int64_t>> stepBegins) {
  m_stepBegins = std::move(stepBegins);
  update();
}

void TimelineView::setMark(std::optional<int64_t> tsNs) {
  m_mark = tsNs;
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

// The legend above the plot, in as many rows of 16 px as its names need; under the plot a row
// of time labels and one of step numbers, then the lanes.
constexpr double kPlotLeft = 74, kLegendRow = 16, kUnderPlot = 36;

std::vector<TimelineView::LegendEntry> TimelineView::legend() const {
  std::vector<LegendEntry> out;
  const QFontMetrics fm(font());
  const double right = width() - 10;
  double x = kPlotLeft, y = 4;
  for (int c = 0; c < kCategories; ++c) {
    bool drawn = false;
    for (size_t i = 0; i < m_data.startNs.size() && !drawn; ++i)
      drawn = m_data.stack[i][c + 1] != m_data.stack[i][c];
    if (!drawn) continue;
    const QString name =
        QString::fromLatin1(categoryLabel(c).data(), static_cast<int>(categoryLabel(c).size()));
    const double w = fm.horizontalAdvance(name) + 22;
    if (x + w > right && x > kPlotLeft) {
      x = kPlotLeft;
      y += kLegendRow;
    }
    out.push_back({c, name, QRectF(x, y, w, kLegendRow)});
    x += w;
  }
  return out;
}

QRectF TimelineView::plotRect() const {
  const std::vector<LegendEntry> entries = legend();
  const double top = 8 + (entries.empty() ? kLegendRow : entries.back().box.bottom());
  return QRectF(kPlotLeft, top, width() - kPlotLeft - 10,
                height() - top - kUnderPlot - 4 - kLaneHeight * m_lanes.count());
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
  // Round byte ticks, as faint lines across the plot and labels left of it.
  const QColor grid = palette().color(QPalette::Midlight);
  const std::vector<Tick> yTicks = byteTicks(std::max<int64_t>({m_data.yMax, m_peakBytes, 1}),
                                             std::max(2, static_cast<int>(r.height() / 40)));
  for (const Tick& t : yTicks) {
    const double y = yOf(t.value, r);
    p.setPen(grid);
    if (t.value > 0) p.drawLine(QPointF(r.left(), y), QPointF(r.right(), y));
    p.setPen(palette().color(QPalette::Text));
    p.drawText(QRectF(0, y - 8, 70, 16), Qt::AlignRight | Qt::AlignVCenter, q(t.label));
  }
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
  // Step boundaries: dashed lines, their numbers on the time axis (where there is room).
  {
    p.setPen(QPen(palette().color(QPalette::Dark), 1, Qt::DashLine));
    double lastLabel = -1e9;
    for (const auto& [step, ts] : m_stepBegins) {
      if (ts < m_range.from() || ts > m_range.to()) continue;
      const double x = r.left() + m_range.xOf(ts, r.width());
      p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()));
      if (x - lastLabel < 48) continue;
      lastLabel = x;
      p.save();
      p.setPen(palette().color(QPalette::Text));
      p.drawText(QRectF(x + 2, r.bottom() + 19, 60, 14), Qt::AlignLeft | Qt::AlignVCenter,
                 tr("step %1").arg(step));
      p.restore();
    }
  }
  // Budget (dashed) and the plan's predicted peak (dotted), each labelled on a backing of its
  // own at its own end of the plot, the predicted one below its line when the two lines are
  // close (the labels never overlap the lines or each other).
  // Drawn last, over the predicted memory and the peak.
  struct Label {
    QPointF at;
    QString text;
    QColor color;
    bool alignRight;
  };
  std::vector<Label> labels;
  auto label = [&](QPointF at, const QString& text, const QColor& color, bool alignRight) {
    labels.push_back({at, text, color, alignRight});
  };
  const double budgetY = m_budget ? yOf(*m_budget, r) : -1e9;
  if (m_budget) {
    p.setPen(QPen(palette().color(QPalette::Text), 1, Qt::DashLine));
    p.drawLine(QPointF(r.left(), budgetY), QPointF(r.right(), budgetY));
    label(QPointF(r.left() + 4, budgetY - 2), tr("budget %1").arg(bytesText(*m_budget)),
          palette().color(QPalette::Text), false);
  }
  if (m_predicted) {
    const double y = yOf(*m_predicted, r);
    const QColor green(0, 110, 0);
    p.setPen(QPen(QColor(0, 150, 0), 2, Qt::DotLine));
    p.drawLine(QPointF(r.left(), y), QPointF(r.right(), y));
    const bool below = std::abs(y - budgetY) < 20 && y >= budgetY;
    label(QPointF(r.right() - 4, below ? y + 18 : y - 2),
          tr("predicted peak %1").arg(bytesText(*m_predicted)), green, true);
  }
  // The moment the inspector shows.
  if (m_mark && *m_mark >= m_range.from() && *m_mark <= m_range.to()) {
    const double x = r.left() + m_range.xOf(*m_mark, r.width());
    p.setPen(QPen(palette().color(QPalette::Text), 1));
    p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()));
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
  for (const Label& l : labels) {
    const QRectF box = p.fontMetrics().boundingRect(l.text).adjusted(-3, -1, 3, 1);
    const QRectF placed(l.alignRight ? l.at.x() - box.width() : l.at.x(), l.at.y() - box.height(),
                        box.width(), box.height());
    QColor back = palette().color(QPalette::Base);
    back.setAlpha(230);
    p.fillRect(placed, back);
    p.setPen(l.color);
    p.drawText(placed, Qt::AlignCenter, l.text);
  }
  // Lanes: each scope a box, named when there is room.
  double laneTop = r.bottom() + kUnderPlot;
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
                   laneLabel(p.fontMetrics(), q(s.name), static_cast<int>(box.width()) - 4));
      }
    }
    laneTop += kLaneHeight;
  };
  lane("modules", m_lanes.modules, QColor(176, 196, 222), QColor(205, 220, 236));
  lane("ops", m_lanes.ops, QColor(222, 206, 176), QColor(236, 226, 205));
  lane("kernels", m_lanes.kernels, QColor(196, 222, 176), QColor(220, 236, 205));
  // The time axis: round offsets from the session's start, a label per tick.
  p.setPen(palette().color(QPalette::Text));
  const int64_t origin = m_range.min();
  for (const Tick& t : timeTicks(m_range.from() - origin, m_range.to() - origin,
                                 std::max(2, static_cast<int>(r.width() / 90)))) {
    const double x = r.left() + m_range.xOf(t.value + origin, r.width());
    p.drawLine(QPointF(x, r.bottom()), QPointF(x, r.bottom() + 3));
    p.drawText(QRectF(x - 45, r.bottom() + 3, 90, 14), Qt::AlignHCenter | Qt::AlignTop, q(t.label));
  }
  // The legend: the categories drawn, in their colours, above the plot.
  p.setPen(palette().color(QPalette::Text));
  for (const LegendEntry& e : legend()) {
    p.fillRect(QRectF(e.box.left(), e.box.top() + 2, 12, 12),
               toQ(colors[static_cast<size_t>(e.category)]));
    p.drawText(e.box.adjusted(15, 0, 0, 0), Qt::AlignLeft | Qt::AlignVCenter, e.name);
  }
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
  // Over a lane: the scope there; over the plot: the moment's figures.
  QString tip = laneTipAt(e->position());
  if (tip.isEmpty()) tip = tipAt(e->position().x());
  if (!tip.isEmpty()) QToolTip::showText(e->globalPosition().toPoint(), tip, this);
}

QString TimelineView::laneTipAt(QPointF at) const {
  const QRectF r = plotRect();
  double laneTop = r.bottom() + kUnderPlot;
  const int64_t t = timeAt(at.x());
  for (const auto* spans : {&m_lanes.modules, &m_lanes.ops, &m_lanes.kernels}) {
    if (spans->empty()) continue;
    if (at.y() >= laneTop && at.y() < laneTop + kLaneHeight) {
      const LaneSpan* found = nullptr;
      for (const LaneSpan& s : *spans)
        if (s.beginNs <= t && t < s.endNs && (!found || s.depth >= found->depth)) found = &s;
      if (found == nullptr) return {};
      const char* kind = spans == &m_lanes.modules ? "module"
                         : spans == &m_lanes.ops   ? "op"
                                                   : "kernel";
      return tr("%1 %2\n+%3 ms, %4 ms long")
          .arg(QString::fromLatin1(kind), q(found->name))
          .arg(static_cast<double>(found->beginNs - m_range.min()) / 1e6, 0, 'f', 3)
          .arg(static_cast<double>(found->endNs - found->beginNs) / 1e6, 0, 'f', 3);
    }
    laneTop += kLaneHeight;
  }
  return {};
}

int64_t TimelineView::timeAt(double x) const {
  const QRectF r = plotRect();
  return m_range.timeAt(x - r.left(), r.width());
}

QString TimelineView::tipAt(double x) const {
  const QRectF r = plotRect();
  const int i = m_data.bucketAt(m_range.timeAt(x - r.left(), r.width()));
  if (i < 0) return {};
  // When (from the session's start) and where: the step, and the module and op running then.
  const int64_t t = timeAt(x);
  QString tip = tr("+%1 ms").arg(static_cast<double>(t - m_range.min()) / 1e6, 0, 'f', 3);
  for (const auto& [step, begin] : m_stepBegins)
    if (begin <= t)
      tip = tr("+%1 ms, step %2")
                .arg(static_cast<double>(t - m_range.min()) / 1e6, 0, 'f', 3)
                .arg(step);
  auto running = [t](const std::vector<LaneSpan>& spans) -> const LaneSpan* {
    const LaneSpan* found = nullptr;
    for (const LaneSpan& s : spans)
      if (s.beginNs <= t && t < s.endNs && (!found || s.depth >= found->depth)) found = &s;
    return found;
  };
  if (const LaneSpan* phase = running(m_lanes.phases)) tip += tr(", %1").arg(q(phase->name));
  if (const LaneSpan* mod = running(m_lanes.modules)) tip += tr("\nin %1").arg(q(mod->name));
  if (const LaneSpan* op = running(m_lanes.ops)) tip += tr("\nop %1").arg(q(op->name));
  tip += tr("\ntotal %1 (highest %2)")
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
    // On the peak's dot (or its line, within a few pixels): the peak itself, not the moment
    // at that pixel (a bucket's time, which may miss the peak by a few events).
    const QPointF dot(r.left() + m_range.xOf(m_peakNs, r.width()), yOf(m_peakBytes, r));
    if (m_peakNs >= m_range.from() && m_peakNs <= m_range.to() &&
        std::abs(e->position().x() - dot.x()) <= 6) {
      m_mark = m_peakNs;
      update();
      emit peakClicked();
    } else {
      m_mark = m_range.timeAt(e->position().x() - r.left(), r.width());
      update();
      emit momentClicked(*m_mark);
    }
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
