#pragma once

#include <QString>
#include <QWidget>
#include <optional>
#include <vector>

#include "gui/client/daemon_client.h"
#include "gui/model/job_rows.h"

namespace tidemark::gui {

// A training job's ranks, one row each on one time axis (the realtime clock) and one height:
// each rank's total memory over time, its peak and median step; the rank that sets the job's
// memory need highlighted, the open session outlined. A click on a row opens that rank's
// session (rankClicked).
class JobView : public QWidget {
  Q_OBJECT
 public:
  // The memory need's curve and row (for tests and the legend), the other ranks' curves.
  static constexpr QRgb kNeedColor = 0xffd62728, kNeedRowColor = 0xfffde6e6,
                        kRankColor = 0xff1f77b4;

  explicit JobView(QWidget* parent = nullptr);
  // curves: by rank, as job.ranks (a rank without a curve draws none). openSession: outlined.
  void setJob(JobData job, std::vector<RankCurve> curves, uint64_t openSession);
  // Instead of a job: why there is none to show.
  void setMessage(const QString& text);
  const std::optional<JobData>& job() const { return m_job; }
  // The row of a rank's session (for tests: where to click), empty when not shown.
  QRect rowRect(uint64_t session) const;

 signals:
  void rankClicked(quint64 session);

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent* event) override;

 private:
  static constexpr int kHeader = 44, kRowHeight = 58;
  std::optional<JobData> m_job;
  std::vector<RankCurve> m_curves;
  uint64_t m_open = 0;
  QString m_message;
};

}  // namespace tidemark::gui
