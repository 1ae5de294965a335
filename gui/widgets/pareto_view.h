#pragma once

#include <QWidget>
#include <optional>
#include <utility>
#include <vector>

namespace tidemark::gui {

// The optimal plans' curve: extra time per step against the budget, with the chosen budget.
class ParetoView : public QWidget {
  Q_OBJECT
 public:
  explicit ParetoView(QWidget* parent = nullptr);
  void setCurve(std::vector<std::pair<int64_t, int64_t>> points, int64_t baseStepNs);
  void setChosen(std::optional<int64_t> budgetBytes);

 protected:
  void paintEvent(QPaintEvent*) override;

 private:
  std::vector<std::pair<int64_t, int64_t>> m_points;
  int64_t m_baseStepNs = 0;
  std::optional<int64_t> m_chosen;
};

}  // namespace tidemark::gui
