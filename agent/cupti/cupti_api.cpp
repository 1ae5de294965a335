#include "agent/cupti/cupti_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace tidemark::agent {

namespace {

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

}  // namespace

const CuptiApi* CuptiApi::load(std::string* why) {
  static std::once_flag once;
  static CuptiApi api;
  static const CuptiApi* loaded = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* e = std::getenv("TIDEMARK_CUPTI_LIBRARY"); e != nullptr && *e != '\0')
      candidates.emplace_back(e);
    for (const char* c : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so",
                          "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"})
      candidates.emplace_back(c);
    void* lib = nullptr;
    for (const std::string& c : candidates) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) {
        api.path = c;
        break;
      }
    }
    if (lib == nullptr) {
      const char* e = dlerror();
      error = std::string("libcupti not found (") + (e ? e : "dlopen failed") + ")";
      return;
    }
    std::string missing;
    bool ok = bind(lib, "cuptiSubscribe", &api.subscribe, &missing);
    ok = bind(lib, "cuptiUnsubscribe", &api.unsubscribe, &missing) && ok;
    ok = bind(lib, "cuptiEnableDomain", &api.enableDomain, &missing) && ok;
    ok = bind(lib, "cuptiEnableCallback", &api.enableCallback, &missing) && ok;
    ok = bind(lib, "cuptiGetDeviceId", &api.getDeviceId, &missing) && ok;
    ok = bind(lib, "cuptiActivityEnable", &api.activityEnable, &missing) && ok;
    ok = bind(lib, "cuptiActivityDisable", &api.activityDisable, &missing) && ok;
    ok =
        bind(lib, "cuptiActivityRegisterCallbacks", &api.activityRegisterCallbacks, &missing) && ok;
    ok = bind(lib, "cuptiActivityGetNextRecord", &api.activityGetNextRecord, &missing) && ok;
    ok = bind(lib, "cuptiActivityGetNumDroppedRecords", &api.activityGetNumDroppedRecords,
              &missing) &&
         ok;
    ok = bind(lib, "cuptiActivityFlushAll", &api.activityFlushAll, &missing) && ok;
    ok = bind(lib, "cuptiActivityRegisterTimestampCallback", &api.activityRegisterTimestampCallback,
              &missing) &&
         ok;
    ok = bind(lib, "cuptiGetResultString", &api.getResultString, &missing) && ok;
    if (!ok) {
      error = api.path + " lacks " + missing;
      return;
    }
    loaded = &api;
  });
  if (loaded == nullptr && why != nullptr) *why = error;
  return loaded;
}

std::string CuptiApi::describe(CUptiResult r) const {
  const char* s = nullptr;
  if (getResultString != nullptr && getResultString(r, &s) == CUPTI_SUCCESS && s != nullptr)
    return s;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

}  // namespace tidemark::agent
