#include "gui/widgets/job_view.h"

#include <QMouseEvent>
#include <QPainter>
#include <algorithm>

#include "gui/model/format.h"

namespace tidemark::gui {

namespace {
QString q(const std::string& s) { return QString::fromStdString(s); }
}  // namespace

JobView::JobView(QWidget* parent) : QWidget(parent) {
  setMinimumSize(320, 200);
  m_message = tr("open a session to see its job");
}

void JobView::setJob(JobData job, std::vector<RankCurve> curves, uint64_t openSession) {
  m_job = std::move(job);
  m_curves = std::move(curves);
  m_open = openSession;
  m_message.clear();
  setMinimumHeight(kHeader + kRowHeight * static_cast<int>(m_job->ranks.size()) + 24);
  update();
}

void JobView::setMessage(const QString& text) {
  m_job.reset();
  m_curves.clear();
  m_message = text;
  setMinimumHeight(200);
  update();
}

QRect JobView::rowRect(uint64_t session) const {
  if (!m_job) return {};
  for (size_t i = 0; i < m_job->ranks.size(); ++i) {
    if (m_job->ranks[i].session == session)
      return QRect(0, kHeader + static_cast<int>(i) * kRowHeight, width(), kRowHeight);
  }
  return {};
}

void JobView::mousePressEvent(QMouseEvent* event) {
  if (!m_job || event->button() != Qt::LeftButton) return;
  const int row = (static_cast<int>(event->position().y()) - kHeader) / kRowHeight;
  if (event->position().y() < kHeader || row < 0 || row >= static_cast<int>(m_job->ranks.size()))
    return;
  emit rankClicked(m_job->ranks[static_cast<size_t>(row)].session);
}

void JobView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  p.setPen(palette().color(QPalette::Text));
  if (!m_job) {
    p.drawText(rect().adjusted(8, 8, -8, -8), Qt::AlignCenter | Qt::TextWordWrap, m_message);
    return;
  }
  const JobData& j = *m_job;
  QString title = tr("job %1 (%2): %3 rank%4")
                      .arg(j.id)
                      .arg(q(j.key))
                      .arg(j.ranks.size())
                      .arg(j.ranks.size() == 1 ? QString() : QStringLiteral("s"));
  if (j.worldSize > 0) title += tr(" of %1").arg(j.worldSize);
  p.drawText(QRectF(6, 2, width() - 12, 18), Qt::AlignLeft | Qt::AlignVCenter,
             p.fontMetrics().elidedText(title, Qt::ElideMiddle, width() - 12));
  QString figures;
  if (j.peakImbalance > 0) figures = tr("peak imbalance %1x").arg(j.peakImbalance, 0, 'f', 3);
  if (j.stepImbalance > 0) figures += tr(", step time %1x").arg(j.stepImbalance, 0, 'f', 3);
  if (!j.missingRanks.empty()) {
    QStringList missing;
    for (int32_t r : j.missingRanks) missing << QString::number(r);
    figures += tr("; never recorded: rank %1").arg(missing.join(QStringLiteral(", ")));
  }

  const JobAxis axis = jobAxis(m_curves);
  if (axis.maxBytes > 0)
    figures += tr("; one height for all: %1").arg(q(humanBytes(axis.maxBytes)));
  p.drawText(QRectF(6, 20, width() - 12, 18), Qt::AlignLeft | Qt::AlignVCenter,
             p.fontMetrics().elidedText(figures, Qt::ElideRight, width() - 12));
  const double span = static_cast<double>(axis.toWallNs - axis.fromWallNs);
  const double top = static_cast<double>(std::max<int64_t>(axis.maxBytes, 1)) * 1.1;
  const double plotLeft = 6, plotWidth = std::max(40, width() - 12);
  QFont bold = p.font();
  bold.setBold(true);
  const QFont plain = p.font();
  for (size_t i = 0; i < j.ranks.size(); ++i) {
    const JobRank& r = j.ranks[i];
    const QRectF row(0, kHeader + static_cast<double>(i) * kRowHeight, width(), kRowHeight);
    const bool need = r.session == j.memorySession;
    if (need) {
      p.fillRect(row, QColor::fromRgb(kNeedRowColor));
    } else if (i % 2 == 1) {
      p.fillRect(row, palette().color(QPalette::AlternateBase));
    }
    // A line of figures (rank, session, state, peak, median step), the curve under it.
    QString text = r.rank >= 0 ? tr("rank %1").arg(r.rank) : tr("rank ?");
    text += tr(" · session %1 · %2").arg(r.session).arg(q(r.state));
    text +=
        r.peakBytes >= 0 ? tr(" · peak %1").arg(q(humanBytes(r.peakBytes))) : tr(" · no memory");
    if (r.medianStepNs > 0)
      text += tr(" · %1 ms/step").arg(static_cast<double>(r.medianStepNs) / 1e6, 0, 'f', 1);
    if (need) text += tr(" · the memory need");
    p.setFont(need ? bold : plain);
    p.setPen(palette().color(QPalette::Text));
    p.drawText(QRectF(6, row.top() + 2, width() - 12, 18), Qt::AlignLeft | Qt::AlignVCenter,
               p.fontMetrics().elidedText(text, Qt::ElideRight, width() - 12));
    p.setFont(plain);
    const QRectF plot(plotLeft, row.top() + 22, plotWidth, row.height() - 26);
    p.setPen(palette().color(QPalette::Mid));
    p.drawLine(plot.bottomLeft(), plot.bottomRight());
    if (r.session == m_open) {
      p.setPen(QPen(palette().color(QPalette::Highlight), 2));
      p.drawRect(row.adjusted(1, 1, -1, -1));
    }
    // The curve: the total's highest value per bucket, on the shared axis and height.
    const RankCurve* curve = nullptr;
    for (const RankCurve& c : m_curves)
      if (c.session == r.session) curve = &c;
    if (curve == nullptr || curve->points.empty()) continue;
    QPolygonF line;
    for (const auto& [ts, bytes] : curve->points) {
      line << QPointF(plot.left() + static_cast<double>(ts - axis.fromWallNs) / span * plot.width(),
                      plot.bottom() - static_cast<double>(bytes) / top * plot.height());
    }
    p.setPen(QPen(QColor::fromRgb(need ? kNeedColor : kRankColor), 2));
    p.drawPolyline(line);
  }
  // The shared time axis under the rows: from the first rank's first sample.
  const double bottom = kHeader + static_cast<double>(j.ranks.size()) * kRowHeight;
  p.setPen(palette().color(QPalette::Text));
  p.drawText(QRectF(plotLeft, bottom + 2, plotWidth, 18), Qt::AlignLeft, tr("0 s"));
  p.drawText(QRectF(plotLeft, bottom + 2, plotWidth, 18), Qt::AlignRight,
             tr("%1 s").arg(span / 1e9, 0, 'f', 2));
}

}  // namespace tidemark::gui
