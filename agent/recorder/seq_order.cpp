#include "agent/recorder/seq_order.h"

#include <algorithm>
#include <cstdint>

namespace tidemark::agent {

void orderBySeq(std::vector<Record>& records, std::vector<Record>& scratch) {
  if (records.size() < 2) return;
  uint64_t lo = records.front().seq;
  uint64_t hi = lo;
  for (const Record& r : records) {
    lo = std::min(lo, r.seq);
    hi = std::max(hi, r.seq);
  }
  const uint64_t span = hi - lo + 1;
  bool placed = span <= 2 * static_cast<uint64_t>(records.size()) + 1024;
  if (placed) {
    scratch.assign(span, Record{});  // kind 0: an empty place (no RecordKind is 0)
    for (const Record& r : records) {
      Record& place = scratch[r.seq - lo];
      if (place.kind != RecordKind{}) {
        placed = false;  // a seq twice: no place of its own
        break;
      }
      place = r;
    }
  }
  if (!placed) {
    std::stable_sort(records.begin(), records.end(),
                     [](const Record& a, const Record& b) { return a.seq < b.seq; });
    return;
  }
  size_t n = 0;
  for (const Record& r : scratch) {
    if (r.kind != RecordKind{}) records[n++] = r;
  }
}

}  // namespace tidemark::agent
