#include "gui/widgets/main_window.h"

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenuBar>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollArea>
#include <QSlider>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QTreeWidget>
#include <QTreeWidgetItemIterator>
#include <QVBoxLayout>
#include <algorithm>

#include "gui/client/job_plan.h"
#include "gui/model/format.h"
#include "gui/widgets/async.h"
#include "gui/widgets/icicle_view.h"
#include "gui/widgets/job_view.h"
#include "gui/widgets/pareto_view.h"
#include "gui/widgets/step_compare_view.h"
#include "gui/widgets/timeline_view.h"

namespace tidemark::gui {

namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

QString bytes(int64_t b) { return QString::fromStdString(humanBytes(b)); }

// A category's colour as text (names in the inspector and the steps' table): readable on white.
QColor color(int c) {
  const Rgb rgb = readableOnWhite(categoryColors()[static_cast<size_t>(c)]);
  return QColor(rgb.r, rgb.g, rgb.b);
}

}  // namespace

MainWindow::MainWindow(std::shared_ptr<DaemonClient> client, QWidget* parent)
    : QMainWindow(parent), m_client(std::move(client)) {
  setWindowTitle(tr("tidemark — %1").arg(q(m_client->address())));
  m_sessions = new QListWidget;
  m_sessions->setMinimumWidth(220);
  m_sessions->setTextElideMode(Qt::ElideMiddle);
  m_sessions->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);  // elided, not scrolled
  // Names for tests and accessibility tools.
  m_sessions->setObjectName(QStringLiteral("sessions"));
  m_timeline = new TimelineView;
  m_inspector = new QTreeWidget;
  m_inspector->setHeaderLabels({tr("What is live"), tr("Bytes")});
  m_inspector->setMinimumWidth(280);
  m_inspector->setObjectName(QStringLiteral("inspector"));
  m_inspector->header()->setStretchLastSection(false);
  m_inspector->header()->setSectionResizeMode(0, QHeaderView::Stretch);
  m_inspector->header()->setSectionResizeMode(1, QHeaderView::ResizeToContents);
  // Module paths and tensor names differ at their ends: cut in the middle, whole in a tooltip.
  m_inspector->setTextElideMode(Qt::ElideMiddle);
  // A tensor row clicked: its block's allocation stack beneath it (where the recording has one).
  connect(m_inspector, &QTreeWidget::itemClicked, this,
          [this](QTreeWidgetItem* item, int) { showStack(item); });

  // The plan panel.
  auto* plan = new QWidget;
  auto* planLayout = new QHBoxLayout(plan);
  // The slider, the plan and its outcomes (a job's: a line per rank) scroll when they outgrow
  // the panel.
  auto* leftArea = new QScrollArea;
  leftArea->setWidgetResizable(true);
  leftArea->setFrameShape(QFrame::NoFrame);
  leftArea->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);  // the labels wrap instead
  auto* leftWidget = new QWidget;
  auto* left = new QVBoxLayout(leftWidget);
  left->setContentsMargins(0, 0, 0, 0);
  leftArea->setWidget(leftWidget);
  m_budget = new QSlider(Qt::Horizontal);
  m_budget->setRange(10, 100);
  m_budget->setValue(70);
  m_budget->setObjectName(QStringLiteral("budget"));
  m_budgetLabel = new QLabel;
  m_budgetLabel->setWordWrap(true);
  m_planSummary = new QLabel(tr("choose a session"));
  m_planSummary->setWordWrap(true);
  m_planSummary->setObjectName(QStringLiteral("planSummary"));
  m_apply = new QPushButton(tr("Apply to the running job"));
  m_apply->setEnabled(false);
  m_apply->setObjectName(QStringLiteral("apply"));
  m_wholeJob = new QCheckBox(tr("Plan for the whole job"));
  m_wholeJob->setToolTip(
      tr("The plan is made from the rank that sets the job's memory need; Apply sends it to every "
         "running rank, and all switch at one step"));
  m_wholeJob->setObjectName(QStringLiteral("wholeJob"));
  m_wholeJob->setChecked(true);
  m_wholeJob->setVisible(false);
  m_nested = new QCheckBox(tr("Nested checkpointing"));
  m_nested->setToolTip(
      tr("A recomputed segment's re-run may checkpoint parts of itself again (tidemark plan "
         "--nested): lower budgets fit, at more recomputation"));
  m_nested->setObjectName(QStringLiteral("nested"));
  m_offload = new QLineEdit;
  m_offload->setPlaceholderText(tr("Offload to host at… (e.g. 12GB/s)"));
  m_offload->setToolTip(
      tr("Plans may also move stages' saved tensors to host memory over a link of this speed "
         "(tidemark plan --offload); empty: recomputation only"));
  m_offload->setObjectName(QStringLiteral("offload"));
  m_offload->setClearButtonEnabled(true);
  left->addWidget(m_budgetLabel);
  left->addWidget(m_budget);
  left->addWidget(m_nested);
  left->addWidget(m_offload);
  left->addWidget(m_wholeJob);
  left->addWidget(m_planSummary);
  left->addWidget(m_apply);
  m_planCheck = new QLabel;
  m_planCheck->setObjectName(QStringLiteral("planCheck"));
  m_planCheck->setWordWrap(true);
  left->addWidget(m_planCheck);
  left->addStretch();
  m_planSegments = new QTreeWidget;
  m_planSegments->setHeaderLabels({tr("Mode"), tr("Modules")});
  m_planSegments->setObjectName(QStringLiteral("planSegments"));
  m_pareto = new ParetoView;
  planLayout->addWidget(leftArea, 2);
  planLayout->addWidget(m_planSegments, 2);
  planLayout->addWidget(m_pareto, 2);

  // Steps: each step's time and peak, and the change from the step before; a click shows it.
  m_steps = new QTreeWidget;
  m_steps->setObjectName(QStringLiteral("steps"));
  m_steps->setHeaderLabels({tr("Step"), tr("Time"), tr("Peak"), tr("Change")});
  m_steps->setRootIsDecorated(false);
  m_steps->setSelectionMode(QAbstractItemView::ExtendedSelection);
  // Under the table: two steps overlaid (the first and last finished, or the two selected) and
  // the change between their peaks by category.
  m_compare = new StepCompareView;
  m_compare->setObjectName(QStringLiteral("stepCompare"));
  m_compareTable = new QTreeWidget;
  m_compareTable->setObjectName(QStringLiteral("stepCompareTable"));
  m_compareTable->setHeaderLabels({tr("At the peak"), tr("A"), tr("B"), tr("Change")});
  m_compareTable->setRootIsDecorated(false);
  // Every column fits its contents, the first takes the rest: the Change column is never
  // pushed behind a scrollbar (nor the steps' table's).
  for (QTreeWidget* table : {m_steps, m_compareTable}) {
    table->header()->setStretchLastSection(false);
    table->header()->setSectionResizeMode(QHeaderView::ResizeToContents);
    table->header()->setSectionResizeMode(0, QHeaderView::Stretch);
  }
  auto* stepsTab = new QSplitter(Qt::Vertical);
  stepsTab->addWidget(m_steps);
  stepsTab->addWidget(m_compare);
  stepsTab->addWidget(m_compareTable);
  stepsTab->setSizes({200, 260, 200});
  auto* side = m_side = new QTabWidget;
  side->setObjectName(QStringLiteral("side"));
  // The inspector under a filter box: rows of modules and tensors whose name holds the text.
  m_filter = new QLineEdit;
  m_filter->setObjectName(QStringLiteral("filter"));
  m_filter->setPlaceholderText(tr("Filter modules and tensors"));
  m_filter->setClearButtonEnabled(true);
  connect(m_filter, &QLineEdit::textChanged, this, [this] { applyFilter(); });
  auto* inspectorTab = new QWidget;
  auto* inspectorLayout = new QVBoxLayout(inspectorTab);
  inspectorLayout->setContentsMargins(0, 0, 0, 0);
  inspectorLayout->addWidget(m_filter);
  inspectorLayout->addWidget(m_inspector);
  side->addTab(inspectorTab, tr("Inspector"));
  side->addTab(stepsTab, tr("Steps"));
  // The open session's training job: a row per rank (as many as there are, scrolled).
  m_jobView = new JobView;
  m_jobView->setObjectName(QStringLiteral("jobView"));
  auto addScrolledTab = [side](QWidget* content, const QString& name) {
    auto* tab = new QScrollArea;
    tab->setWidgetResizable(true);
    tab->setWidget(content);
    side->addTab(tab, name);
  };
  addScrolledTab(m_jobView, tr("Job"));
  // Memory at the inspector's moment by module hierarchy.
  m_icicle = new IcicleView;
  m_icicle->setObjectName(QStringLiteral("icicle"));
  addScrolledTab(m_icicle, tr("Icicle"));
  connect(m_jobView, &JobView::rankClicked, this, [this](quint64 session) {
    for (size_t i = 0; i < m_rows.size(); ++i) {
      if (m_rows[i].id != session) continue;
      m_sessions->setCurrentRow(static_cast<int>(i));
      return;
    }
    refreshSessions(session);  // a rank that began after the list was read
  });
  auto* middle = new QSplitter(Qt::Horizontal);
  middle->addWidget(m_timeline);
  middle->addWidget(side);
  // The side panel keeps a third of the width as the window grows (and what it is dragged to).
  middle->setStretchFactor(0, 2);
  middle->setStretchFactor(1, 1);
  middle->setSizes({640, 360});
  auto* right = new QSplitter(Qt::Vertical);
  right->addWidget(middle);
  right->addWidget(plan);
  right->setStretchFactor(0, 3);
  auto* top = new QSplitter(Qt::Horizontal);
  top->addWidget(m_sessions);
  top->addWidget(right);
  top->setStretchFactor(1, 4);
  setCentralWidget(top);
  m_status = new QLabel;
  statusBar()->addWidget(m_status);
  // Whose memory: a GPU job's host and device memory together, or one side.
  m_deviceBox = new QComboBox;
  m_deviceBox->setObjectName(QStringLiteral("device"));
  m_deviceBox->addItem(tr("Memory: host and GPUs"), QString());
  m_deviceBox->addItem(tr("Memory: GPUs (cuda)"), QStringLiteral("cuda"));
  m_deviceBox->addItem(tr("Memory: host (cpu)"), QStringLiteral("cpu"));
  statusBar()->addPermanentWidget(m_deviceBox);
  connect(m_deviceBox, &QComboBox::currentIndexChanged, this,
          [this](int index) { setDevice(m_deviceBox->itemData(index).toString().toStdString()); });

  QMenu* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("Export view as &PNG…"), this, &MainWindow::exportPng);
  file->addAction(tr("&Refresh sessions"), this, [this] { refreshSessions(); });
  file->addAction(tr("&Quit"), this, &QWidget::close);

  m_follow = new QTimer(this);
  m_follow->setInterval(1000);
  connect(m_follow, &QTimer::timeout, this, [this] {
    loadTimeline();
    checkPlans();
    followState();
  });
  connect(m_sessions, &QListWidget::currentRowChanged, this, [this](int row) {
    if (row >= 0 && row < static_cast<int>(m_rows.size()))
      openSession(m_rows[static_cast<size_t>(row)].id);
  });
  connect(m_timeline, &TimelineView::rangeChanged, this, [this] { loadTimeline(); });
  connect(m_timeline, &TimelineView::momentClicked, this, [this](qint64 ts) { inspect(ts); });
  connect(m_timeline, &TimelineView::peakClicked, this, [this] { inspectPeak(); });
  connect(m_budget, &QSlider::valueChanged, this, [this] { requestPlan(); });
  connect(m_nested, &QCheckBox::toggled, this, [this] { loadPareto(); });
  // The speed is read when its text is done (Return or leaving the field), not at each key.
  connect(m_offload, &QLineEdit::editingFinished, this, [this] {
    if (m_offload->isModified()) {
      m_offload->setModified(false);
      loadPareto();
    }
  });
  connect(m_apply, &QPushButton::clicked, this, &MainWindow::applyPlan);
  connect(m_wholeJob, &QCheckBox::toggled, this, [this] {
    m_planCheck->clear();
    requestPlan();
    checkPlans();
  });
  connect(m_steps, &QTreeWidget::itemSelectionChanged, this, &MainWindow::stepSelectionChanged);
  resize(1280, 800);
  requestPlan();  // labels the budget slider; plans come once a session is open
}

