// tidemark-gui: the desktop GUI. For now a window that says where the timeline will be
// (issue 7 builds the timeline, inspector and plan panel).
#include <QApplication>
#include <QLabel>
#include <QMainWindow>
#include <QString>

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("tidemark"));
  QApplication::setApplicationVersion(QStringLiteral(TIDEMARK_VERSION));
  QMainWindow window;
  window.setWindowTitle(QStringLiteral("tidemark"));
  auto* label = new QLabel(QStringLiteral("tidemark %1: the memory timeline will appear here.")
                               .arg(QStringLiteral(TIDEMARK_VERSION)));
  label->setAlignment(Qt::AlignCenter);
  window.setCentralWidget(label);
  window.resize(960, 600);
  window.show();
  return app.exec();
}
