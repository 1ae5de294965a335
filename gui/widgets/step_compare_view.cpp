#include "gui/widgets/step_compare_view.h"

#include <QPainter>
#include <algorithm>

#include "gui/model/format.h"

namespace tidemark::gui {

StepCompareView::StepCompareView(QWidget* parent) : QWidget(parent) { setMinimumSize(260, 160); }

void StepCompareView::setComparison(std::optional<StepComparison> c) {
  m_c = std::move(c);
  update();
}

void StepCompareView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  const QRectF r(64, 40, width() - 72, height() - 62);
  p.setPen(palette().color(QPalette::Mid));
  p.drawRect(r);
  p.setPen(palette().color(QPalette::Text));
  if (!m_c) {
    p.drawText(r, Qt::AlignCenter | Qt::TextWordWrap,
               tr("select two steps (Ctrl+click) to overlay them"));
    return;
  }
  const double span = static_cast<double>(std::max<int64_t>(m_c->spanNs, 1));
  const double top = static_cast<double>(std::max<int64_t>(m_c->yMax, 1)) * 1.05;
  auto x = [&](int64_t ns) { return r.left() + static_cast<double>(ns) / span * r.width(); };
  auto y = [&](int64_t b) { return r.bottom() - static_cast<double>(b) / top * r.height(); };
  // Each curve as steps: the bucket's highest value over the bucket, joined at the edges.
  auto curve = [&](const StepCurve& c, QColor color) {
    p.setPen(QPen(color, 2));
    for (size_t i = 0; i < c.bytes.size(); ++i) {
      p.drawLine(QPointF(x(c.fromNs[i]), y(c.bytes[i])),
                 QPointF(std::max(x(c.toNs[i]), x(c.fromNs[i]) + 1), y(c.bytes[i])));
      if (i + 1 < c.bytes.size())
        p.drawLine(QPointF(x(c.toNs[i]), y(c.bytes[i])), QPointF(x(c.toNs[i]), y(c.bytes[i + 1])));
    }
  };
  curve(m_c->a, QColor::fromRgb(kColorA));
  curve(m_c->b, QColor::fromRgb(kColorB));
  // The legend's peaks are the steps' own (as the table gives them), not the curves' highest
  // bucket, which a coarse timeline may round.
  auto label = [&](const StepCurve& c, int64_t peak, QColor color, double top) {
    p.setPen(color);
    p.drawText(QRectF(4, top, width() - 8, 18), Qt::AlignLeft,
               tr("step %1: peak %2, %3 ms")
                   .arg(c.step)
                   .arg(QString::fromStdString(humanBytes(peak > 0 ? peak : c.peak())))
                   .arg(static_cast<double>(c.spanNs()) / 1e6, 0, 'f', 1));
  };
  label(m_c->a, m_c->totalA(), QColor::fromRgb(kColorA), 2);
  label(m_c->b, m_c->totalB(), QColor::fromRgb(kColorB), 20);
  p.setPen(palette().color(QPalette::Text));
  for (const int64_t b : {int64_t{0}, m_c->yMax})
    p.drawText(QRectF(0, y(b) - 8, 60, 16), Qt::AlignRight | Qt::AlignVCenter,
               QString::fromStdString(humanBytes(b)));
  p.drawText(QRectF(r.left(), r.bottom() + 2, r.width(), 18), Qt::AlignLeft, tr("0 ms"));
  p.drawText(QRectF(r.left(), r.bottom() + 2, r.width(), 18), Qt::AlignRight,
             tr("%1 ms").arg(span / 1e6, 0, 'f', 1));
}

}  // namespace tidemark::gui