QString MainWindow::rowText(const SessionRow& r) const {
  // A rank of a job says which (its job in the Job tab).
  const QString rank = r.jobId == 0  ? QString()
                       : r.rank >= 0 ? tr("job %1 rank %2 · ").arg(r.jobId).arg(r.rank)
                                     : tr("job %1 · ").arg(r.jobId);
  return tr("%1%2  %3%4 · %5 steps")
      .arg(r.id)
      .arg(r.live ? tr(" ● live") : QString())
      .arg(rank)
      .arg(q(r.name.empty() ? r.command.substr(0, 40) : r.name))
      .arg(r.steps);
}

void MainWindow::refreshSessions(std::optional<uint64_t> select) {
  m_status->setText(tr("listing sessions…"));
  runAsync<absl::StatusOr<std::vector<SessionRow>>>(
      this, [c = m_client] { return c->sessions(); },
      [this, select](absl::StatusOr<std::vector<SessionRow>> rows) {
        if (!rows.ok()) {
          const QString why =
              tr("no tidemarkd at %1: %2")
                  .arg(q(m_client->address()), q(std::string(rows.status().message())));
          m_status->setText(why);
          emit failed(why);
          return;
        }
        m_rows = std::move(*rows);
        m_sessions->clear();
        int selectRow = -1;
        for (size_t i = 0; i < m_rows.size(); ++i) {
          const SessionRow& r = m_rows[i];
          m_sessions->addItem(rowText(r));
          m_sessions->item(m_sessions->count() - 1)->setToolTip(q(r.command));
          if (select && r.id == *select) selectRow = static_cast<int>(i);
        }
        m_status->setText(tr("%1 sessions").arg(m_rows.size()));
        if (selectRow >= 0) {
          m_sessions->setCurrentRow(selectRow);
        } else if (select) {
          const QString why = tr("no session %1 at %2 (yours: tidemark sessions)")
                                  .arg(*select)
                                  .arg(q(m_client->address()));
          m_status->setText(why);
          emit failed(why);
        }
      });
}

