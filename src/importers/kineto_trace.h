#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "src/importers/import_stream.h"

namespace tidemark::core {

// A PyTorch profiler / Kineto trace (Chrome trace JSON) as events:
// - `[memory]` instant events of one device (the GPU with the most of them, else the CPU): with
//   `Addr`, an alloc (Bytes > 0) or a free (Bytes < 0) of that address; without (the 2021
//   schema), allocs get addresses of their own and a free releases the latest live alloc of its
//   size. What was allocated before the trace began (the first `Total Allocated` less its
//   `Bytes`, and blocks freed without an alloc) becomes blocks at the trace's start, tagged
//   "[before the trace]", so the replayed total equals `Total Allocated` throughout;
// - ops (`cpu_op`, `Operator`) as op scopes on their thread, kernels (`kernel`, `Kernel`) as
//   kernel scopes on their stream, `ProfilerStep#N` as step N, and (traces made with
//   with_modules) `nn.Module: Name_k` python_function events as module scopes "Name_k";
// - each memory event on its thread (whose open op and module own the block), and a tag with
//   the category the training loop's phases give it: the optimizer's annotations and autograd's
//   backward ops say when the loop ran forward, backward, the optimizer and zero_grad
//   (docs/import.md has the rules).
absl::StatusOr<ImportedRecording> importKinetoTrace(std::string_view json);

}  // namespace tidemark::core
