#pragma once

#include <cstddef>

#include "agent/recorder/record.h"

namespace tidemark::agent {

// A sink for Ring::drainBefore and Recorder::drainAll (given records in pieces) that hands them
// to fn one at a time, as the tests read them.
template <typename Fn>
auto eachRecord(Fn fn) {
  return [fn](const Record* records, size_t n) mutable {
    for (size_t i = 0; i < n; ++i) fn(records[i]);
  };
}

}  // namespace tidemark::agent