// A followed session that has ended: its row, the Apply button and the figures say so at once.
void MainWindow::followState() {
  if (!m_current || !m_current->live) return;
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  runAsync<absl::StatusOr<SessionRow>>(
      this, [c = m_client, id] { return c->session(id); },
      [this, gen](absl::StatusOr<SessionRow> row) {
        if (gen != m_generation || !row.ok() || row->live || !m_current->live) return;
        m_current = *row;
        m_follow->stop();
        m_apply->setEnabled(false);
        for (size_t i = 0; i < m_rows.size(); ++i) {
          if (m_rows[i].id != row->id) continue;
          m_rows[i] = *row;
          if (QListWidgetItem* item = m_sessions->item(static_cast<int>(i)))
            item->setText(rowText(*row));
        }
        m_status->setText(tr("session %1 ended").arg(row->id));
        // Its final figures: the whole range, the peak, every step.
        m_timeline->setLimits(row->startNs,
                              row->endNs > row->startNs ? row->endNs : row->startNs + 1);
        loadTimeline();
        inspectPeak();
        loadSteps();
        emit sessionEnded();
      });
}

void MainWindow::openSession(uint64_t id) {
  for (const SessionRow& r : m_rows)
    if (r.id == id) m_current = r;
  if (!m_current) return;
  ++m_generation;
  m_timelineLoaded = m_planLoaded = m_icicleLoaded = false;
  m_plan.reset();
  m_apply->setEnabled(false);
  m_timeline->setPredictedPeak(std::nullopt);
  m_timeline->setPredictedSeries({});
  m_timeline->setBudget(std::nullopt);
  const int64_t end = m_current->endNs > 0 ? m_current->endNs : m_current->startNs + 1'000'000'000;
  m_timeline->setLimits(m_current->startNs, end);
  m_stepRows.clear();
  m_steps->clear();
  m_timeline->setSteps({});
  m_timeline->setMark(std::nullopt);
  m_compare->setComparison(std::nullopt);
  m_compareTable->clear();
  if (m_current->live)
    m_follow->start();
  else
    m_follow->stop();
  m_planCheck->clear();
  m_wholeJob->setVisible(m_current->jobId != 0);
  loadTimeline();
  inspectPeak();
  loadSteps();
  checkPlans();
  loadJob();
  loadPareto();
}

