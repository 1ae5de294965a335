#pragma once

#include <cstdint>
#include <vector>

#include "server/store/store.h"
#include "src/core/device_filter.h"
#include "tidemark/v1/query.pb.h"

namespace tidemark::server {

// A step a capture schedule summarized, as GetSteps answers it: its figures (all of one step,
// from Store::loadStepFigures) for the memory the device filter selects, into out's peak.
void fillSummarizedStep(const std::vector<StepFigureRow>& figures, const core::DeviceFilter& device,
                        int64_t sessionId, int64_t startTsNs, v1::StepSummary* out);

}  // namespace tidemark::server
