#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "src/importers/import_stream.h"

namespace tidemark::core {

// A PyTorch CUDA memory snapshot (torch.cuda.memory._snapshot() / _dump_snapshot(), a pickle of
// plain data) as events: the blocks allocated when the trace began, then every alloc and
// completed free of its device_traces, each block tagged with a category derived from its stack
// frames. A snapshot without traces (the state-only form) gives the blocks allocated at the
// dump. Category rules (the tag's name starts with the rule; docs/import.md): from the stack that
// allocated a block and the one that freed it — [frames:optimizer], [frames:backward],
// [frames:construction], [frames:forward] (or [frames:forward, freed there]) — and for blocks
// from before the trace, which have no frames, from what freed them ([freed by zero_grad],
// [replaced by the optimizer], [freed in backward]) or, kept to the dump, from their size
// ([kept, parameter-sized]: WEIGHT). Steps end where the optimizer's work does.
absl::StatusOr<ImportedRecording> importMemorySnapshot(std::string_view pickleBytes);

}  // namespace tidemark::core