PlanOptions MainWindow::planOptions() const {
  PlanOptions o;
  o.nested = m_nested->isChecked();
  o.offload = m_offload->text().trimmed().toStdString();
  return o;
}

void MainWindow::setPlanOptions(const PlanOptions& options) {
  const QSignalBlocker quiet(m_nested);
  m_nested->setChecked(options.nested);
  m_offload->setText(QString::fromStdString(options.offload));
  m_offload->setModified(false);
  loadPareto();
}

void MainWindow::loadPareto() {
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const PlanOptions options = planOptions();
  const int gen = m_generation;
  // A newer plan space's curve (or session's) replaces this one's: this answer is dropped. So
  // is a plan asked for in the plan space before (it would show, and apply, the old space's).
  const int paretoGen = ++m_paretoGeneration;
  ++m_planGeneration;
  m_planLoaded = false;
  runAsync<absl::StatusOr<ParetoData>>(
      this, [c = m_client, id, options] { return c->pareto(id, options); },
      [this, gen, paretoGen](absl::StatusOr<ParetoData> d) {
        if (gen != m_generation || paretoGen != m_paretoGeneration) return;
        if (!d.ok()) {
          // No chain in this session (an imported trace, say), or a plan space it cannot have
          // (offloading a host-only session, a speed that is not one): the panel says why.
          m_pareto->setCurve({}, 0);
          m_planSegments->clear();
          m_timeline->setPredictedPeak(std::nullopt);
          m_plan.reset();
          m_apply->setEnabled(false);
          m_planSummary->setText(tr("no plan: %1").arg(q(std::string(d.status().message()))));
          m_planLoaded = true;
          emit planReady();
          return;
        }
        m_storeAll = d->storeAllPeakBytes;
        m_pareto->setCurve(d->points, d->baseStepNs);
        requestPlan();
      });
}

void MainWindow::loadTimeline() {
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const bool whole = !m_timeline->range().zoomed();
  const int64_t from = whole ? 0 : m_timeline->range().from();
  const int64_t to = whole ? 0 : m_timeline->range().to();
  const int buckets = m_timeline->bucketsWanted();
  const int gen = m_generation;
  runAsync<absl::StatusOr<TimelineData>>(
      this,
      [c = m_client, id, from, to, buckets, d = m_device] {
        return c->timeline(id, from, to, buckets, d);
      },
      [this, gen, whole](absl::StatusOr<TimelineData> t) {
        if (gen != m_generation) return;
        if (!t.ok()) {
          const QString why = tr("timeline: %1").arg(q(std::string(t.status().message())));
          m_status->setText(why);
          emit failed(why);
          return;
        }
        if (whole && !m_timeline->range().zoomed()) {
          // A live session's answer may leave the range open: the buckets bound it then.
          int64_t from = t->fromNs, to = t->toNs;
          if (to <= from && !t->buckets.empty()) {
            from = t->buckets.front().startNs;
            to = t->buckets.back().endNs;
          }
          m_timeline->range().setLimits(from, to);
          m_timeline->range().reset();
        }
        m_timeline->setData(StackedTimeline::build(t->buckets));
        m_timelineLoaded = true;
        emit timelineReady();
      });
  // The lanes: scopes at least a pixel wide in the range shown.
  const int64_t span = whole ? 0 : to - from;
  const int64_t minNs = span > 0 ? span / std::max(1, buckets) : 0;
  runAsync<absl::StatusOr<std::vector<LaneSpan>>>(
      this, [c = m_client, id, from, to, minNs] { return c->scopes(id, from, to, minNs); },
      [this, gen](absl::StatusOr<std::vector<LaneSpan>> spans) {
        if (gen != m_generation || !spans.ok()) return;
        m_timeline->setLanes(layoutLanes(*spans));
        emit lanesReady();
      });
}

void MainWindow::inspectPeak() {
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  runAsync<absl::StatusOr<Moment>>(
      this, [c = m_client, id, d = m_device] { return c->peak(id, d); },
      [this, gen](absl::StatusOr<Moment> m) {
        if (gen != m_generation) return;
        if (!m.ok()) {
          // Said where the answer would be (e.g. a GPU filter on a CPU job), not left blank.
          m_inspector->clear();
          new QTreeWidgetItem(m_inspector, {q(std::string(m.status().message())), QString()});
          m_status->setText(q(std::string(m.status().message())));
          emit inspectorReady();
          return;
        }
        m_timeline->setPeak(m->tsNs, m->trackedBytes);
        showMoment(*m, tr("At the peak"));
      });
}

void MainWindow::inspect(int64_t tsNs) {
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  runAsync<absl::StatusOr<Moment>>(
      this, [c = m_client, id, tsNs, d = m_device] { return c->at(id, tsNs, d); },
      [this, gen](absl::StatusOr<Moment> m) {
        if (gen != m_generation || !m.ok()) return;
        showMoment(*m, tr("At the moment clicked"));
      });
}

