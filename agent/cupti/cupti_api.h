#pragma once

#include <cupti.h>

#include <string>

namespace tidemark::agent {

// The CUPTI entry points the agent uses, loaded at run time (dlopen), so that the agent needs
// libcupti only in a process that initializes CUDA. $TIDEMARK_CUPTI_LIBRARY names the library
// to load (the tests point it at a fake); otherwise libcupti.so.13, libcupti.so, then the CUDA
// Toolkit's copy.
struct CuptiApi {
  CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle);
  CUptiResult (*enableDomain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
  CUptiResult (*enableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                                CUpti_CallbackId);
  CUptiResult (*getDeviceId)(CUcontext, uint32_t*);
  CUptiResult (*activityEnable)(CUpti_ActivityKind);
  CUptiResult (*activityDisable)(CUpti_ActivityKind);
  CUptiResult (*activityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                           CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*activityGetNextRecord)(uint8_t*, size_t, CUpti_Activity**);
  CUptiResult (*activityGetNumDroppedRecords)(CUcontext, uint32_t, size_t*);
  CUptiResult (*activityFlushAll)(uint32_t);
  CUptiResult (*activityRegisterTimestampCallback)(CUpti_TimestampCallbackFunc);
  CUptiResult (*getResultString)(CUptiResult, const char**);
  std::string path;  // the library loaded

  // The API, or nullptr with *why set. Loaded once; never unloaded.
  static const CuptiApi* load(std::string* why);
  std::string describe(CUptiResult r) const;
};

}  // namespace tidemark::agent
