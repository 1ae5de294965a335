// tidemark-gui: the desktop GUI. For now a window that says where the timeline will be
// (the GUI issue builds the timeline, inspector and plan panel).
#include <QApplication>
#include <QCommandLineParser>
#include <QLabel>
#include <QMainWindow>
#include <QScreen>
#include <QString>
#include <QTimer>

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("tidemark-gui"));
  QApplication::setApplicationVersion(QStringLiteral(TIDEMARK_VERSION));

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("tidemark's desktop GUI"));
  parser.addHelpOption();
  parser.addVersionOption();
  const QCommandLineOption screenshot(
      QStringLiteral("screenshot"),
      QStringLiteral("Render the window, save it as a PNG to <file>, and exit."),
      QStringLiteral("file"));
  parser.addOption(screenshot);
  parser.process(app);

  QMainWindow window;
  window.setWindowTitle(QStringLiteral("tidemark"));
  auto* label = new QLabel(QStringLiteral("tidemark %1: the memory timeline will appear here.")
                               .arg(QStringLiteral(TIDEMARK_VERSION)));
  label->setAlignment(Qt::AlignCenter);
  window.setCentralWidget(label);
  window.resize(960, 600);
  window.show();

  if (parser.isSet(screenshot)) {
    const QString path = parser.value(screenshot);
    QTimer::singleShot(200, &window, [&window, path] {
      const bool ok = window.grab().save(path, "PNG");
      QApplication::exit(ok ? 0 : 1);
    });
  }
  return app.exec();
}
