#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "agent/recorder/record.h"

namespace tidemark::agent {

// Writes an AgentMessage holding one EventBatch in protobuf's wire format straight from the
// records: no message objects, no allocation per event. The bytes are the ones protobuf itself
// would write for the same message (fields in number order, zeros left out, a oneof's empty
// payload still present), so the server reads them as any other AgentMessage
// (tests/unit/batch_encoder_test.cpp compares the two byte for byte).
std::string encodeBatchMessage(uint64_t batchSeq,
                               const std::vector<std::pair<uint32_t, std::string>>& strings,
                               const std::vector<Record>& records);

}  // namespace tidemark::agent