void MainWindow::loadSteps() {
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  runAsync<absl::StatusOr<std::vector<StepRow>>>(
      this, [c = m_client, id, d = m_device] { return c->steps(id, d); },
      [this, gen](absl::StatusOr<std::vector<StepRow>> rows) {
        if (gen != m_generation || !rows.ok()) return;
        m_stepRows = std::move(*rows);
        std::vector<std::pair<int64_t, int64_t>> begins;
        for (const StepRow& s : m_stepRows) begins.emplace_back(s.step, s.beginNs);
        m_timeline->setSteps(std::move(begins));
        m_steps->clear();
        int64_t previous = -1;
        for (const StepRow& s : m_stepRows) {
          const int64_t peak = s.peak.trackedBytes;
          const QString change = previous < 0       ? QString()
                                 : peak >= previous ? QStringLiteral("+") + bytes(peak - previous)
                                                    : QStringLiteral("-") + bytes(previous - peak);
          auto* item = new QTreeWidgetItem(
              m_steps, {s.summarized ? tr("%1 (summary)").arg(s.step)
                        : s.inferred ? tr("%1 (inferred)").arg(s.step)
                                     : QString::number(s.step),
                        s.endNs > 0 ? tr("%1 ms").arg((s.endNs - s.beginNs) / 1e6, 0, 'f', 1)
                                    : tr("running"),
                        bytes(peak), change});
          if (s.summarized) {
            item->setToolTip(0, tr("Recorded as a summary (capture schedule): the peak as the "
                                   "agent measured it, by tag only; no timeline or items"));
          } else if (s.inferred) {
            item->setToolTip(0, tr("Inferred from the memory's repetition: the recording has no "
                                   "step marks (no adapter), so its bounds are a guess"));
          }
          previous = peak;
        }
        // Summarized steps have no timeline to compare.
        std::vector<StepSpan> spans;
        for (const StepRow& s : m_stepRows)
          spans.push_back(s.summarized ? StepSpan{0, 0} : StepSpan{s.beginNs, s.endNs});
        if (const auto pair = defaultComparison(spans))
          compareSteps(static_cast<int>(pair->first), static_cast<int>(pair->second));
        emit stepsReady();
      });
}

void MainWindow::openStep(int row) {
  if (row < 0 || row >= static_cast<int>(m_stepRows.size())) return;
  const StepRow& s = m_stepRows[static_cast<size_t>(row)];
  if (s.endNs > s.beginNs && !s.summarized) {
    m_timeline->range().set(s.beginNs, s.endNs);
    loadTimeline();
  }
  showMoment(s.peak, tr("At the peak of step %1").arg(s.step));
}

void MainWindow::stepSelectionChanged() {
  std::vector<int> rows;
  for (QTreeWidgetItem* item : m_steps->selectedItems())
    rows.push_back(m_steps->indexOfTopLevelItem(item));
  std::sort(rows.begin(), rows.end());
  if (rows.size() == 1) openStep(rows[0]);
  if (rows.size() == 2) compareSteps(rows[0], rows[1]);
}

void MainWindow::compareSteps(int rowA, int rowB) {
  const int n = static_cast<int>(m_stepRows.size());
  if (!m_current || rowA < 0 || rowB < 0 || rowA >= n || rowB >= n) return;
  const StepRow a = m_stepRows[static_cast<size_t>(rowA)];
  const StepRow b = m_stepRows[static_cast<size_t>(rowB)];
  if (a.endNs <= a.beginNs || b.endNs <= b.beginNs) {
    m_status->setText(tr("a running step cannot be compared yet"));
    return;
  }
  if (a.summarized || b.summarized) {
    m_status->setText(tr("a summarized step has no timeline to compare"));
    return;
  }
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  const int buckets = std::max(64, m_compare->width());
  using Pair = std::pair<absl::StatusOr<TimelineData>, absl::StatusOr<TimelineData>>;
  runAsync<Pair>(
      this,
      [c = m_client, id, a, b, buckets] {
        return Pair(c->timeline(id, a.beginNs, a.endNs, buckets),
                    c->timeline(id, b.beginNs, b.endNs, buckets));
      },
      [this, gen, a, b](Pair t) {
        if (gen != m_generation) return;
        if (!t.first.ok() || !t.second.ok()) {
          m_status->setText(
              tr("step comparison: %1")
                  .arg(q(std::string((t.first.ok() ? t.second : t.first).status().message()))));
          return;
        }
        const StepComparison c = tidemark::gui::compareSteps(
            stepCurve(a.step, a.beginNs, t.first->buckets), a.peak.bytes,
            stepCurve(b.step, b.beginNs, t.second->buckets), b.peak.bytes);
        m_compareTable->clear();
        m_compareTable->setHeaderLabels({tr("At the peak"), tr("step %1").arg(a.step),
                                         tr("step %1").arg(b.step), tr("Change")});
        auto signedBytes = [](int64_t d) {
          return d == 0  ? QStringLiteral("0")
                 : d > 0 ? QStringLiteral("+") + bytes(d)
                         : QStringLiteral("-") + bytes(-d);
        };
        new QTreeWidgetItem(m_compareTable,
                            {tr("total"), bytes(a.peak.trackedBytes), bytes(b.peak.trackedBytes),
                             signedBytes(b.peak.trackedBytes - a.peak.trackedBytes)});
        for (int k = 0; k < kCategories; ++k) {
          const auto ck = static_cast<size_t>(k);
          if (c.peakA[ck] == 0 && c.peakB[ck] == 0) continue;
          auto* it = new QTreeWidgetItem(m_compareTable,
                                         {q(std::string(categoryLabel(k))), bytes(c.peakA[ck]),
                                          bytes(c.peakB[ck]), signedBytes(c.change(k))});
          it->setForeground(0, color(k));
        }
        m_compare->setComparison(c);
        emit comparisonReady();
      });
}

