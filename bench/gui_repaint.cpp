// The GUI's timeline repaint on a large session: fetches the session's timeline the way the GUI
// does (one bucket per pixel of a 1920-pixel view), then repaints the real TimelineView into an
// image 50 times, full range and zoomed to a tenth. Prints one JSON line. Target: <= 16 ms.
// Usage: bench_gui_repaint --server ADDR --open SESSION   (QT_QPA_PLATFORM=offscreen is fine;
// not --session, which QGuiApplication keeps for X11 session management)
#include <QApplication>
#include <QImage>
#include <QPainter>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gui/client/daemon_client.h"
#include "gui/widgets/timeline_view.h"

using namespace tidemark::gui;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Figures {
  double fetchMs = 0, medianMs = 0, worstMs = 0;
  size_t buckets = 0;
};

Figures measure(DaemonClient& client, uint64_t session, TimelineView& view, int64_t from,
                int64_t to) {
  Figures f;
  const auto t0 = Clock::now();
  absl::StatusOr<TimelineData> t = client.timeline(session, from, to, view.width());
  f.fetchMs = ms(Clock::now() - t0);
  if (!t.ok()) {
    std::fprintf(stderr, "bench_gui_repaint: %s\n", std::string(t.status().message()).c_str());
    std::exit(1);
  }
  f.buckets = t->buckets.size();
  view.setLimits(t->fromNs, t->toNs);
  if (from != 0 || to != 0) view.range().set(from, to);
  view.setData(StackedTimeline::build(t->buckets));
  QImage image(view.size(), QImage::Format_ARGB32_Premultiplied);
  std::vector<double> times;
  for (int i = 0; i < 50; ++i) {
    const auto s = Clock::now();
    view.render(&image);
    times.push_back(ms(Clock::now() - s));
  }
  std::sort(times.begin(), times.end());
  f.medianMs = times[times.size() / 2];
  f.worstMs = times.back();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  std::string server = "127.0.0.1:7531";
  uint64_t session = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--server"))
      server = argv[++i];
    else if (!std::strcmp(argv[i], "--open"))
      session = std::stoull(argv[++i]);
  }
  DaemonClient client(server);
  TimelineView view;
  view.resize(1920, 600);
  auto full = measure(client, session, view, 0, 0);
  const int64_t from = view.range().from() + view.range().span() * 4 / 10;
  const int64_t to = from + view.range().span() / 10;
  auto zoom = measure(client, session, view, from, to);
  std::printf(
      "{\"buckets\": %zu, \"fetch_full_ms\": %.2f, \"repaint_full_ms_median\": %.2f, "
      "\"repaint_full_ms_max\": %.2f, \"fetch_zoom_ms\": %.2f, \"repaint_zoom_ms_median\": %.2f, "
      "\"repaint_zoom_ms_max\": %.2f}\n",
      full.buckets, full.fetchMs, full.medianMs, full.worstMs, zoom.fetchMs, zoom.medianMs,
      zoom.worstMs);
  return 0;
}
