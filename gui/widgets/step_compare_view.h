#pragma once

#include <QWidget>
#include <optional>

#include "gui/model/step_compare.h"

namespace tidemark::gui {

// Two steps overlaid on one axis that starts at each step's beginning: the total's highest value
// per bucket, step A in blue and step B in orange, each with its peak.
class StepCompareView : public QWidget {
  Q_OBJECT
 public:
  // The colours of the two curves (for tests and the legend).
  static constexpr QRgb kColorA = 0xff1f5fa8, kColorB = 0xffe07b00;

  explicit StepCompareView(QWidget* parent = nullptr);
  void setComparison(std::optional<StepComparison> c);
  const std::optional<StepComparison>& comparison() const { return m_c; }

 protected:
  void paintEvent(QPaintEvent*) override;

 private:
  std::optional<StepComparison> m_c;
};

}  // namespace tidemark::gui