void MainWindow::applyFilter() {
  const QString text = m_filter->text().trimmed();
  for (int i = 0; i < m_inspector->topLevelItemCount(); ++i) {
    QTreeWidgetItem* group = m_inspector->topLevelItem(i);
    if (group->text(0) != tr("By module") && group->text(0) != tr("By tensor")) continue;
    for (int k = 0; k < group->childCount(); ++k) {
      QTreeWidgetItem* row = group->child(k);
      row->setHidden(!text.isEmpty() && !row->text(0).contains(text, Qt::CaseInsensitive));
    }
  }
}

void MainWindow::showStack(QTreeWidgetItem* tensor) {
  const uint64_t address = tensor->data(0, Qt::UserRole).toULongLong();
  if (!m_current || address == 0 || tensor->childCount() > 0) return;
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  const int64_t at = m_shownTsNs;
  // The row may be gone (another moment shown) when the answer comes: found again by address.
  runAsync<absl::StatusOr<std::vector<std::string>>>(
      this, [c = m_client, id, address, at] { return c->blockStack(id, address, at); },
      [this, gen, address, at](absl::StatusOr<std::vector<std::string>> frames) {
        if (gen != m_generation || at != m_shownTsNs) return;
        QTreeWidgetItem* row = nullptr;
        for (QTreeWidgetItemIterator it(m_inspector); *it; ++it)
          if ((*it)->data(0, Qt::UserRole).toULongLong() == address) row = *it;
        if (row == nullptr || row->childCount() > 0) return;
        if (!frames.ok()) {
          new QTreeWidgetItem(row, {q(std::string(frames.status().message())), QString()});
        } else if (frames->empty()) {
          new QTreeWidgetItem(row, {tr("no allocation stack recorded"), QString()});
        } else {
          auto* from = new QTreeWidgetItem(
              row, {tr("allocated from (block 0x%1)").arg(address, 0, 16), QString()});
          for (const std::string& f : *frames) {
            // The file's last component on the row; the whole frame in its tooltip.
            QString text = q(f);
            const qsizetype open = text.lastIndexOf(QStringLiteral(" ("));
            const qsizetype slash = text.lastIndexOf(QLatin1Char('/'));
            if (open >= 0 && slash > open) text = text.left(open + 2) + text.mid(slash + 1);
            auto* frame = new QTreeWidgetItem(from, {text, QString()});
            frame->setToolTip(0, q(f));
          }
        }
        row->setExpanded(true);
        for (int i = 0; i < row->childCount(); ++i) row->child(i)->setExpanded(true);
        emit stackReady();
      });
}

void MainWindow::showMoment(const Moment& m, const QString& title) {
  m_shownTsNs = m.tsNs;
  m_inspector->clear();
  auto* head = new QTreeWidgetItem(m_inspector, {title, bytes(m.trackedBytes)});
  if (!m.phase.empty() || !m.scope.empty())
    new QTreeWidgetItem(head, {tr("%1 %2").arg(q(m.phase), q(m.scope)), QString()});
  if (m.reservedBytes >= 0) new QTreeWidgetItem(head, {tr("reserved"), bytes(m.reservedBytes)});
  auto* cats = new QTreeWidgetItem(m_inspector, {tr("By category"), QString()});
  for (int c = 0; c < kCategories; ++c) {
    if (m.bytes[static_cast<size_t>(c)] == 0) continue;
    auto* it = new QTreeWidgetItem(
        cats, {q(std::string(categoryLabel(c))), bytes(m.bytes[static_cast<size_t>(c)])});
    it->setForeground(0, color(c));
  }
  auto list = [&](const QString& title, const std::vector<Item>& items) {
    if (items.empty()) return;
    auto* top = new QTreeWidgetItem(m_inspector, {title, QString()});
    for (size_t i = 0; i < items.size() && i < 12; ++i) {
      auto* row = new QTreeWidgetItem(
          top,
          {q(items[i].name) + QStringLiteral(" · ") + q(items[i].category), bytes(items[i].bytes)});
      row->setToolTip(0, row->text(0));
      if (items[i].address != 0) {
        row->setData(0, Qt::UserRole, QVariant::fromValue<qulonglong>(items[i].address));
        row->setToolTip(0, tr("%1\nblock 0x%2: click for its allocation stack")
                               .arg(row->text(0))
                               .arg(items[i].address, 0, 16));
      }
    }
  };
  list(tr("By module"), m.modules);
  list(tr("By tensor"), m.tensors);
  applyFilter();
  m_inspector->expandAll();
  std::vector<IcicleModule> modules;
  for (const Item& it : m.modules) modules.push_back({it.name, it.category, it.bytes});
  m_icicle->setMoment(title, icicleLayout(modules, m.trackedBytes), m.trackedBytes);
  m_icicleLoaded = true;
  emit inspectorReady();
}

bool MainWindow::comparisonLoaded() const { return m_compare->comparison().has_value(); }

void MainWindow::showStepsTab() { m_side->setCurrentIndex(1); }

void MainWindow::showJobTab() { m_side->setCurrentIndex(2); }

void MainWindow::showIcicleTab() { m_side->setCurrentIndex(3); }

