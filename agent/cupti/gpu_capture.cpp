#include "agent/cupti/gpu_capture.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "agent/cupti/activity_decoder.h"
#include "agent/cupti/api_callbacks.h"
#include "agent/cupti/cupti_api.h"
#include "agent/cupti/gpu_recorder.h"
#include "agent/recorder/recorder.h"
#include "src/base/clock.h"

namespace tidemark::agent::gpu_capture {

namespace {

struct Completed {
  uint8_t* buffer;
  size_t validSize;
  CUcontext context;
  uint32_t streamId;
};

struct State {
  const CuptiApi* api = nullptr;
  CUpti_SubscriberHandle subscriber = nullptr;
  std::unique_ptr<GpuRecorder> gpu;
  Recorder* recorder = nullptr;
  std::mutex mutex;  // guards everything below; never held across a CUPTI call
  std::condition_variable wake, idle;
  std::deque<Completed> queue;
  std::vector<uint8_t*> freeBuffers;
  size_t buffersMade = 0;
  bool stopping = false, running = false, parsing = false;
  int flushMs = 100;
  int exitTimeoutMs = 0;
  pid_t owner = 0;  // the process whose capture this is (a forked child inherits the state)
  Stats stats;
  uint64_t droppedReported = 0;  // the lost records' total last recorded (recordDropped)
  std::thread thread;
};

State& state() {
  static State* s = new State();  // never destroyed: CUPTI may call back during exit
  return *s;
}

uint64_t monotonicTimestamp() { return static_cast<uint64_t>(base::monotonicNs()); }

// A buffer's records, counted without decoding them (no memory needed).
uint64_t countRecords(State& s, const Completed& c) noexcept {
  uint64_t n = 0;
  CUpti_Activity* record = nullptr;
  while (c.validSize > 0 &&
         s.api->activityGetNextRecord(c.buffer, c.validSize, &record) == CUPTI_SUCCESS)
    ++n;
  return n;
}

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* maxNumRecords) {
  State& s = state();
  *maxNumRecords = 0;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.freeBuffers.empty()) {
    *buffer = s.freeBuffers.back();
    s.freeBuffers.pop_back();
  } else if (s.buffersMade < kMaxBuffers) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    if (*buffer != nullptr) ++s.buffersMade;
  } else {
    *buffer = nullptr;
  }
  if (*buffer == nullptr) {
    ++s.stats.buffersRefused;  // CUPTI drops the records and counts them
    *size = 0;
    return;
  }
  *size = kBufferBytes;
}

void CUPTIAPI bufferCompleted(CUcontext context, uint32_t streamId, uint8_t* buffer, size_t,
                              size_t validSize) {
  State& s = state();
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    try {
      s.queue.push_back({buffer, validSize, context, streamId});
      queued = true;
    } catch (const std::bad_alloc&) {
      // No memory to queue it (the job at its memory limit; an exception would cross CUPTI and
      // end the job): its records are counted as lost (reported with the next buffer parsed),
      // and the buffer goes back to the pool.
    }
  }
  if (!queued) {
    const uint64_t lost = countRecords(s, {buffer, validSize, context, streamId});
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stats.recordsLostNoMemory += lost;
    s.freeBuffers.push_back(buffer);
    return;
  }
  s.wake.notify_all();
}

// The subscriber's callback, on the thread calling the CUDA API: device memory allocated and
// freed, recorded there and then (host time, that thread's scopes). No lock, no allocation.
void CUPTIAPI onCallback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void* data) {
  State& s = state();
  if (!s.recorder->recording() || t_recursionGuard) return;
  const auto* d = static_cast<const CUpti_CallbackData*>(data);
  if (const uint32_t correlation = launchCorrelation(domain, cbid, d); correlation != 0) {
    Record r{};
    r.kind = RecordKind::kLaunch;
    r.address = correlation;
    r.device = -1;
    s.recorder->push(r);
    return;
  }
  const ApiMemoryEvent m =
      decodeApiCallback(domain, cbid, static_cast<const CUpti_CallbackData*>(data));
  if (m.op == ApiMemoryEvent::Op::kNone) return;
  Record r{};
  r.kind = m.op == ApiMemoryEvent::Op::kAlloc ? RecordKind::kAlloc : RecordKind::kFree;
  r.small = m.host ? 1 : 2;  // tidemark.v1.MemoryKind HOST / DEVICE
  r.address = m.address;
  r.sizeBytes = m.bytes;
  r.device = -1;
  if (!m.host) {
    uint32_t device = 0;
    if (s.api->getDeviceId(d->context, &device) == CUPTI_SUCCESS)
      r.device = static_cast<int32_t>(device);
  }
  s.recorder->push(r);
}

void parseOne(State& s, const Completed& c) {
  size_t skipped = 0;
  uint64_t recorded = 0;
  uint64_t lost = 0;  // not recorded for want of memory (the job at its memory limit)
  try {
    std::vector<GpuEvent> events;
    skipped = c.validSize > 0
                  ? decodeBuffer(c.buffer, c.validSize, s.api->activityGetNextRecord, &events)
                  : 0;
    size_t i = 0;
    try {
      for (; i < events.size(); ++i)
        if (s.gpu->record(events[i])) ++recorded;
    } catch (const std::bad_alloc&) {  // a name's interning
      lost = events.size() - i;
    }
  } catch (const std::bad_alloc&) {  // the decoding
    lost = countRecords(s, c);
    recorded = 0;
    skipped = 0;
  }
  size_t dropped = 0;
  s.api->activityGetNumDroppedRecords(c.context, c.streamId, &dropped);
  uint64_t droppedTotal = 0;
  bool report = false;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stats.buffersCompleted += 1;
    s.stats.records += recorded;
    s.stats.recordsSkipped += skipped;
    s.stats.cuptiDropped += dropped;
    s.stats.recordsLostNoMemory += lost;
    droppedTotal = s.stats.cuptiDropped + s.stats.recordsLostNoMemory;
    report = droppedTotal != s.droppedReported;
    s.droppedReported = droppedTotal;
    s.freeBuffers.push_back(c.buffer);  // within the capacity reserved at the start
  }
  if (report) s.gpu->recordDropped(droppedTotal, base::monotonicNs());
}

