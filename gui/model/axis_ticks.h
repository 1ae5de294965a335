#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tidemark::gui {

// Round values for an axis: 1, 2 or 5 times a power of ten of a unit, so labels read
// "0 / 200 MiB / 400 MiB" rather than "20.91 / 41.82 MiB".
struct Tick {
  int64_t value = 0;
  std::string label;
};

// Byte ticks from 0 up to at most `top`, at most `maxTicks` of them (at least 2 when top > 0):
// steps of 1, 2 or 5 × 10^k of the binary unit (B, KiB, MiB, GiB, TiB) that top is written in.
std::vector<Tick> byteTicks(int64_t top, int maxTicks);
// The same inside [lo, top] (an axis that does not start at 0).
std::vector<Tick> byteTicks(int64_t lo, int64_t top, int maxTicks);

// Time ticks inside [fromNs, toNs] (offsets from the session's start), at most `maxTicks`:
// multiples of 1, 2 or 5 × 10^k ns, written in the unit that suits the step (µs, ms, s).
std::vector<Tick> timeTicks(int64_t fromNs, int64_t toNs, int maxTicks);

}  // namespace tidemark::gui
