#pragma once

#include <QMetaObject>
#include <QObject>
#include <QPointer>
#include <QThreadPool>
#include <functional>
#include <memory>

namespace tidemark::gui {

// Runs work() on the global thread pool and done(result) back on ctx's thread, unless ctx is
// gone by then. The UI thread never waits for the network.
template <typename T>
void runAsync(QObject* ctx, std::function<T()> work, std::function<void(T)> done) {
  QPointer<QObject> guard(ctx);
  QThreadPool::globalInstance()->start([guard, work = std::move(work), done = std::move(done)] {
    auto result = std::make_shared<T>(work());
    if (!guard) return;
    QMetaObject::invokeMethod(
        guard.data(),
        [guard, done, result] {
          if (guard) done(std::move(*result));
        },
        Qt::QueuedConnection);
  });
}

}  // namespace tidemark::gui
