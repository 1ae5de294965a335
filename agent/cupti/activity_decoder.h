#pragma once

#include <cupti_activity.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "agent/cupti/gpu_event.h"

namespace tidemark::agent {

// Decodes one CUPTI activity record (CUDA 13's record versions: Kernel10, Memcpy6, Memset4,
// Memory4, MemoryPool3, Marker2, Synchronization2, ExternalCorrelation). False for kinds tidemark
// does not use (the record is then skipped).
bool decodeActivity(const CUpti_Activity* record, GpuEvent* out);

// Every record in a completed buffer, in order, through `next` (cuptiActivityGetNextRecord, or a
// test's walker). Returns the records skipped (kinds not used, or malformed).
using NextRecordFn = CUptiResult (*)(uint8_t* buffer, size_t validSize, CUpti_Activity** record);
size_t decodeBuffer(uint8_t* buffer, size_t validSize, NextRecordFn next,
                    std::vector<GpuEvent>* out);

}  // namespace tidemark::agent
