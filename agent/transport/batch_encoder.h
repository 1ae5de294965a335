#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "agent/recorder/record.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {

// Writes an AgentMessage holding one EventBatch in protobuf's wire format straight from the
// records: no message objects, no allocation per event. The bytes are the ones protobuf itself
// would write for the same message (fields in number order, zeros left out, a oneof's empty
// payload still present), so the server reads them as any other AgentMessage
// (tests/unit/batch_encoder_test.cpp compares the two byte for byte). `counters`: a serialized
// v1.AgentCounters for the batch's counters field, or "" for none.
std::string encodeBatchMessage(uint64_t batchSeq,
                               const std::vector<std::pair<uint32_t, std::string>>& strings,
                               const std::vector<Record>& records,
                               const std::string& counters = {});

// At most this many events a batch (the agent's sender and rawRecordsBatch alike).
inline constexpr size_t kMaxEventsPerBatch = 8192;

// An AgentMessage holding a RawRecords of recordBytes of records, serialized but for the
// records themselves: these bytes, then the records as they lie in memory, are the message.
std::string rawRecordsHead(uint64_t firstBatchSeq,
                           const std::vector<std::pair<uint32_t, std::string>>& strings,
                           size_t recordBytes);

// How many batches a RawRecords message of n records becomes (at least one: its strings).
inline uint64_t rawBatchCount(uint64_t records) {
  return records == 0 ? 1 : (records + kMaxEventsPerBatch - 1) / kMaxEventsPerBatch;
}

// Whether a v1.RawRecords can be read: "" if so, else why not (another layout, a length that is
// not a whole number of records).
std::string rawRecordsProblem(const v1::RawRecords& raw);
// The index-th (from 0) of the rawBatchCount(records) batches a readable RawRecords holds,
// serialized as an AgentMessage: its records index * kMaxEventsPerBatch on, numbered
// first_batch_seq + index, its strings in the first. One batch at a time, so a reader holds the
// message and one batch, never all of them.
std::string rawRecordsBatch(const v1::RawRecords& raw, uint64_t index);

}  // namespace tidemark::agent
