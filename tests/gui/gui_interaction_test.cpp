// QTest interaction with the real window against a real tidemarkd holding a recorded session
// (tests/e2e/test_gui.py starts both and passes TIDEMARK_SERVER and TIDEMARK_GUI_SESSION): select
// the session, zoom, click the peak, move the budget slider, and Apply where the session is live.
#include <QApplication>
#include <QCheckBox>
#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMouseEvent>
#include <QPushButton>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QSlider>
#include <QTabWidget>
#include <QTest>
#include <QToolTip>
#include <QTreeWidget>
#include <cstdlib>
#include <memory>

#include "gui/client/daemon_client.h"
#include "gui/model/format.h"
#include "gui/widgets/icicle_view.h"
#include "gui/widgets/job_view.h"
#include "gui/widgets/main_window.h"
#include "gui/widgets/step_compare_view.h"
#include "gui/widgets/timeline_view.h"

using tidemark::gui::DaemonClient;
using tidemark::gui::IcicleCell;
using tidemark::gui::IcicleView;
using tidemark::gui::JobView;
using tidemark::gui::MainWindow;
using tidemark::gui::StepCompareView;
using tidemark::gui::TimelineView;

// Shows session in w and clicks the first tensor at the peak whose row starts with prefix (the
// largest: empty prefix) in the inspector, then waits for its allocation stack: *from is the
// "allocated from" row beneath it.
static void clickTensorForStack(MainWindow& w, const char* session, const QString& prefix,
                                QTreeWidgetItem** from) {
  w.show();
  QVERIFY(QTest::qWaitForWindowExposed(&w));
  QSignalSpy inspected(&w, &MainWindow::inspectorReady);
  w.refreshSessions(std::strtoull(session, nullptr, 10));
  QVERIFY(inspected.wait(30000));
  auto* inspector = w.findChild<QTreeWidget*>(QStringLiteral("inspector"));
  QVERIFY(inspector);
  QTreeWidgetItem* tensors = nullptr;
  for (int i = 0; i < inspector->topLevelItemCount(); ++i)
    if (inspector->topLevelItem(i)->text(0) == QStringLiteral("By tensor"))
      tensors = inspector->topLevelItem(i);
  QVERIFY2(tensors && tensors->childCount() > 0, "no tensors at the peak");
  QTreeWidgetItem* tensor = nullptr;
  for (int i = 0; i < tensors->childCount() && tensor == nullptr; ++i)
    if (tensors->child(i)->text(0).startsWith(prefix)) tensor = tensors->child(i);
  QVERIFY2(tensor, qPrintable(QStringLiteral("no tensor named ") + prefix));
  QSignalSpy stacked(&w, &MainWindow::stackReady);
  inspector->scrollToItem(tensor);
  QTest::mouseClick(inspector->viewport(), Qt::LeftButton, {},
                    inspector->visualItemRect(tensor).center());
  QVERIFY(stacked.wait(30000));
  QCOMPARE(tensor->childCount(), 1);
  *from = tensor->child(0);
  (*from)->setExpanded(true);
}

class GuiInteraction : public QObject {
  Q_OBJECT

 private slots:
  void selectZoomClickPlanApply() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_SESSION");
    QVERIFY2(server && session, "TIDEMARK_SERVER and TIDEMARK_GUI_SESSION must be set");
    const bool live = std::getenv("TIDEMARK_GUI_LIVE") != nullptr;
    MainWindow w(std::make_shared<DaemonClient>(server));
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    w.refreshSessions();

    // Select the session by clicking its row.
    auto* list = w.findChild<QListWidget*>(QStringLiteral("sessions"));
    QVERIFY(list);
    QTRY_VERIFY_WITH_TIMEOUT(list->count() > 0, 20000);
    int row = -1;
    for (int i = 0; i < list->count(); ++i)
      if (list->item(i)->text().startsWith(QString::fromLatin1(session) + QLatin1Char(' ')))
        row = i;
    QVERIFY2(row >= 0, "the session is not listed");
    QTest::mouseClick(list->viewport(), Qt::LeftButton, {},
                      list->visualItemRect(list->item(row)).center());
    QTRY_VERIFY_WITH_TIMEOUT(w.timelineLoaded(), 30000);
    // The module lane under the timeline (the recording has module scopes).
    QTRY_VERIFY_WITH_TIMEOUT(!w.timeline()->lanes().modules.empty(), 30000);
    {
      // Hovering the module lane names the module there (it showed the memory's figures).
      TimelineView* lanes = w.timeline();
      QString laneTip;
      for (int y = lanes->height() - 1; y > lanes->height() - 80 && laneTip.isEmpty(); --y)
        for (int x = lanes->width() / 4; x < lanes->width() * 3 / 4 && laneTip.isEmpty(); x += 7)
          laneTip = lanes->laneTipAt(QPointF(x, y));
      QVERIFY2(laneTip.startsWith(QStringLiteral("module TinyGPT")), qPrintable(laneTip));
      QVERIFY2(laneTip.contains(QStringLiteral(" ms long")), qPrintable(laneTip));
    }

