#pragma once

#include <QString>
#include <QWidget>
#include <vector>

#include "gui/model/icicle.h"

namespace tidemark::gui {

// The icicle of memory at the moment the inspector shows (gui/model/icicle.h): a row per depth of
// the module hierarchy, each module as wide as what it holds, coloured by the category of most
// of its bytes; names elided in the middle, the full name, its bytes and what it holds itself in
// a tooltip.
class IcicleView : public QWidget {
  Q_OBJECT
 public:
  explicit IcicleView(QWidget* parent = nullptr);
  void setMoment(const QString& title, std::vector<IcicleCell> cells, int64_t totalBytes);
  void setMessage(const QString& message);
  const std::vector<IcicleCell>& cells() const { return m_cells; }
  // The cell drawn at p (nullptr: none), and where a cell is drawn (tests click on them).
  const IcicleCell* cellAt(QPoint p) const;
  QRect cellRect(const IcicleCell& c) const;
  QString toolTipFor(const IcicleCell& c) const;
  QSize sizeHint() const override;

 protected:
  void paintEvent(QPaintEvent*) override;
  void mouseMoveEvent(QMouseEvent* e) override;

 private:
  static constexpr int kRowHeight = 24;
  static constexpr int kTop = 28;  // the title's line
  static constexpr int kMargin = 6;
  QString m_title, m_message;
  std::vector<IcicleCell> m_cells;
  int64_t m_totalBytes = 0;
  int m_depth = 0;
};

}  // namespace tidemark::gui
