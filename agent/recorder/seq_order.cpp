#include "agent/recorder/seq_order.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tidemark::agent {

void orderBySeq(std::vector<Record>& records, std::vector<Record>& scratch) {
  if (records.size() < 2) return;
  uint64_t lo = records.front().seq;
  uint64_t hi = lo;
  bool sorted = true;
  uint64_t previous = 0;
  for (const Record& r : records) {
    lo = std::min(lo, r.seq);
    hi = std::max(hi, r.seq);
    sorted = sorted && r.seq > previous;
    previous = r.seq;
  }
  if (sorted) return;  // one thread's ring, or threads taking turns
  const uint64_t span = hi - lo + 1;
  if (span > 2 * static_cast<uint64_t>(records.size()) + 1024 || records.size() >= UINT32_MAX) {
    std::stable_sort(records.begin(), records.end(),
                     [](const Record& a, const Record& b) { return a.seq < b.seq; });
    return;
  }
  // Each record's place by its seq: the index of the record there, plus one (0: none). A place
  // is 4 bytes, so clearing the places costs a twelfth of clearing records; the records are
  // then copied once, in order.
  thread_local std::vector<uint32_t> places;
  places.assign(span, 0);
  for (size_t i = 0; i < records.size(); ++i) {
    uint32_t& place = places[records[i].seq - lo];
    if (place != 0) {  // a seq twice: no place of its own
      std::stable_sort(records.begin(), records.end(),
                       [](const Record& a, const Record& b) { return a.seq < b.seq; });
      return;
    }
    place = static_cast<uint32_t>(i + 1);
  }
  scratch.clear();
  scratch.reserve(records.size());
  for (const uint32_t place : places) {
    if (place != 0) scratch.push_back(records[place - 1]);
  }
  records.swap(scratch);
}

}  // namespace tidemark::agent
