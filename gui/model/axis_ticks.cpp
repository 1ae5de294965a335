#include "gui/model/axis_ticks.h"

#include <algorithm>
#include <cstdio>

namespace tidemark::gui {

namespace {

// The smallest 1, 2 or 5 × 10^k (k >= 0) with at most `maxTicks` multiples in [lo, hi].
int64_t roundStep(int64_t lo, int64_t hi, int maxTicks) {
  auto count = [&](int64_t step) {
    const int64_t first = lo >= 0 ? (lo + step - 1) / step : lo / step;
    return hi / step - first + 1;
  };
  for (int64_t decade = 1;; decade *= 10) {
    for (int64_t m : {1, 2, 5})
      if (count(m * decade) <= maxTicks) return m * decade;
    if (decade > INT64_MAX / 100) return decade * 10;
  }
}

// "12.5" without trailing zeros (at most 3 decimals).
std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

std::vector<Tick> byteTicks(int64_t top, int maxTicks) { return byteTicks(0, top, maxTicks); }

std::vector<Tick> byteTicks(int64_t lo, int64_t top, int maxTicks) {
  lo = std::max<int64_t>(lo, 0);
  if (top <= 0 || maxTicks < 2 || lo > top) return {{0, "0 B"}};
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  int64_t unit = 1;
  while (u < 4 && top / unit >= 1024) {
    unit *= 1024;
    ++u;
  }
  // Steps in the unit, or (a top below 2 of the unit) in the unit below.
  if (top / unit < 2 && u > 0) {
    unit /= 1024;
    --u;
  }
  // A span under 2 of the unit (a narrow axis far from 0): in the unit below.
  if ((top - lo) / unit < 2 && u > 0) {
    unit /= 1024;
    --u;
  }
  const int64_t step = roundStep((lo + unit - 1) / unit, top / unit, maxTicks) * unit;
  std::vector<Tick> out;
  for (int64_t v = (lo + step - 1) / step * step; v <= top; v += step)
    out.push_back(
        {v, v == 0 ? std::string("0 B")
                   : number(static_cast<double>(v) / static_cast<double>(unit)) + " " + units[u]});
  return out;
}

std::vector<Tick> timeTicks(int64_t fromNs, int64_t toNs, int maxTicks) {
  std::vector<Tick> out;
  if (toNs <= fromNs || maxTicks < 2) return out;
  const int64_t step = roundStep(fromNs, toNs, maxTicks);
  // Written in the unit of the range's end.
  const int64_t end = std::max(toNs, -fromNs);
  const char* unit = end >= 1'000'000'000 ? "s"
                     : end >= 1'000'000   ? "ms"
                     : end >= 1000        ? "µs"
                                          : "ns";
  const double div = end >= 1'000'000'000 ? 1e9 : end >= 1'000'000 ? 1e6 : end >= 1000 ? 1e3 : 1;
  const int64_t first = fromNs >= 0 ? (fromNs + step - 1) / step * step : fromNs / step * step;
  for (int64_t v = first; v <= toNs; v += step)
    out.push_back({v, number(static_cast<double>(v) / div) + " " + unit});
  return out;
}

}  // namespace tidemark::gui
