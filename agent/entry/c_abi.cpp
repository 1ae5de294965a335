// The exported C ABI (agent/include/tidemark/agent_api.h). No exception crosses it.
#include "tidemark/agent_api.h"

#include <atomic>
#include <cstring>
#include <string>

#include "agent/agent.h"
#include "agent/hooks/native_callers.h"
#include "agent/python/python_stacks.h"

using tidemark::agent::Agent;
using tidemark::agent::CaptureFilter;
using tidemark::agent::Record;
using tidemark::agent::Recorder;
using tidemark::agent::RecordKind;
using tidemark::agent::RecursionGuard;
using tidemark::agent::Transport;

#define TIDEMARK_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
inline bool recordingHere() noexcept {
  Agent& a = Agent::instance();
  return a.loaded() && a.recorder().recording();
}

void pushSimple(RecordKind kind, uint8_t small, uint64_t address, uint64_t size,
                uint32_t nameIid) noexcept {
  if (!recordingHere()) return;
  RecursionGuard guard;
  Record r{};
  r.kind = kind;
  r.small = small;
  r.address = address;
  r.sizeBytes = size;
  r.nameIid = nameIid;
  r.device = -1;
  Agent::instance().recorder().push(r);
}
}  // namespace

TIDEMARK_EXPORT int tidemark_abi_version(void) { return TIDEMARK_ABI_VERSION; }

