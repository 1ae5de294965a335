#include "server/rpc/step_figures.h"

#include <set>

#include "src/core/category.h"

namespace tidemark::server {

namespace {
constexpr int32_t kAllMemory = -2;  // the agent's summary of all memory together
}  // namespace

void fillSummarizedStep(const std::vector<StepFigureRow>& figures, const core::DeviceFilter& device,
                        int64_t sessionId, int64_t startTsNs, v1::StepSummary* out) {
  out->set_summarized(true);
  // The agent's figures are for all memory, host memory and each device alone.
  std::set<int32_t> gpus;
  for (const StepFigureRow& f : figures)
    if (f.device >= 0) gpus.insert(f.device);
  int32_t which = kAllMemory;
  bool measured = true;
  switch (device.kind) {
    case core::DeviceFilter::Kind::kAll:
      break;
    case core::DeviceFilter::Kind::kHost:
      which = -1;
      break;
    case core::DeviceFilter::Kind::kDevice:
      which = device.device;
      break;
    case core::DeviceFilter::Kind::kAnyDevice:
      measured = gpus.size() <= 1;
      which = gpus.empty() ? -3 : *gpus.begin();
      break;
  }
  v1::Breakdown* peak = out->mutable_peak();
  peak->set_session_id(static_cast<uint64_t>(sessionId));
  peak->set_step(out->step());
  peak->set_at_peak(true);
  peak->set_reserved_bytes(-1);
  int64_t byCategory[core::kCategoryCount] = {};
  int64_t tracked = 0;
  for (const StepFigureRow& f : figures) {
    if (f.figure == v1::SUMMARY_FIGURE_EVENTS && f.device == kAllMemory) {
      out->set_events_summarized(f.value);
    }
    if (f.device != which) continue;
    switch (f.figure) {
      case v1::SUMMARY_FIGURE_PEAK_BYTES:
        tracked = f.value;
        peak->set_ts_ns(f.tsNs);
        peak->set_offset_ns(f.tsNs - startTsNs);
        break;
      case v1::SUMMARY_FIGURE_BYTES_AT_PEAK: {
        // Untagged bytes (category 0) are UNKNOWN: no lifetime rule ran on them.
        auto c = core::categoryFromWire(f.category);
        byCategory[core::categoryIndex(c ? *c : core::Category::kUnknown)] += f.value;
        break;
      }
      case v1::SUMMARY_FIGURE_RESERVED_AT_PEAK:
        peak->set_reserved_bytes(f.value);
        break;
      default:
        break;
    }
  }
  peak->set_tracked_bytes(measured ? tracked : -1);
  for (core::Category c : core::kAllCategories) {
    v1::CategoryBytes* cb = peak->add_categories();
    cb->set_category(static_cast<v1::Category>(static_cast<int>(c)));
    cb->set_name(std::string(core::categoryName(c)));
    cb->set_bytes(measured ? byCategory[core::categoryIndex(c)] : 0);
  }
}

}  // namespace tidemark::server