void run() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, nullptr);
  RecursionGuard guard;  // this thread's own allocations are not the job's
  State& s = state();
  auto lastFlush = std::chrono::steady_clock::now();
  for (;;) {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.wake.wait_for(lock, std::chrono::milliseconds(s.flushMs),
                    [&] { return s.stopping || !s.queue.empty(); });
    while (!s.queue.empty()) {
      const Completed c = s.queue.front();
      s.queue.pop_front();
      s.parsing = true;
      lock.unlock();
      parseOne(s, c);
      lock.lock();
      s.parsing = false;
    }
    s.idle.notify_all();
    if (s.stopping) return;
    lock.unlock();
    if (std::chrono::steady_clock::now() - lastFlush >= std::chrono::milliseconds(s.flushMs)) {
      s.api->activityFlushAll(0);  // hands over full buffers; never under our lock
      lastFlush = std::chrono::steady_clock::now();
    }
  }
}

constexpr CUpti_ActivityKind kActivityKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                                 CUPTI_ACTIVITY_KIND_MEMCPY,
                                                 CUPTI_ACTIVITY_KIND_MEMSET,
                                                 CUPTI_ACTIVITY_KIND_MEMORY2,
                                                 CUPTI_ACTIVITY_KIND_MEMORY_POOL,
                                                 CUPTI_ACTIVITY_KIND_MARKER,
                                                 CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
                                                 CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

}  // namespace

bool start(Recorder& recorder, Interner& interner, int flushIntervalMs, std::string* why) {
  State& s = state();
  if (s.running) return true;
  s.api = CuptiApi::load(why);
  if (s.api == nullptr) return false;
  const CUptiResult sub = s.api->subscribe(&s.subscriber, &onCallback, nullptr);
  if (sub != CUPTI_SUCCESS) {
    *why = sub == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
               ? "another CUPTI subscriber (torch.profiler, Nsight, ...) holds CUPTI; tidemark "
                 "records host memory and the adapter's events only, and leaves it alone"
               : "cuptiSubscribe: " + s.api->describe(sub);
    return false;
  }
  s.recorder = &recorder;
  bool callbacks = true;
  for (size_t i = 0; i < kRuntimeMemoryCallbackCount; ++i)
    callbacks = s.api->enableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                      kRuntimeMemoryCallbacks[i]) == CUPTI_SUCCESS &&
                callbacks;
  for (size_t i = 0; i < kDriverMemoryCallbackCount; ++i)
    callbacks = s.api->enableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                                      kDriverMemoryCallbacks[i]) == CUPTI_SUCCESS &&
                callbacks;
  // Launches: their correlation ids tie each kernel to the thread (and scope) that launched it.
  for (size_t i = 0; i < kRuntimeLaunchCallbackCount; ++i)
    s.api->enableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, kRuntimeLaunchCallbacks[i]);
  for (size_t i = 0; i < kDriverLaunchCallbackCount; ++i)
    s.api->enableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API, kDriverLaunchCallbacks[i]);
  s.api->activityRegisterTimestampCallback(&monotonicTimestamp);
  const CUptiResult reg = s.api->activityRegisterCallbacks(&bufferRequested, &bufferCompleted);
  if (reg != CUPTI_SUCCESS) {
    *why = "cuptiActivityRegisterCallbacks: " + s.api->describe(reg);
    s.api->unsubscribe(s.subscriber);
    return false;
  }
  for (CUpti_ActivityKind kind : kActivityKinds) {
    const CUptiResult r = s.api->activityEnable(kind);
    if (r != CUPTI_SUCCESS)
      std::fprintf(stderr, "tidemark: CUPTI activity kind %d not enabled: %s\n",
                   static_cast<int>(kind), s.api->describe(r).c_str());
  }
  s.gpu = std::make_unique<GpuRecorder>(recorder, interner);
  s.gpu->setBlocksFromCallbacks(callbacks);
  s.flushMs = flushIntervalMs > 0 ? flushIntervalMs : 100;
  s.stopping = false;
  s.owner = getpid();
  s.freeBuffers.reserve(kMaxBuffers);  // a buffer handed back never allocates
  s.running = true;
  s.thread = std::thread(&run);
  return true;
}

void flush(int timeoutMs) {
  State& s = state();
  if (!s.running) return;
  s.api->activityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  s.wake.notify_all();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.idle.wait_for(lock, std::chrono::milliseconds(timeoutMs),
                  [&] { return s.queue.empty() && !s.parsing; });
}

void stop(int timeoutMs) {
  State& s = state();
  if (!s.running) return;
  // CUPTI records nothing more; what it holds is handed over and recorded.
  for (CUpti_ActivityKind kind : kActivityKinds) s.api->activityDisable(kind);
  flush(timeoutMs);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
  }
  s.wake.notify_all();
  if (s.thread.joinable()) s.thread.join();
  s.api->unsubscribe(s.subscriber);
  s.running = false;
}

namespace {

void stopOnExit() {
  State& s = state();
  if (s.owner == getpid()) stop(s.exitTimeoutMs);
}

}  // namespace

void stopAtExit(int timeoutMs) {
  State& s = state();
  s.exitTimeoutMs = timeoutMs;
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(&stopOnExit); });
}

bool running() { return state().running; }

Stats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

}  // namespace tidemark::agent::gpu_capture
