#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "src/importers/import_stream.h"

namespace tidemark::core {

// A PyTorch CUDA memory snapshot (torch.cuda.memory._snapshot() / _dump_snapshot(), a pickle of
// plain data) as events: the blocks allocated when the trace began, then every alloc and
// completed free of its device_traces, each block tagged with a category derived from its stack
// frames. A snapshot without traces (the state-only form) gives the blocks allocated at the
// dump. Category rules (the tag's name starts with the rule):
//   [frames:optimizer]    a Python frame named "step" or a file under an optim package:
//                         OPTIMIZER_STATE if alive at the dump, else TEMPORARY
//   [frames:backward]     autograd's engine or AccumulateGrad: GRADIENT if alive at the dump,
//                         else TEMPORARY
//   [frames:construction] __init__, _apply, reset_parameters: WEIGHT
//   [frames:forward]      a frame named "forward": ACTIVATION
//   [size:optimizer-state] no frames, allocated before the trace and at the dump, the size of a
//                         block in OPTIMIZER_STATE: WEIGHT (a parameter, whose moments match it)
absl::StatusOr<ImportedRecording> importMemorySnapshot(std::string_view pickleBytes);

}  // namespace tidemark::core
