#pragma once

#include <vector>

#include "agent/recorder/record.h"

namespace tidemark::agent {

// Puts a drain's records in sequence order. Each ring yields its records in increasing seq and
// the seqs of one drain are nearly dense, so each record's place is its seq minus the lowest:
// linear time where a sort of a burst's hundreds of thousands of records took most of the
// collector's time. Seqs far from dense (or repeated) are sorted instead. scratch is working
// room (records and scratch may trade buffers).
void orderBySeq(std::vector<Record>& records, std::vector<Record>& scratch);

}  // namespace tidemark::agent
