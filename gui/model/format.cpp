#include "gui/model/format.h"

#include <cmath>
#include <cstdio>

namespace tidemark::gui {

std::string humanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string appliedPlanNote(const std::string& message) {
  static const std::string kBut = "applied; but ";
  if (message.empty() || message == "applied") return {};
  return message.compare(0, kBut.size(), kBut) == 0 ? message.substr(kBut.size()) : message;
}

}  // namespace tidemark::gui