void MainWindow::loadJob() {
  m_jobLoaded = false;
  const SessionRow open = *m_current;
  if (open.jobId == 0) {
    m_jobView->setMessage(tr("session %1 is not a rank of a training job: its process found no "
                             "job key (tidemark run --job NAME, torchrun's run id, or "
                             "MASTER_ADDR:MASTER_PORT; docs/jobs.md)")
                              .arg(open.id));
    m_jobLoaded = true;
    emit jobReady();
    return;
  }
  struct Loaded {
    absl::StatusOr<JobData> job;
    std::vector<RankCurve> curves;
  };
  const int gen = m_generation;
  runAsync<std::shared_ptr<Loaded>>(
      this,
      [c = m_client, jobId = open.jobId] {
        auto out = std::make_shared<Loaded>(Loaded{c->job(jobId), {}});
        if (!out->job.ok()) return out;
        // Each rank's total over its whole run (a rank whose timeline fails draws no curve).
        for (const JobRank& r : out->job->ranks) {
          auto t = c->timeline(r.session, 0, 0, 120);
          if (t.ok())
            out->curves.push_back(rankCurve(r.session, r.startNs, r.startWallNs, t->buckets));
        }
        return out;
      },
      [this, gen, id = open.id](std::shared_ptr<Loaded> loaded) {
        if (gen != m_generation) return;
        if (!loaded->job.ok()) {
          m_jobView->setMessage(tr("the job of session %1: %2")
                                    .arg(id)
                                    .arg(q(std::string(loaded->job.status().message()))));
        } else {
          m_jobView->setJob(std::move(*loaded->job), std::move(loaded->curves), id);
        }
        m_jobLoaded = true;
        emit jobReady();
      });
}

void MainWindow::setDevice(const std::string& device) {
  if (device == m_device) return;
  m_device = device;
  // The box shows it (a device not listed, "cuda:1" say, is added).
  int index = m_deviceBox->findData(QString::fromStdString(device));
  if (index < 0) {
    m_deviceBox->addItem(tr("Memory: %1").arg(QString::fromStdString(device)),
                         QString::fromStdString(device));
    index = m_deviceBox->count() - 1;
  }
  if (m_deviceBox->currentIndex() != index) m_deviceBox->setCurrentIndex(index);
  if (m_current) openSession(m_current->id);
}

void MainWindow::setBudgetPercent(int percent) { m_budget->setValue(percent); }

bool MainWindow::planForWholeJob() const {
  return m_current && m_current->jobId != 0 && m_wholeJob->isChecked();
}

void MainWindow::requestPlan() {
  m_budgetLabel->setText(
      tr("Budget: %1 % of the store-all peak above static memory").arg(m_budget->value()));
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const std::string budget = std::to_string(m_budget->value()) + "%";
  const int gen = ++m_planGeneration;
  const int sessionGen = m_generation;
  const uint64_t job = planForWholeJob() ? m_current->jobId : 0;
  const PlanOptions options = planOptions();
  // A plan for the session, or for its job: made from the rank that sets the job's memory need.
  runAsync<absl::StatusOr<JobPlan>>(
      this,
      [c = m_client, id, job, budget, options]() -> absl::StatusOr<JobPlan> {
        if (job != 0) return planForJob(*c, job, id, budget, options);
        auto plan = c->plan(id, budget, options);
        if (!plan.ok()) return plan.status();
        return JobPlan{std::move(*plan), id, -1};
      },
      [this, gen, sessionGen, job, id](absl::StatusOr<JobPlan> jp) {
        if (gen != m_planGeneration || sessionGen != m_generation) return;
        absl::StatusOr<PlanSummary> p =
            jp.ok() ? absl::StatusOr<PlanSummary>(jp->plan) : jp.status();
        const QString whose =
            !jp.ok() || job == 0
                ? QString()
                : tr("job %1, from rank %2 (session %3%4) · ")
                      .arg(job)
                      .arg(jp->fromRank)
                      .arg(jp->fromSession)
                      .arg(jp->fromSession == id ? tr(", this one") : tr(", its memory need"));
        m_planSegments->clear();
        if (!p.ok()) {
          // Nothing to apply: not the plan shown before this one either.
          m_plan.reset();
          m_apply->setEnabled(false);
          m_planSummary->setText(tr("no plan: %1").arg(q(std::string(p.status().message()))));
          m_timeline->setPredictedPeak(std::nullopt);
          m_planLoaded = true;
          emit planReady();
          return;
        }
        m_plan = *p;
        m_planSummary->setText(
            whose + tr("%1budget %2 · predicted peak %3 (store-all %4) · +%5 ms per step (+%6 %)")
                        .arg(p->feasible ? QString()
                                         : tr("DOES NOT FIT (least feasible %1) · ")
                                               .arg(bytes(p->minFeasibleBudgetBytes)))
                        .arg(bytes(p->budgetBytes), bytes(p->predictedPeakBytes),
                             bytes(p->storeAllPeakBytes))
                        .arg(p->predictedExtraNs / 1e6, 0, 'f', 1)
                        .arg(p->baseStepNs > 0 ? 100.0 * p->predictedExtraNs / p->baseStepNs : 0.0,
                             0, 'f', 1));
        for (const auto& [mode, mods] : p->segments)
          if (mode != "store") {
            auto* item = new QTreeWidgetItem(m_planSegments, {q(mode), q(mods)});
            item->setToolTip(1, q(mods));  // whole, where the column cuts it
          }
        m_timeline->setPredictedPeak(p->predictedPeakBytes);
        // The plan's memory over the step it was made from: that step is this timeline's only
        // when the plan comes from this session.
        m_timeline->setPredictedSeries(
            jp->fromSession == id ? p->predicted : std::vector<std::pair<int64_t, int64_t>>{});
        m_timeline->setBudget(p->budgetBytes);
        m_pareto->setChosen(p->budgetBytes);
        m_apply->setEnabled(m_current && (m_current->live || job != 0) && p->feasible);
        m_planLoaded = true;
        emit planReady();
      });
}