    // Zoom in with the keyboard: the range narrows and the timeline reloads.
    TimelineView* t = w.timeline();
    const qint64 fullSpan = t->range().span();
    QSignalSpy reloaded(&w, &MainWindow::timelineReady);
    t->setFocus();
    QTest::keyClick(t, Qt::Key_Plus);
    QVERIFY2(t->range().span() < fullSpan,
             qPrintable(QStringLiteral("span %1 of %2").arg(t->range().span()).arg(fullSpan)));
    QVERIFY(reloaded.wait(30000));
    QTest::keyClick(t, Qt::Key_Home);
    QCOMPARE(t->range().span(), fullSpan);

    // Click on the timeline at the peak: the inspector shows that moment.
    auto* inspector = w.findChild<QTreeWidget*>(QStringLiteral("inspector"));
    QVERIFY(inspector);
    QTRY_VERIFY_WITH_TIMEOUT(inspector->topLevelItemCount() > 0, 30000);  // the peak first
    QCOMPARE(inspector->topLevelItem(0)->text(0), QStringLiteral("At the peak"));
    const QString peakOfAll = inspector->topLevelItem(0)->text(1);
    // Names are cut in their middle (a module path's end tells the block apart) and whole in a
    // tooltip; the side panel keeps about a third of the window, also when it grows.
    QCOMPARE(inspector->textElideMode(), Qt::ElideMiddle);
    for (int i = 0; i < inspector->topLevelItemCount(); ++i) {
      QTreeWidgetItem* group = inspector->topLevelItem(i);
      if (group->text(0) != QStringLiteral("By module") &&
          group->text(0) != QStringLiteral("By tensor"))
        continue;
      for (int k = 0; k < group->childCount(); ++k)
        QCOMPARE(group->child(k)->toolTip(0).section(QLatin1Char('\n'), 0, 0),
                 group->child(k)->text(0));
    }
    // The filter box keeps the modules and tensors whose name holds its text.
    auto* filter = w.findChild<QLineEdit*>(QStringLiteral("filter"));
    QVERIFY(filter);
    QTest::keyClicks(filter, QStringLiteral("MLP"));
    int shown = 0, hidden = 0;
    for (int i = 0; i < inspector->topLevelItemCount(); ++i) {
      QTreeWidgetItem* group = inspector->topLevelItem(i);
      if (group->text(0) != QStringLiteral("By module") &&
          group->text(0) != QStringLiteral("By tensor"))
        continue;
      for (int k = 0; k < group->childCount(); ++k) {
        QTreeWidgetItem* row = group->child(k);
        if (row->isHidden()) {
          ++hidden;
          QVERIFY(!row->text(0).contains(QStringLiteral("mlp"), Qt::CaseInsensitive));
        } else {
          ++shown;
          QVERIFY2(row->text(0).contains(QStringLiteral("mlp")), qPrintable(row->text(0)));
        }
      }
    }
    QVERIFY(shown > 0 && hidden > 0);
    filter->clear();
    for (int i = 0; i < inspector->topLevelItemCount(); ++i)
      for (int k = 0; k < inspector->topLevelItem(i)->childCount(); ++k)
        QVERIFY(!inspector->topLevelItem(i)->child(k)->isHidden());
    const int narrow = inspector->width();
    QVERIFY2(narrow >= w.width() / 4, qPrintable(QString::number(narrow)));
    w.resize(w.width() + 400, w.height());
    QTRY_VERIFY(inspector->width() > narrow + 50);
    QSignalSpy inspected(&w, &MainWindow::inspectorReady);
    // The peak's dot opens the peak itself (a click there showed a nearby moment, below it).
    QTest::mouseClick(t, Qt::LeftButton, {}, t->peakPoint().toPoint());
    QVERIFY(inspected.wait(30000));
    QCOMPARE(inspector->topLevelItem(0)->text(0), QStringLiteral("At the peak"));
    if (!live) QCOMPARE(inspector->topLevelItem(0)->text(1), peakOfAll);
    QVERIFY(t->mark().has_value());
    // Elsewhere: that moment, marked on the timeline.
    const QPoint beside = t->peakPoint().toPoint() + QPoint(t->peakPoint().x() > 200 ? -60 : 60, 0);
    QTest::mouseClick(t, Qt::LeftButton, {}, beside);
    QVERIFY(inspected.wait(30000));
    QCOMPARE(inspector->topLevelItem(0)->text(0), QStringLiteral("At the moment clicked"));
    QVERIFY(inspector->topLevelItemCount() >= 2);  // and its categories
    QVERIFY(t->mark().has_value());

