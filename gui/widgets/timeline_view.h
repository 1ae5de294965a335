#pragma once

#include <QRectF>
#include <QString>
#include <QWidget>
#include <optional>

#include "gui/model/lanes.h"
#include "gui/model/stacked_timeline.h"
#include "gui/model/view_range.h"

namespace tidemark::gui {

// The memory timeline: categories stacked in their fixed colours, the total's envelope, the peak
// marked (magenta), and a predicted peak line when a plan is shown. Wheel or +/- zoom about the
// pointer, drag or arrows pan, Home resets; hover shows the bucket's figures; a click asks for
// the state at that moment (momentClicked).
class TimelineView : public QWidget {
  Q_OBJECT
 public:
  explicit TimelineView(QWidget* parent = nullptr);

  void setLimits(int64_t fromNs, int64_t toNs);
  void setData(const StackedTimeline& data);
  void setPeak(int64_t tsNs, int64_t bytes);
  void setPredictedPeak(std::optional<int64_t> bytes);
  void setBudget(std::optional<int64_t> bytes);
  void setLanes(Lanes lanes);
  // The plan's predicted memory over the recorded step: (ts, bytes) points, drawn as a line.
  void setPredictedSeries(std::vector<std::pair<int64_t, int64_t>> points);
  // Where each step begins (step number, ts): dashed lines and numbers on the time axis.
  void setSteps(std::vector<std::pair<int64_t, int64_t>> stepBegins);
  // The moment the inspector shows (a thin line), or none.
  void setMark(std::optional<int64_t> tsNs);
  std::optional<int64_t> mark() const { return m_mark; }
  const Lanes& lanes() const { return m_lanes; }
  ViewRange& range() { return m_range; }
  int bucketsWanted() const { return std::max(64, width()); }
  // Where the peak is drawn (for tests and keyboard users).
  QPointF peakPoint() const;
  // The hover tooltip's text at x (widget coordinates): the bucket's figures; empty off the data.
  QString tipAt(double x) const;
  // The hover tooltip over a lane at `at` (widget coordinates): the module, op or kernel there,
  // when it began and how long it ran; empty off the lanes.
  QString laneTipAt(QPointF at) const;
  // The time at x (widget coordinates).
  int64_t timeAt(double x) const;

 signals:
  void rangeChanged(qint64 fromNs, qint64 toNs);
  void momentClicked(qint64 tsNs);
  void peakClicked();  // the peak's dot: the inspector shows the peak itself

 protected:
  void paintEvent(QPaintEvent*) override;
  void wheelEvent(QWheelEvent*) override;
  void mousePressEvent(QMouseEvent*) override;
  void mouseMoveEvent(QMouseEvent*) override;
  void mouseReleaseEvent(QMouseEvent*) override;
  void keyPressEvent(QKeyEvent*) override;

 public:
  // The legend's entries: a category drawn in the range, its name and where it goes.
  struct LegendEntry {
    int category;
    QString name;
    QRectF box;
  };
  std::vector<LegendEntry> legend() const;

 private:
  QRectF plotRect() const;
  double yOf(int64_t bytes, const QRectF& r) const;
  void changed();

  ViewRange m_range;
  StackedTimeline m_data;
  Lanes m_lanes;
  std::vector<std::pair<int64_t, int64_t>> m_predictedSeries;
  int64_t m_peakNs = -1, m_peakBytes = 0;
  std::optional<int64_t> m_predicted, m_budget;
  std::vector<std::pair<int64_t, int64_t>> m_stepBegins;
  std::optional<int64_t> m_mark;
  std::optional<QPointF> m_dragFrom;
  int64_t m_dragStartFrom = 0;
  bool m_dragged = false;
};

}  // namespace tidemark::gui