TIDEMARK_EXPORT int tidemark_agent_start(void) {
  try {
    return Agent::instance().start() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

TIDEMARK_EXPORT void tidemark_agent_stop(void) {
  try {
    Agent::instance().stop();
  } catch (...) {
  }
}

TIDEMARK_EXPORT int tidemark_recording(void) { return recordingHere() ? 1 : 0; }

TIDEMARK_EXPORT int tidemark_flush(int timeout_ms) {
  try {
    RecursionGuard guard;
    return Agent::instance().flush(timeout_ms) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

TIDEMARK_EXPORT uint64_t tidemark_session_id(void) { return Agent::instance().sessionId(); }

TIDEMARK_EXPORT uint32_t tidemark_intern(const char* name) {
  if (name == nullptr) return 0;
  try {
    RecursionGuard guard;
    return Agent::instance().interner().intern(name);
  } catch (...) {
    return 0;
  }
}

TIDEMARK_EXPORT void tidemark_scope_begin(uint32_t name_id) {
  pushSimple(RecordKind::kScopeBegin, 0, 0, 0, name_id);
}
TIDEMARK_EXPORT void tidemark_scope_end(uint32_t name_id) {
  pushSimple(RecordKind::kScopeEnd, 0, 0, 0, name_id);
}
TIDEMARK_EXPORT void tidemark_op_begin(uint32_t name_id) {
  pushSimple(RecordKind::kScopeBegin, 1, 0, 0, name_id);
}
TIDEMARK_EXPORT void tidemark_op_end(uint32_t name_id) {
  pushSimple(RecordKind::kScopeEnd, 1, 0, 0, name_id);
}
TIDEMARK_EXPORT void tidemark_phase_begin(int phase) {
  pushSimple(RecordKind::kPhaseBegin, static_cast<uint8_t>(phase), 0, 0, 0);
}
TIDEMARK_EXPORT void tidemark_phase_end(int phase) {
  pushSimple(RecordKind::kPhaseEnd, static_cast<uint8_t>(phase), 0, 0, 0);
}
TIDEMARK_EXPORT void tidemark_step_begin(int64_t step) {
  // A capture schedule's full detail begins with this step: the live blocks the daemon has not
  // seen are sent when the collector takes the mark, under numbers the mark reserves right after
  // its own (sizeBytes of them), so that they come before anything of the step.
  Transport* t = recordingHere() ? Agent::instance().transport() : nullptr;
  const CaptureFilter* filter = t != nullptr ? t->captureFilter() : nullptr;
  if (filter == nullptr || !filter->startsDetail(step)) {
    pushSimple(RecordKind::kStepBegin, 0, static_cast<uint64_t>(step), 0, 0);
    return;
  }
  RecursionGuard guard;
  Recorder& recorder = Agent::instance().recorder();
  Record r{};
  r.kind = RecordKind::kStepBegin;
  r.address = static_cast<uint64_t>(step);
  r.sizeBytes = filter->restateBound(recorder.recordedCount());
  r.device = -1;
  recorder.push(r);  // its sizeBytes numbers reserved by the drain
}
TIDEMARK_EXPORT void tidemark_step_end(int64_t step) {
  pushSimple(RecordKind::kStepEnd, 0, static_cast<uint64_t>(step), 0, 0);
}
TIDEMARK_EXPORT void tidemark_tag(uint64_t address, uint64_t size_bytes, int category,
                                  uint32_t name_id) {
  pushSimple(RecordKind::kTag, static_cast<uint8_t>(category), address, size_bytes, name_id);
}

TIDEMARK_EXPORT int tidemark_python_stacks_here(const char* hidden_prefix) {
  return tidemark::agent::python_stacks::followThisThread(hidden_prefix);
}

TIDEMARK_EXPORT int tidemark_tensor_allocator_library(const char* library_prefix) {
  if (library_prefix == nullptr || *library_prefix == '\0') return 0;
  try {
    RecursionGuard guard;
    Agent& a = Agent::instance();
    auto& interner = a.interner();
    // A block allocated by a native library before now and still live: tagged now (its tag
    // holds for its whole life).
    const auto tagEarly = [&a](uint64_t address, uint32_t name) {
      uint64_t size = 0;
      if (recordingHere() && a.recorder().blocks().lookup(address, &size))
        a.recorder().pushNativeTag(address, size, name);
    };
    return tidemark::agent::native_callers::identifyTensorAllocator(
               library_prefix, [&interner](std::string_view name) { return interner.intern(name); },
               tagEarly)
               ? 1
               : 0;
  } catch (...) {
    return 0;
  }
}

TIDEMARK_EXPORT void tidemark_seed_block(uint64_t address, uint64_t size_bytes) {
  if (!recordingHere() || address == 0) return;
  Agent& a = Agent::instance();
  uint64_t known = 0;
  if (a.recorder().blocks().lookup(address, &known)) return;  // allocated since the attach
  RecursionGuard guard;
  a.recorder().onAlloc(reinterpret_cast<void*>(address), size_bytes);
}

namespace {
// What each device's caching allocator holds (tidemark_tensor_memory's total_reserved).
constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_reserved[kMaxDevices];
}  // namespace

TIDEMARK_EXPORT void tidemark_tensor_memory(uint64_t address, int64_t size_delta, int device,
                                            int64_t total_reserved) {
  if (!recordingHere() || address == 0 || size_delta == 0) return;
  RecursionGuard guard;
  Agent& a = Agent::instance();
  Record r{};
  r.kind = size_delta > 0 ? RecordKind::kAlloc : RecordKind::kFree;
  r.small = 3;  // tidemark.v1.MEMORY_KIND_TENSOR
  r.address = address;
  r.sizeBytes = size_delta > 0 ? static_cast<uint64_t>(size_delta) : 0;
  r.device = device < 0 ? -1 : device;
  if (a.recorder().push(r) && size_delta > 0)
    a.recorder().pushStackOf(address, static_cast<uint64_t>(size_delta));
  if (total_reserved < 0 || device < 0 || device >= kMaxDevices) return;
  if (g_reserved[device].exchange(total_reserved, std::memory_order_relaxed) == total_reserved)
    return;
  int64_t sum = 0;
  for (const auto& v : g_reserved) sum += v.load(std::memory_order_relaxed);
  try {
    Record c{};
    c.kind = RecordKind::kCounter;
    c.nameIid = a.interner().intern("reserved_bytes");
    c.sizeBytes = static_cast<uint64_t>(sum);
    c.device = -1;
    a.recorder().push(c);
  } catch (...) {
  }
}

TIDEMARK_EXPORT void tidemark_adapter_failed(void) {
  Agent::instance().recorder().noteAdapterFailure();
}

TIDEMARK_EXPORT void tidemark_counters(uint64_t* recorded, uint64_t* sent, uint64_t* dropped) {
  Agent& a = Agent::instance();
  const auto& d = a.recorder().drops();
  uint64_t s = 0;
  uint64_t extra = 0;
  if (Transport* t = a.transport(); t != nullptr) {
    const auto c = t->counters();
    s = c.events_sent();
    extra = c.dropped_spool_full() + c.dropped_disconnected();
  }
  if (recorded) *recorded = a.recorder().recordedCount();
  if (sent) *sent = s;
  if (dropped) *dropped = d.ringFull.load() + d.noRing.load() + d.tableFull.load() + extra;
}

TIDEMARK_EXPORT int64_t tidemark_take_plan(char* buf, int64_t cap, uint64_t* plan_id) {
  try {
    RecursionGuard guard;
    Transport* t = Agent::instance().transport();
    uint64_t id = 0;
    std::string json;
    if (t == nullptr || !t->takePlan(&id, &json)) return 0;
    const auto need = static_cast<int64_t>(json.size()) + 1;
    if (buf == nullptr || cap < need) {
      t->returnPlan(id, std::move(json));
      return need;
    }
    std::memcpy(buf, json.c_str(), json.size() + 1);
    if (plan_id != nullptr) *plan_id = id;
    return static_cast<int64_t>(json.size());
  } catch (...) {
    return 0;
  }
}

TIDEMARK_EXPORT void tidemark_plan_result(uint64_t plan_id, int applied, const char* message,
                                          int64_t step) {
  try {
    RecursionGuard guard;
    Transport* t = Agent::instance().transport();
    if (t != nullptr) t->reportPlanResult(plan_id, applied != 0, message ? message : "", step);
  } catch (...) {
  }
}

TIDEMARK_EXPORT void tidemark_job_plan_result(const char* plan_json, int applied,
                                              const char* message, int64_t step) {
  try {
    RecursionGuard guard;
    Transport* t = Agent::instance().transport();
    if (t != nullptr && plan_json != nullptr && *plan_json != '\0')
      t->reportPlanResult(0, applied != 0, message ? message : "", step, plan_json);
  } catch (...) {
  }
}
