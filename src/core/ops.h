#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/recording.h"

namespace tidemark::core {

// Time spent in a module (CPU time from its scopes: forward calls, and recomputation).
struct OpStat {
  std::string name;
  bool isOp = false;      // a framework op; else a module
  bool isKernel = false;  // a GPU kernel (its time is GPU time)
  int64_t calls = 0;
  int64_t totalNs = 0;     // from each call's begin to its end
  int64_t selfNs = 0;      // total minus the time of the calls nested directly inside
  std::string launchedBy;  // kernels: the module most of its launches came from ("" unknown)
  int64_t gpuNs = 0;       // modules and ops: GPU time of the kernels launched while innermost
};

// Per module and op name, largest total first. Scopes still open at the end are left out.
// Kernels whose launch was recorded (GPU capture) are tied to the module scope innermost on the
// launching thread at the launch: launchedBy for the kernel, gpuNs for the module; and to the op
// scope innermost there (gpuNs for the op).
std::vector<OpStat> moduleTimes(const Recording& recording);

}  // namespace tidemark::core