void MainWindow::applyPlan() {
  if (!m_current || !m_plan) return;
  const uint64_t id = m_current->id;
  const std::string json = m_plan->json;
  if (planForWholeJob()) {
    const uint64_t job = m_current->jobId;
    runAsync<absl::StatusOr<JobPlanSent>>(
        this, [c = m_client, job, json] { return applyToJob(*c, job, json); },
        [this, job](absl::StatusOr<JobPlanSent> sent) {
          bool all = sent.ok();
          QString text;
          if (!sent.ok()) {
            text = tr("apply: %1").arg(q(std::string(sent.status().message())));
          } else {
            QStringList failed;
            for (const JobPlanSent::Rank& r : sent->ranks)
              if (r.planId == 0) failed << tr("rank %1: %2").arg(r.rank).arg(q(r.error));
            all = failed.isEmpty();
            text = tr("plan sent to %1 running rank(s) of job %2, to apply from step %3")
                       .arg(sent->ranks.size() - static_cast<size_t>(failed.size()))
                       .arg(job)
                       .arg(sent->atStep);
            if (!failed.isEmpty())
              text += QStringLiteral(" · not sent: ") + failed.join(QStringLiteral("; "));
          }
          m_status->setText(text);
          if (!m_follow->isActive()) m_follow->start();  // the ranks' outcomes, as they come
          emit planSent(all);
        });
    return;
  }
  runAsync<absl::StatusOr<uint64_t>>(
      this, [c = m_client, id, json] { return c->apply(id, json); },
      [this](absl::StatusOr<uint64_t> planId) {
        m_status->setText(planId.ok()
                              ? tr("plan %1 sent; the job applies it at its next step").arg(*planId)
                              : tr("apply: %1").arg(q(std::string(planId.status().message()))));
        emit planSent(planId.ok());
      });
}

namespace {
// A plan's outcome as the panel says it.
QString outcomeText(const PlanOutcome& o) {
  QString text = MainWindow::tr("plan %1: %2").arg(o.planId).arg(q(o.state));
  if (o.state == "refused") text += QStringLiteral(" — ") + q(o.message);
  if (o.state == "applied" && o.stepsMeasured > 0) {
    const double err = o.predictedPeakBytes > 0
                           ? 100.0 * (o.measuredPeakBytes - o.predictedPeakBytes) /
                                 static_cast<double>(o.predictedPeakBytes)
                           : 0.0;
    text += MainWindow::tr(" from step %1 · measured peak %2, predicted %3 (%4%5 %) · %6")
                .arg(o.fromStep)
                .arg(bytes(o.measuredPeakBytes), bytes(o.predictedPeakBytes))
                .arg(err >= 0 ? QStringLiteral("+") : QString())
                .arg(err, 0, 'f', 1)
                .arg(o.measuredPeakBytes <= o.budgetBytes ? MainWindow::tr("within budget")
                                                          : MainWindow::tr("OVER BUDGET"));
  }
  if (o.state == "applied") {
    if (const std::string note = appliedPlanNote(o.message); !note.empty())
      text += MainWindow::tr(" · note: %1").arg(q(note));
  }
  return text;
}
}  // namespace

void MainWindow::checkPlans() {
  if (!m_current) return;
  const uint64_t id = m_current->id;
  const int gen = m_generation;
  if (planForWholeJob()) {
    const uint64_t job = m_current->jobId;
    runAsync<absl::StatusOr<std::vector<RankPlanOutcome>>>(
        this, [c = m_client, job] { return checkJobPlans(*c, job); },
        [this, gen](absl::StatusOr<std::vector<RankPlanOutcome>> ranks) {
          if (gen != m_generation || !ranks.ok() || ranks->empty() || !planForWholeJob()) return;
          QStringList lines;
          bool anySent = false;
          for (const RankPlanOutcome& r : *ranks) {
            lines << tr("rank %1: %2").arg(r.rank).arg(outcomeText(r.outcome));
            anySent = anySent || r.outcome.state == "sent";
          }
          m_planCheck->setText(lines.join(QLatin1Char('\n')));
          // Every rank's outcome is in: no need to ask again unless the open session is live.
          if (!anySent && !m_current->live) m_follow->stop();
          emit planChecked();
        });
    return;
  }
  runAsync<absl::StatusOr<std::vector<PlanOutcome>>>(
      this, [c = m_client, id] { return c->planCheck(id); },
      [this, gen](absl::StatusOr<std::vector<PlanOutcome>> plans) {
        if (gen != m_generation || !plans.ok() || plans->empty()) return;
        m_planCheck->setText(outcomeText(plans->back()));
        emit planChecked();
      });
}

void MainWindow::exportPng() {
  const QString path = QFileDialog::getSaveFileName(
      this, tr("Export view"), QStringLiteral("tidemark.png"), tr("PNG images (*.png)"));
  if (!path.isEmpty() && !grab().save(path, "PNG"))
    QMessageBox::warning(this, tr("Export"), tr("Could not write %1").arg(path));
}

}  // namespace tidemark::gui
