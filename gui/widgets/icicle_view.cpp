#include "gui/widgets/icicle_view.h"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <algorithm>

#include "gui/model/category_colors.h"
#include "gui/model/format.h"

namespace tidemark::gui {
namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

QColor fill(const std::string& category) {
  for (int c = 0; c < kCategories; ++c) {
    if (categoryLabel(c) == category) {
      const Rgb rgb = categoryColors()[static_cast<size_t>(c)];
      return QColor(rgb.r, rgb.g, rgb.b);
    }
  }
  return QColor(200, 200, 200);
}

// Black or white text, whichever reads on the fill.
QColor textOn(const QColor& f) {
  const double luma = 0.299 * f.red() + 0.587 * f.green() + 0.114 * f.blue();
  return luma > 140 ? QColor(Qt::black) : QColor(Qt::white);
}

}  // namespace

IcicleView::IcicleView(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);  // the hovered cell's tooltip follows the pointer
  setMessage(tr("Click the timeline (or its peak) to see memory by module at that moment."));
}

void IcicleView::setMoment(const QString& title, std::vector<IcicleCell> cells,
                           int64_t totalBytes) {
  m_title = title;
  m_message.clear();
  m_cells = std::move(cells);
  m_totalBytes = totalBytes;
  m_depth = 0;
  for (const IcicleCell& c : m_cells) m_depth = std::max(m_depth, c.depth + 1);
  if (m_cells.empty())
    m_message = tr("No module holds memory at this moment (or the recording names no modules).");
  updateGeometry();
  update();
}

void IcicleView::setMessage(const QString& message) {
  m_message = message;
  m_cells.clear();
  m_depth = 0;
  update();
}

QSize IcicleView::sizeHint() const {
  return {360, kTop + kMargin + kRowHeight * std::max(m_depth, 4)};
}

QRect IcicleView::cellRect(const IcicleCell& c) const {
  const double w = width() - 2 * kMargin;
  const int x0 = kMargin + static_cast<int>(c.x0 * w + 0.5);
  const int x1 = kMargin + static_cast<int>(c.x1 * w + 0.5);
  return QRect(x0, kTop + c.depth * kRowHeight, std::max(1, x1 - x0), kRowHeight - 1);
}

const IcicleCell* IcicleView::cellAt(QPoint p) const {
  for (const IcicleCell& c : m_cells)
    if (cellRect(c).contains(p)) return &c;
  return nullptr;
}

QString IcicleView::toolTipFor(const IcicleCell& c) const {
  QString tip = tr("%1\n%2 (%3 % of %4)")
                    .arg(q(c.path), q(humanBytes(c.bytes)))
                    .arg(m_totalBytes > 0 ? 100.0 * static_cast<double>(c.bytes) /
                                                static_cast<double>(m_totalBytes)
                                          : 0.0,
                         0, 'f', 1)
                    .arg(q(humanBytes(m_totalBytes)));
  if (c.ownBytes > 0 && c.ownBytes != c.bytes)
    tip += tr("\n%1 allocated in it, outside its children").arg(q(humanBytes(c.ownBytes)));
  if (!c.category.empty()) tip += tr("\nmostly %1").arg(q(c.category));
  return tip;
}

void IcicleView::mouseMoveEvent(QMouseEvent* e) {
  const QPoint at = e->position().toPoint();
  if (const IcicleCell* c = cellAt(at))
    QToolTip::showText(e->globalPosition().toPoint(), toolTipFor(*c), this, cellRect(*c));
  else
    QToolTip::hideText();
}

void IcicleView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), Qt::white);
  p.setPen(Qt::black);
  const QRect head(kMargin, 4, width() - 2 * kMargin, kTop - 8);
  if (!m_message.isEmpty()) {
    p.drawText(rect().adjusted(kMargin, kMargin, -kMargin, -kMargin),
               Qt::AlignLeft | Qt::AlignTop | Qt::TextWordWrap, m_message);
    return;
  }
  p.drawText(head, Qt::AlignLeft | Qt::AlignVCenter,
             tr("%1 · %2 by module").arg(m_title, q(humanBytes(m_totalBytes))));
  const QFontMetrics fm = p.fontMetrics();
  for (const IcicleCell& c : m_cells) {
    const QRect r = cellRect(c);
    const QColor f = fill(c.category);
    p.fillRect(r, f);
    // Memory in no module listed: hatched, not to be read as a category's colour.
    if (c.category.empty()) p.fillRect(r, QBrush(QColor(150, 150, 150), Qt::BDiagPattern));
    p.setPen(QColor(255, 255, 255));
    p.drawLine(r.topRight(), r.bottomRight());  // a gap between neighbours
    if (r.width() < 24) continue;
    p.setPen(textOn(f));
    const QString text = fm.elidedText(q(c.label), Qt::ElideMiddle, r.width() - 6);
    p.drawText(r.adjusted(3, 0, -3, 0), Qt::AlignLeft | Qt::AlignVCenter, text);
  }
}

}  // namespace tidemark::gui
