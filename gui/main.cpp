// tidemark-gui: the desktop GUI. Sessions, the memory timeline stacked by category with the peak
// marked, the inspector, and the plan panel (budget slider → the advisor's plan, Pareto curve,
// apply to a live job). Every query runs off the UI thread.
#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "gui/client/daemon_client.h"
#include "gui/widgets/main_window.h"
#include "server/store_file_server.h"
#include "src/advisor/planner.h"
#include "src/base/daemon_address.h"
#include "src/core/device_filter.h"

int main(int argc, char** argv) {
  // --help and --version need no display: answered before a window system is looked for.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help" || a == "--help-all" || a == "-v" || a == "--version") {
      setenv("QT_QPA_PLATFORM", "offscreen", 1);
      break;
    }
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("tidemark-gui"));
  QApplication::setApplicationVersion(QStringLiteral(TIDEMARK_VERSION));

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("tidemark's desktop GUI"));
  parser.addHelpOption();
  parser.addVersionOption();
  const QCommandLineOption server(QStringLiteral("server"),
                                  QStringLiteral("tidemarkd's address (default $TIDEMARK_SERVER, "
                                                 "else your own daemon's Unix socket)."),
                                  QStringLiteral("addr"));
  // Not --session: QGuiApplication keeps that for X11 session management.
  const QCommandLineOption session(QStringLiteral("open"),
                                   QStringLiteral("Open this session at start."),
                                   QStringLiteral("session"));
  const QCommandLineOption budget(QStringLiteral("budget"),
                                  QStringLiteral("The plan panel's budget, in percent (10-100)."),
                                  QStringLiteral("percent"));
  const QCommandLineOption nested(
      QStringLiteral("nested"),
      QStringLiteral("Plans may nest recomputed segments (as tidemark plan --nested)."));
  const QCommandLineOption offload(
      QStringLiteral("offload"),
      QStringLiteral("Plans may offload stages to host memory over a link of this speed, e.g. "
                     "12GB/s (as tidemark plan --offload)."),
      QStringLiteral("speed"));
  const QCommandLineOption screenshot(
      QStringLiteral("screenshot"),
      QStringLiteral("Render the window once the session (and its plan) has loaded, save it as a "
                     "PNG to <file>, and exit (2 when nothing loaded within 60 s)."),
      QStringLiteral("file"));
  const QCommandLineOption tab(QStringLiteral("tab"),
                               QStringLiteral("The side panel shown: inspector (default), steps "
                                              "(each step's peak, two steps overlaid), job "
                                              "(the session's training job, a row per rank) or "
                                              "icicle (memory at the peak by module)."),
                               QStringLiteral("name"));
  const QCommandLineOption device(
      QStringLiteral("device"),
      QStringLiteral("Whose memory to show: all (host and GPUs, default), cpu, cuda or cuda:N."),
      QStringLiteral("device"));
  const QCommandLineOption db(
      QStringLiteral("db"),
      QStringLiteral("Read the store file <file> directly, without a daemon (one tidemarkd wrote, "
                     "running or not); nothing is written to it."),
      QStringLiteral("file"));
  parser.addOptions({server, session, budget, nested, offload, screenshot, tab, device, db});
  parser.process(app);

  auto fail = [](const QString& message) {
    std::fprintf(stderr, "tidemark-gui: %s\n", qPrintable(message));
    return 2;
  };
  bool ok = true;
  const int budgetPercent = parser.isSet(budget) ? parser.value(budget).toInt(&ok) : 70;
  if (!ok || budgetPercent < 10 || budgetPercent > 100)
    return fail(QStringLiteral("--budget takes a whole percent from 10 to 100, not '%1'")
                    .arg(parser.value(budget)));
  std::optional<uint64_t> open;
  if (parser.isSet(session)) {
    open = parser.value(session).toULongLong(&ok);
    if (!ok)
      return fail(QStringLiteral("--open takes a session id, not '%1'").arg(parser.value(session)));
  }
  const QString tabName = parser.isSet(tab) ? parser.value(tab) : QStringLiteral("inspector");
  if (tabName != QStringLiteral("inspector") && tabName != QStringLiteral("steps") &&
      tabName != QStringLiteral("job") && tabName != QStringLiteral("icicle"))
    return fail(QStringLiteral("--tab is inspector, steps, job or icicle, not '%1'").arg(tabName));

  if (parser.isSet(offload)) {
    if (auto speed = tidemark::core::parseSpeed(parser.value(offload).toStdString()); !speed.ok())
      return fail(QStringLiteral("--offload: %1")
                      .arg(QString::fromStdString(std::string(speed.status().message()))));
  }
  const std::string deviceName = parser.value(device).toStdString();
  if (std::string why; !tidemark::core::DeviceFilter::parse(deviceName, &why))
    return fail(QStringLiteral("--device: %1").arg(QString::fromStdString(why)));

  const char* env = std::getenv("TIDEMARK_SERVER");
  const std::string address = parser.isSet(server) ? parser.value(server).toStdString()
                              : (env && *env)      ? std::string(env)
                                                   : tidemark::base::defaultDaemonAddress();
  std::shared_ptr<tidemark::gui::DaemonClient> client;
  std::unique_ptr<tidemark::server::StoreFileServer> file;
  if (parser.isSet(db)) {
    if (parser.isSet(server)) return fail(QStringLiteral("--db and --server: one or the other"));
    const std::string path = parser.value(db).toStdString();
    auto opened = tidemark::server::StoreFileServer::open(path);
    if (!opened.ok())
      return fail(QStringLiteral("--db %1").arg(
          QString::fromStdString(std::string(opened.status().message()))));
    file = std::move(*opened);
    client = std::make_shared<tidemark::gui::DaemonClient>("file:" + path, file->channel());
  } else {
    client = std::make_shared<tidemark::gui::DaemonClient>(address);
  }
  tidemark::gui::MainWindow window(client);
  window.setBudgetPercent(budgetPercent);
  tidemark::gui::PlanOptions planOptions;
  planOptions.nested = parser.isSet(nested);
  planOptions.offload = parser.value(offload).toStdString();
  window.setPlanOptions(planOptions);
  window.setDevice(deviceName == "all" ? std::string() : deviceName);
  const bool steps = tabName == QStringLiteral("steps");
  const bool jobTab = tabName == QStringLiteral("job");
  const bool icicleTab = tabName == QStringLiteral("icicle");
  if (steps) window.showStepsTab();
  if (jobTab) window.showJobTab();
  if (icicleTab) window.showIcicleTab();
  window.show();
  window.refreshSessions(open);

  if (parser.isSet(screenshot)) {
    const QString path = parser.value(screenshot);
    auto shoot = [&window, path] {
      QTimer::singleShot(300, &window, [&window, path] {
        QApplication::exit(window.grab().save(path, "PNG") ? 0 : 1);
      });
    };
    // With a session: once its timeline and plan are in (or the timeline, without a plan), and
    // on the Steps tab the comparison of two steps.
    auto check = [&window, open, shoot, steps, jobTab, icicleTab,
                  shot = std::make_shared<bool>(false)] {
      if (*shot || (open && !(window.timelineLoaded() && window.planLoaded()))) return;
      if (open && steps && !window.comparisonLoaded()) return;
      if (open && jobTab && !window.jobLoaded()) return;
      if (open && icicleTab && !window.icicleLoaded()) return;
      *shot = true;
      shoot();
    };
    QObject::connect(&window, &tidemark::gui::MainWindow::timelineReady, &window, check);
    QObject::connect(&window, &tidemark::gui::MainWindow::planReady, &window, check);
    QObject::connect(&window, &tidemark::gui::MainWindow::comparisonReady, &window, check);
    QObject::connect(&window, &tidemark::gui::MainWindow::jobReady, &window, check);
    QObject::connect(&window, &tidemark::gui::MainWindow::inspectorReady, &window, check);
    // Nothing to shoot: said on stderr, exit 2 at once (not after the 60 s wait).
    QObject::connect(&window, &tidemark::gui::MainWindow::failed, &window, [](const QString& why) {
      std::fprintf(stderr, "tidemark-gui: %s\n", qPrintable(why));
      QApplication::exit(2);
    });
    if (!open) QTimer::singleShot(1500, &window, shoot);
    QTimer::singleShot(60000, &window, [] {
      std::fprintf(stderr, "tidemark-gui: nothing loaded within 60 s\n");
      QApplication::exit(2);
    });
  }
  return app.exec();
}
