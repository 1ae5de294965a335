#pragma once

#include <QMainWindow>
#include <memory>
#include <optional>

#include "gui/client/daemon_client.h"

class QComboBox;
class QLineEdit;
class QCheckBox;
class QLabel;
class QListWidget;
class QPushButton;
class QSlider;
class QTabWidget;
class QTreeWidgetItem;
class QTimer;
class QTreeWidget;

namespace tidemark::gui {

class TimelineView;
class JobView;
class IcicleView;
class ParetoView;
class StepCompareView;

// Sessions on the left; the timeline with its inspector in the middle; the plan panel below
// (budget slider → the advisor's plan, the Pareto curve, Apply for a live session).
class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(std::shared_ptr<DaemonClient> client, QWidget* parent = nullptr);

  void refreshSessions(std::optional<uint64_t> select = std::nullopt);
  // For tests and --screenshot: what has loaded so far.
  bool timelineLoaded() const { return m_timelineLoaded; }
  bool planLoaded() const { return m_planLoaded; }
  // The plan the panel shows (none when it says why there is none).
  const std::optional<PlanSummary>& currentPlan() const { return m_plan; }
  bool comparisonLoaded() const;
  bool jobLoaded() const { return m_jobLoaded; }
  void showStepsTab();
  void showJobTab();
  void showIcicleTab();
  // The icicle shows a moment (the peak once a session is open, or a moment clicked).
  bool icicleLoaded() const { return m_icicleLoaded; }
  IcicleView* icicle() const { return m_icicle; }
  void setBudgetPercent(int percent);
  // The plan space: nested plans, offloading over a link of `offload`'s speed ("" none).
  void setPlanOptions(const PlanOptions& options);
  // Whose memory the timeline, inspector and steps show: "" host and devices, "cpu", "cuda",
  // "cuda:N" (reloads the open session).
  void setDevice(const std::string& device);
  void inspectPeak();
  TimelineView* timeline() const { return m_timeline; }

 signals:
  void timelineReady();
  void planReady();
  void inspectorReady();
  void planSent(bool ok);
  void stepsReady();
  void lanesReady();
  void planChecked();
  void comparisonReady();
  void jobReady();    // the Job tab shows the open session's job (or says it has none)
  void stackReady();  // a tensor row clicked in the inspector shows its allocation stack
  // What was asked for cannot be shown (no daemon, no such session, its timeline failed): said
  // in the status bar too; the screenshot mode exits on it at once.
  void failed(const QString& why);
  void sessionEnded();  // the live session shown has ended (its state followed every second)

 private:
  void openSession(uint64_t id);
  void loadTimeline();
  void inspect(int64_t tsNs);
  void showStack(QTreeWidgetItem* tensor);
  void followState();
  void applyFilter();
  QString rowText(const SessionRow& r) const;
  void requestPlan();
  // The Pareto curve of the open session in the chosen plan space, then a plan.
  void loadPareto();
  PlanOptions planOptions() const;
  void applyPlan();
  void exportPng();
  void checkPlans();
  void showMoment(const Moment& m, const QString& title);
  void loadSteps();
  // The Job tab: the open session's training job, a row per rank (docs/jobs.md).
  void loadJob();
  void openStep(int row);
  void stepSelectionChanged();
  // Overlays two steps (rows of the Steps table) and lists the change at their peaks.
  void compareSteps(int rowA, int rowB);

  std::shared_ptr<DaemonClient> m_client;
  QListWidget* m_sessions = nullptr;
  TimelineView* m_timeline = nullptr;
  QTreeWidget* m_inspector = nullptr;
  QLineEdit* m_filter = nullptr;  // above the inspector: modules and tensors by name
  QTreeWidget* m_steps = nullptr;
  QTabWidget* m_side = nullptr;
  std::vector<StepRow> m_stepRows;
  StepCompareView* m_compare = nullptr;
  QTreeWidget* m_compareTable = nullptr;
  QSlider* m_budget = nullptr;
  QLabel* m_budgetLabel = nullptr;
  QLabel* m_planSummary = nullptr;
  // On a rank of a training job: plan for the whole job (from the rank that sets its memory
  // need; Apply sends it to every running rank, to switch at one step) or for this rank alone.
  QCheckBox* m_wholeJob = nullptr;
  QCheckBox* m_nested = nullptr;   // the plan space: nested plans
  QLineEdit* m_offload = nullptr;  // and offloading over a link of this speed ("" none)
  QLabel* m_planCheck = nullptr;   // predicted against measured, for plans sent to the session
  QTreeWidget* m_planSegments = nullptr;
  ParetoView* m_pareto = nullptr;
  QPushButton* m_apply = nullptr;
  QLabel* m_status = nullptr;
  QTimer* m_follow = nullptr;
  std::vector<SessionRow> m_rows;
  std::optional<SessionRow> m_current;
  std::optional<PlanSummary> m_plan;
  bool planForWholeJob() const;
  int64_t m_storeAll = 0;
  int m_generation = 0;     // answers for an older session or range are dropped
  int64_t m_shownTsNs = 0;  // the moment the inspector shows
  std::string m_device;     // whose memory (setDevice)
  QComboBox* m_deviceBox = nullptr;
  bool m_timelineLoaded = false;
  bool m_planLoaded = false;
  int m_planGeneration = 0;    // the newest plan asked for (a slow one's answer is dropped)
  int m_paretoGeneration = 0;  // the same for the Pareto curve
  JobView* m_jobView = nullptr;
  IcicleView* m_icicle = nullptr;
  bool m_icicleLoaded = false;
  bool m_jobLoaded = false;
};

}  // namespace tidemark::gui