    // The legend above the plot names the categories drawn (a recorded training has these).
    QStringList legend;
    for (const TimelineView::LegendEntry& e : t->legend()) legend << e.name;
    for (const char* c : {"WEIGHT", "GRADIENT", "OPTIMIZER_STATE", "ACTIVATION"})
      QVERIFY2(legend.contains(QString::fromLatin1(c)), qPrintable(legend.join(QLatin1Char(' '))));

    // Hover over the peak: the tooltip gives the moment (time from the start, step), the module
    // running and that bucket's figures. (A live session's timeline reloads every second; the
    // pointer moves until a move lands between two reloads.)
    const QString tip = t->tipAt(t->peakPoint().x());
    QVERIFY2(tip.startsWith(QStringLiteral("+")), qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral(" ms, step ")), qPrintable(tip));
    // The module running there, where the module lane has one (its outermost modules may leave
    // gaps, e.g. between blocks).
    const qint64 at = t->timeAt(t->peakPoint().x());
    bool covered = false;
    for (const auto& span : t->lanes().modules) covered |= span.beginNs <= at && at < span.endNs;
    if (covered) QVERIFY2(tip.contains(QStringLiteral("\nin TinyGPT")), qPrintable(tip));
    // The phase running there (a training's peak is in its forward, backward or recompute).
    QVERIFY(!t->lanes().phases.empty());
    QString phase;
    for (const auto& span : t->lanes().phases)
      if (span.beginNs <= at && at < span.endNs) phase = QString::fromStdString(span.name);
    QVERIFY2(!phase.isEmpty(), "no phase at the peak");
    QVERIFY2(tip.section(QLatin1Char('\n'), 0, 0).endsWith(QStringLiteral(", ") + phase),
             qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral("\ntotal ")), qPrintable(tip));
    QVERIFY2(tip.contains(QStringLiteral("WEIGHT: ")), qPrintable(tip));
    int jiggle = 0;
    QTRY_VERIFY_WITH_TIMEOUT(
        (QTest::mouseMove(t, t->peakPoint().toPoint() + QPoint(0, (jiggle++ % 2) * 2)),
         QToolTip::isVisible() && QToolTip::text().contains(QStringLiteral("\ntotal "))),
        15000);

    // Drag to pan: zoomed in, dragging right by a fifth of the width moves the range earlier by
    // a fifth of its span, keeps the span, and is not taken for a click (no inspector query).
    QTest::keyClick(t, Qt::Key_Plus);
    QTest::keyClick(t, Qt::Key_Right);
    QTest::keyClick(t, Qt::Key_Right);
    const qint64 zoomedSpan = t->range().span(), zoomedFrom = t->range().from();
    const QPoint start(t->width() / 2, t->height() / 3);
    const QPoint end = start + QPoint(t->width() / 5, 0);
    QSignalSpy clicked(t, &TimelineView::momentClicked);
    QTest::mousePress(t, Qt::LeftButton, {}, start);
    for (int step = 1; step <= 4; ++step) {  // a drag is moves with the button held
      const QPointF at = start + (end - start) * step / 4;
      QMouseEvent move(QEvent::MouseMove, at, t->mapToGlobal(at), Qt::NoButton, Qt::LeftButton,
                       Qt::NoModifier);
      QApplication::sendEvent(t, &move);
    }
    QTest::mouseRelease(t, Qt::LeftButton, {}, end);
    QCOMPARE(t->range().span(), zoomedSpan);
    QVERIFY2(t->range().from() < zoomedFrom,
             qPrintable(QStringLiteral("from %1, was %2").arg(t->range().from()).arg(zoomedFrom)));
    const double moved =
        static_cast<double>(zoomedFrom - t->range().from()) / static_cast<double>(zoomedSpan);
    QVERIFY2(moved > 0.15 && moved < 0.3, qPrintable(QString::number(moved)));
    QCOMPARE(clicked.count(), 0);
    QTest::keyClick(t, Qt::Key_Home);

    // Move the budget slider: a new plan comes.
    auto* slider = w.findChild<QSlider*>(QStringLiteral("budget"));
    QVERIFY(slider);
    QTRY_VERIFY_WITH_TIMEOUT(w.planLoaded(), 60000);
    QSignalSpy planned(&w, &MainWindow::planReady);
    slider->setFocus();
    QTest::keyClick(slider, Qt::Key_PageDown);
    QVERIFY(planned.wait(60000));

    // Steps: the table lists each step's peak; clicking step 2 zooms to it and inspects it.
    auto* steps = w.findChild<QTreeWidget*>(QStringLiteral("steps"));
    auto* side = w.findChild<QTabWidget*>(QStringLiteral("side"));
    QVERIFY(steps && side);
    QTRY_VERIFY_WITH_TIMEOUT(steps->topLevelItemCount() >= 2, 30000);
    side->setCurrentIndex(1);  // the Steps tab
    QVERIFY(steps->isVisible());
    QTest::mouseClick(steps->viewport(), Qt::LeftButton, {},
                      steps->visualItemRect(steps->topLevelItem(1)).center());
    QCOMPARE(inspector->topLevelItem(0)->text(0), QStringLiteral("At the peak of step 2"));
    QVERIFY(t->range().zoomed());

    // Step against step: the first and last finished steps are overlaid once the steps load;
    // Ctrl+click a second row to overlay the two selected instead.
    auto* compare = w.findChild<StepCompareView*>(QStringLiteral("stepCompare"));
    auto* compareTable = w.findChild<QTreeWidget*>(QStringLiteral("stepCompareTable"));
    QVERIFY(compare && compareTable);
    if (!live) {  // a live session's last step may still run
      QTRY_VERIFY_WITH_TIMEOUT(compare->comparison().has_value(), 30000);
      QCOMPARE(compare->comparison()->a.step, steps->topLevelItem(0)->text(0).toLongLong());
      QCOMPARE(compare->comparison()->b.step,
               steps->topLevelItem(steps->topLevelItemCount() - 1)->text(0).toLongLong());
      QSignalSpy compared(&w, &MainWindow::comparisonReady);
      QTest::mouseClick(steps->viewport(), Qt::LeftButton, Qt::ControlModifier,
                        steps->visualItemRect(steps->topLevelItem(0)).center());
      QVERIFY(compared.wait(30000));
      const auto& c = *compare->comparison();
      QCOMPARE(c.a.step, steps->topLevelItem(0)->text(0).toLongLong());
      QCOMPARE(c.b.step, steps->topLevelItem(1)->text(0).toLongLong());
      QVERIFY(!c.a.bytes.empty() && !c.b.bytes.empty());
      // The legend's peaks are the table's, for both steps (a coarse curve's highest bucket
      // could differ: 4.89 against 4.84 GiB once).
      QCOMPARE(QString::fromStdString(tidemark::gui::humanBytes(c.totalA())),
               steps->topLevelItem(0)->text(2));
      QCOMPARE(QString::fromStdString(tidemark::gui::humanBytes(c.totalB())),
               steps->topLevelItem(1)->text(2));
      QVERIFY(compareTable->topLevelItemCount() >= 2);  // the total and its categories
      QCOMPARE(compareTable->topLevelItem(0)->text(0), QStringLiteral("total"));
    }

    // Apply: enabled for a live session only; clicking it sends the plan.
    auto* apply = w.findChild<QPushButton*>(QStringLiteral("apply"));
    QVERIFY(apply);
    QCOMPARE(apply->isEnabled(), live);
    if (live) {
      QSignalSpy sent(&w, &MainWindow::planSent);
      QTest::mouseClick(apply, Qt::LeftButton);
      QVERIFY(sent.wait(30000));
      QVERIFY(sent.takeFirst().at(0).toBool());
      // The job applies it at a step boundary; the panel then shows predicted against measured.
      auto* check = w.findChild<QLabel*>(QStringLiteral("planCheck"));
      QVERIFY(check);
      QTRY_VERIFY_WITH_TIMEOUT(check->text().contains(QStringLiteral("measured peak")), 120000);
      QVERIFY2(check->text().contains(QStringLiteral("applied")), qPrintable(check->text()));
      // The job runs to its end: the window follows the session's state (it stayed "● live"
      // with Apply enabled).
      QTRY_VERIFY_WITH_TIMEOUT(!list->item(row)->text().contains(QStringLiteral("live")), 300000);
      QVERIFY(!apply->isEnabled());
    }

    // Whose memory (the status bar's box): this CPU job has no GPU memory (the inspector says
    // so), and its host memory is all of it. (A live session's peak moves meanwhile: checked on
    // a finished one.)
    if (!live) {
      auto* device = w.findChild<QComboBox*>(QStringLiteral("device"));
      QVERIFY(device);
      auto peakFor = [&](const QString& which) {
        QSignalSpy shown(&w, &MainWindow::inspectorReady);
        device->setCurrentIndex(device->findData(which));
        if (!shown.wait(30000)) return QStringLiteral("(no answer)");
        return inspector->topLevelItem(0)->text(0) + QLatin1Char(' ') +
               inspector->topLevelItem(0)->text(1);
      };
      const QString noGpu = peakFor(QStringLiteral("cuda"));
      QVERIFY2(noGpu.contains(QStringLiteral("recorded no cuda memory (it has cpu)")),
               qPrintable(noGpu));
      QCOMPARE(peakFor(QStringLiteral("cpu")), QStringLiteral("At the peak ") + peakOfAll);
    }
  }

  // An imported snapshot (TIDEMARK_GUI_STACK_SESSION): clicking a tensor at the peak in the
  // inspector shows its block's allocation stack beneath it, the Python frames innermost first.
  void tensorStackInTheInspector() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_STACK_SESSION");
    if (!server || !session) QSKIP("no TIDEMARK_GUI_STACK_SESSION (an imported snapshot)");
    MainWindow w(std::make_shared<DaemonClient>(server));
    // The gradient made in the backward: its stack ends in the training script.
    QTreeWidgetItem* from = nullptr;
    clickTensorForStack(w, session, QStringLiteral("[frames:backward]"), &from);
    if (QTest::currentTestFailed()) return;
    if (const char* shot = std::getenv("TIDEMARK_GUI_SHOT"))  // for docs/gui.md
      QVERIFY(w.grab().save(QString::fromLocal8Bit(shot), "PNG"));
    QVERIFY2(from->text(0).startsWith(QStringLiteral("allocated from (block 0x6000)")),
             qPrintable(from->text(0)));
    QVERIFY(from->childCount() >= 2);
    QCOMPARE(from->child(0)->text(0), QStringLiteral("backward (_tensor.py:1)"));
    QCOMPARE(from->child(1)->text(0), QStringLiteral("train (train.py:1)"));
  }

  // A training recorded with `tidemark run --stacks` (TIDEMARK_GUI_OWN_STACK_SESSION): clicking
  // the largest tensor at the peak shows the Python frames that allocated it, innermost first,
  // down to the training script (TIDEMARK_GUI_OWN_STACK_SCRIPT, its file name).
  void ownStackInTheInspector() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_OWN_STACK_SESSION");
    const char* script = std::getenv("TIDEMARK_GUI_OWN_STACK_SCRIPT");
    if (!server || !session || !script)
      QSKIP("no TIDEMARK_GUI_OWN_STACK_SESSION (a training recorded with --stacks)");
    MainWindow w(std::make_shared<DaemonClient>(server));
    w.resize(1300, 800);
    QTreeWidgetItem* from = nullptr;
    clickTensorForStack(w, session, QString(), &from);
    if (QTest::currentTestFailed()) return;
    if (const char* shot = std::getenv("TIDEMARK_GUI_SHOT"))  // for docs/gui.md
      QVERIFY(w.grab().save(QString::fromLocal8Bit(shot), "PNG"));
    QVERIFY2(from->text(0).startsWith(QStringLiteral("allocated from (block 0x")),
             qPrintable(from->text(0)));
    QVERIFY(from->childCount() >= 2);
    // Innermost first: a torch or model frame, the script's own frames last.
    QStringList frames;
    for (int i = 0; i < from->childCount(); ++i) frames << from->child(i)->text(0);
    const QString name = QString::fromLocal8Bit(script);
    QVERIFY2(frames.last().contains(name + QLatin1Char(':')), qPrintable(frames.join(' ')));
    for (const QString& f : frames)
      QVERIFY2(f.endsWith(QLatin1Char(')')) && f.contains(QStringLiteral(".py:")), qPrintable(f));
  }

  // A recorded training (TIDEMARK_GUI_ICICLE_SESSION): the Icicle tab shows memory at the peak by
  // module hierarchy — every module the inspector lists is a cell holding those bytes itself, a
  // module spans the modules inside it, hovering a cell names it in full — and a moment clicked
  // on the timeline shows that moment's modules.
  void icicleOfTheInspectorsMoment() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_ICICLE_SESSION");
    if (!server || !session) QSKIP("no TIDEMARK_GUI_ICICLE_SESSION (a recorded training)");
    MainWindow w(std::make_shared<DaemonClient>(server));
    w.resize(1300, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    w.refreshSessions(std::strtoull(session, nullptr, 10));
    QTRY_VERIFY_WITH_TIMEOUT(w.icicleLoaded() && w.timelineLoaded(), 30000);
    w.showIcicleTab();
    IcicleView* icicle = w.icicle();
    QVERIFY(!icicle->cells().empty());
    auto cell = [&](const QString& path) -> const IcicleCell* {
      for (const IcicleCell& c : icicle->cells())
        if (QString::fromStdString(c.path) == path) return &c;
      return nullptr;
    };
    auto* inspector = w.findChild<QTreeWidget*>(QStringLiteral("inspector"));
    QTreeWidgetItem* modules = nullptr;
    for (int i = 0; i < inspector->topLevelItemCount(); ++i)
      if (inspector->topLevelItem(i)->text(0) == QStringLiteral("By module"))
        modules = inspector->topLevelItem(i);
    QVERIFY2(modules && modules->childCount() > 0, "no modules at the peak");
    for (int i = 0; i < modules->childCount(); ++i) {
      const QString name = modules->child(i)->text(0).section(QStringLiteral(" · "), 0, 0);
      const IcicleCell* c = cell(name);
      QVERIFY2(c, qPrintable(name));
      QCOMPARE(QString::fromStdString(tidemark::gui::humanBytes(c->ownBytes)),
               modules->child(i)->text(1));
    }
    // Inside its parent's span; the top row within the moment's total.
    double top = 0;
    const IcicleCell* deepest = nullptr;
    for (const IcicleCell& c : icicle->cells()) {
      const QString path = QString::fromStdString(c.path);
      if (c.depth == 0) {
        top += c.x1 - c.x0;
      } else {
        const IcicleCell* parent = cell(path.left(path.lastIndexOf(QLatin1Char('.'))));
        QVERIFY2(parent && parent->depth == c.depth - 1, qPrintable(path));
        QVERIFY2(parent->x0 <= c.x0 + 1e-9 && c.x1 <= parent->x1 + 1e-9, qPrintable(path));
      }
      if (icicle->cellRect(c).width() > 40 && (!deepest || c.depth > deepest->depth)) deepest = &c;
    }
    QVERIFY(top <= 1.0 + 1e-9);
    QVERIFY(deepest);
    const QString path = QString::fromStdString(deepest->path);
    const QPoint at = icicle->cellRect(*deepest).center();
    QCOMPARE(icicle->cellAt(at), deepest);
    int jiggle = 0;
    QTRY_VERIFY_WITH_TIMEOUT((QTest::mouseMove(icicle, at + QPoint((jiggle++ % 2) * 2, 0)),
                              QToolTip::isVisible() && QToolTip::text().startsWith(path)),
                             15000);
    if (const char* shot = std::getenv("TIDEMARK_GUI_SHOT"))  // for docs/gui.md
      QVERIFY(w.grab().save(QString::fromLocal8Bit(shot), "PNG"));
    // A moment before the peak: the icicle follows the inspector there.
    const std::vector<IcicleCell> atPeak = icicle->cells();
    auto* t = w.findChild<TimelineView*>();
    QVERIFY(t);
    QSignalSpy inspected(&w, &MainWindow::inspectorReady);
    const QPoint before(std::max(2, t->peakPoint().toPoint().x() - t->width() / 6),
                        t->height() / 2);
    QTest::mouseClick(t, Qt::LeftButton, {}, before);
    QVERIFY(inspected.wait(30000));
    bool changed = icicle->cells().size() != atPeak.size();
    for (size_t i = 0; !changed && i < atPeak.size(); ++i)
      changed = icicle->cells()[i].bytes != atPeak[i].bytes;
    QVERIFY2(changed, "the icicle still shows the peak");
  }

  // A recorded job (TIDEMARK_GUI_JOB_SESSION, a rank's session; TIDEMARK_GUI_JOB_NEED, the
  // session of the rank with the highest peak): the Job tab shows a row per rank with the memory
  // need marked, and a click on another rank's row opens that rank's session.
  void clickARankOfTheJob() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_JOB_SESSION");
    const char* need = std::getenv("TIDEMARK_GUI_JOB_NEED");
    if (!server || !session || !need) QSKIP("no TIDEMARK_GUI_JOB_SESSION (a recorded job)");
    MainWindow w(std::make_shared<DaemonClient>(server));
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    w.showJobTab();
    w.refreshSessions(std::strtoull(session, nullptr, 10));
    QTRY_VERIFY_WITH_TIMEOUT(w.jobLoaded(), 60000);
    auto* view = w.findChild<JobView*>(QStringLiteral("jobView"));
    QVERIFY(view && view->job());
    QVERIFY2(view->job()->ranks.size() >= 2, "a job of one rank");
    QCOMPARE(view->job()->memorySession, static_cast<uint64_t>(std::strtoull(need, nullptr, 10)));
    // The memory need's row is the one to open (it is not the rank open now).
    QVERIFY(std::string(session) != std::string(need));
    const QRect row = view->rowRect(view->job()->memorySession);
    QVERIFY(!row.isEmpty());
    QSignalSpy opened(&w, &MainWindow::jobReady);
    QTest::mouseClick(view, Qt::LeftButton, {}, row.center());
    QVERIFY(opened.wait(60000));
    auto* list = w.findChild<QListWidget*>(QStringLiteral("sessions"));
    QVERIFY(list && list->currentItem());
    QVERIFY2(list->currentItem()->text().startsWith(QString::fromLatin1(need) + QLatin1Char(' ')),
             qPrintable(list->currentItem()->text()));
  }

  // A rank of a running training job (TIDEMARK_GUI_JOB_SESSION, not the memory need's,
  // TIDEMARK_GUI_JOB_NEED): the plan panel plans for the whole job from the memory need's rank,
  // and Apply sends the plan to every running rank, which all switch at one step; the panel then
  // shows each rank's measured peak beside the prediction.
  // The plan space from the panel: Nested checkpointing gives the plan `tidemark plan --nested`
  // gives at a budget where no one-level plan fits; an offload speed on a host-only session gets
  // the advisor's reason and nothing to apply; emptied, the nested plan again.
  void nestedAndOffloadedPlans() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_NESTED_SESSION");
    const char* percent = std::getenv("TIDEMARK_GUI_BUDGET");
    const char* nestedPeak = std::getenv("TIDEMARK_GUI_NESTED_PEAK");
    if (!server || !session || !percent || !nestedPeak)
      QSKIP("no TIDEMARK_GUI_NESTED_SESSION (a session where nesting matters)");
    MainWindow w(std::make_shared<DaemonClient>(server));
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    w.setBudgetPercent(std::atoi(percent));
    w.refreshSessions(std::strtoull(session, nullptr, 10));
    QTRY_VERIFY_WITH_TIMEOUT(w.planLoaded() && w.currentPlan().has_value(), 60000);
    auto* summary = w.findChild<QLabel*>(QStringLiteral("planSummary"));
    auto* apply = w.findChild<QPushButton*>(QStringLiteral("apply"));
    auto* nested = w.findChild<QCheckBox*>(QStringLiteral("nested"));
    auto* offload = w.findChild<QLineEdit*>(QStringLiteral("offload"));
    auto* segments = w.findChild<QTreeWidget*>(QStringLiteral("planSegments"));
    QVERIFY(summary && apply && nested && offload && segments);
    // One level: no plan fits this budget.
    QVERIFY2(!w.currentPlan()->feasible, qPrintable(summary->text()));
    QVERIFY2(summary->text().contains(QStringLiteral("DOES NOT FIT")), qPrintable(summary->text()));

    QSignalSpy planned(&w, &MainWindow::planReady);
    // On its box (the widget spans the panel; its label does not).
    QTest::mouseClick(nested, Qt::LeftButton, {},
                      QPoint(nested->height() / 2, nested->height() / 2));
    QVERIFY(nested->isChecked());
    QVERIFY(planned.wait(60000));
    QVERIFY(w.currentPlan().has_value());
    QVERIFY2(w.currentPlan()->feasible, qPrintable(summary->text()));
    QCOMPARE(w.currentPlan()->predictedPeakBytes, std::strtoll(nestedPeak, nullptr, 10));
    bool saysNested = false;
    for (int i = 0; i < segments->topLevelItemCount(); ++i)
      saysNested |= segments->topLevelItem(i)->text(1).contains(QStringLiteral("(nested"));
    QVERIFY(saysNested);

    // Offloading a recording of host memory only: the reason, and no plan to apply.
    planned.clear();
    offload->setFocus();
    QTest::keyClicks(offload, QStringLiteral("12GB/s"));
    QTest::keyClick(offload, Qt::Key_Return);
    QVERIFY(planned.wait(60000));
    QVERIFY2(summary->text().startsWith(QStringLiteral("no plan: ")), qPrintable(summary->text()));
    QVERIFY2(summary->text().contains(QStringLiteral("host memory only")),
             qPrintable(summary->text()));
    QVERIFY(!w.currentPlan().has_value());
    QVERIFY(!apply->isEnabled());

    // Emptied: the nested plan again.
    planned.clear();
    offload->selectAll();
    QTest::keyClick(offload, Qt::Key_Delete);
    QTest::keyClick(offload, Qt::Key_Return);
    QVERIFY(planned.wait(60000));
    QVERIFY(w.currentPlan().has_value());
    QCOMPARE(w.currentPlan()->predictedPeakBytes, std::strtoll(nestedPeak, nullptr, 10));
  }

  void planAndApplyToAJob() {
    const char* server = std::getenv("TIDEMARK_SERVER");
    const char* session = std::getenv("TIDEMARK_GUI_JOB_SESSION");
    const char* need = std::getenv("TIDEMARK_GUI_JOB_NEED");
    if (!server || !session || !need) QSKIP("no TIDEMARK_GUI_JOB_SESSION (a running job)");
    MainWindow w(std::make_shared<DaemonClient>(server));
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    w.setBudgetPercent(50);
    w.refreshSessions(std::strtoull(session, nullptr, 10));
    QTRY_VERIFY_WITH_TIMEOUT(w.planLoaded(), 60000);
    auto* wholeJob = w.findChild<QCheckBox*>(QStringLiteral("wholeJob"));
    QVERIFY(wholeJob && wholeJob->isVisible() && wholeJob->isChecked());
    auto* summary = w.findChild<QLabel*>(QStringLiteral("planSummary"));
    QVERIFY(summary);
    QTRY_VERIFY_WITH_TIMEOUT(summary->text().contains(QStringLiteral("predicted peak")), 60000);
    QVERIFY2(summary->text().contains(
                 QStringLiteral("(session %1, its memory need)").arg(QString::fromLatin1(need))),
             qPrintable(summary->text()));
    auto* apply = w.findChild<QPushButton*>(QStringLiteral("apply"));
    QVERIFY(apply && apply->isEnabled());
    QSignalSpy sent(&w, &MainWindow::planSent);
    QTest::mouseClick(apply, Qt::LeftButton);
    QVERIFY(sent.wait(60000));
    QVERIFY(sent.takeFirst().at(0).toBool());
    // Each rank's line: applied from the same step, measured beside predicted.
    auto* check = w.findChild<QLabel*>(QStringLiteral("planCheck"));
    QVERIFY(check);
    QTRY_VERIFY_WITH_TIMEOUT(check->text().count(QStringLiteral("measured peak")) == 2, 300000);
    const QStringList lines = check->text().split(QLatin1Char('\n'));
    QCOMPARE(lines.size(), 2);
    const QRegularExpression from(QStringLiteral("applied from step (\\d+)"));
    const auto a = from.match(lines[0]), b = from.match(lines[1]);
    QVERIFY2(a.hasMatch() && b.hasMatch(), qPrintable(check->text()));
    QCOMPARE(a.captured(1), b.captured(1));
    QVERIFY2(lines[0].startsWith(QStringLiteral("rank 0: ")) &&
                 lines[1].startsWith(QStringLiteral("rank 1: ")),
             qPrintable(check->text()));
  }
};

QTEST_MAIN(GuiInteraction)
#include "gui_interaction_test.moc"
