#pragma once

#include <cupti_activity.h>

#include <cstring>

// A CUPTI activity record of type T as CUPTI hands it out before filling: zeroed, its kind set.
// Shared by the fake libcupti and the decoder's unit tests.
template <typename T>
T zeroedRecord(CUpti_ActivityKind kind) {
  T r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  return r;
}
