// torch's ops as op scopes (part of libtidemark_torch-<version>.so): a global RecordFunction
// callback, the mechanism torch.profiler observes ops with, turns each aten op the dispatcher
// runs (scope FUNCTION: "aten::mm", "aten::add_", on whatever thread runs it, the autograd
// engine's included) into tidemark_op_begin / tidemark_op_end, so `tidemark ops`, the peak's
// memory by op and the allocations' op context see the ops of a CPU job too.
//
// The allocation helpers an op calls (aten::empty, aten::empty_strided, ...) are left out inside
// another op, so a block is counted to the op that wanted it (aten::addmm, not aten::empty); at
// the top level they are ops like any other.
//
// Names are interned once per thread and name: a cache keyed by the name's pointer (an
// operator's name lives as long as the operator), checked against the text on every hit.
// Nothing here allocates per op once the names are known, and nothing throws into torch.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/record_function.h>

namespace {

using InternFn = uint32_t (*)(const char*);
using OpFn = void (*)(uint32_t);

std::atomic<InternFn> g_intern{nullptr};
std::atomic<OpFn> g_begin{nullptr};
std::atomic<OpFn> g_end{nullptr};
std::atomic<bool> g_on{false};
std::atomic<at::CallbackHandle> g_handle{at::INVALID_CALLBACK_HANDLE};

uint32_t nameId(const char* name) {
  if (name == nullptr) return 0;
  // name's pointer -> (its text when seen, its id): a pointer seen before with the same text (a
  // name freed and another made at its address is interned again).
  thread_local std::unordered_map<const char*, std::pair<std::string, uint32_t>> cache;
  auto it = cache.find(name);
  if (it != cache.end() && it->second.first == name) return it->second.second;
  const InternFn intern = g_intern.load(std::memory_order_acquire);
  const uint32_t id = intern != nullptr ? intern(name) : 0;
  if (id == 0) return 0;
  if (cache.size() > 65536) cache.clear();  // names made on the fly: bounded all the same
  cache[name] = {std::string(name), id};
  return id;
}

// Per thread, whether each op open now was reported (ends come in the reverse order of begins).
thread_local std::vector<uint8_t> t_reported;

bool isAllocationHelper(const char* name) { return std::strncmp(name, "aten::empty", 11) == 0; }

std::unique_ptr<at::ObserverContext> onEnter(const at::RecordFunction& fn) {
  try {
    const char* name = fn.name();
    bool report = g_on.load(std::memory_order_relaxed) && name != nullptr &&
                  !(!t_reported.empty() && isAllocationHelper(name));
    uint32_t id = report ? nameId(name) : 0;
    report = id != 0;
    if (report) g_begin.load(std::memory_order_relaxed)(id);
    t_reported.push_back(report ? 1 : 0);
  } catch (...) {
  }
  return nullptr;
}

void onExit(const at::RecordFunction& fn, at::ObserverContext* /*unused*/) {
  try {
    if (t_reported.empty()) return;  // begun before the callback was there
    const bool reported = t_reported.back() != 0;
    t_reported.pop_back();
    if (reported && g_on.load(std::memory_order_relaxed)) {
      if (const uint32_t id = nameId(fn.name())) g_end.load(std::memory_order_relaxed)(id);
    }
  } catch (...) {
  }
}

}  // namespace

extern "C" {

// Registers the op callback and turns the op scopes on. Returns 1 on now, 0 already on, -1 the
// agent's entry points are not in the process, -2 torch refused the callback.
__attribute__((visibility("default"))) int tidemark_torch_ops_install() {
  if (g_intern.load() == nullptr) {
    auto intern = reinterpret_cast<InternFn>(dlsym(RTLD_DEFAULT, "tidemark_intern"));
    auto begin = reinterpret_cast<OpFn>(dlsym(RTLD_DEFAULT, "tidemark_op_begin"));
    auto end = reinterpret_cast<OpFn>(dlsym(RTLD_DEFAULT, "tidemark_op_end"));
    if (intern == nullptr || begin == nullptr || end == nullptr) return -1;
    g_begin.store(begin);
    g_end.store(end);
    g_intern.store(intern, std::memory_order_release);
  }
  if (g_handle.load() != at::INVALID_CALLBACK_HANDLE) return 0;
  try {
    g_handle.store(at::addGlobalCallback(
        at::RecordFunctionCallback(&onEnter, &onExit).scopes({at::RecordScope::FUNCTION})));
  } catch (...) {
    return -2;
  }
  g_on.store(true);
  return 1;
}

// Takes the callback away (`tidemark detach`): torch builds no RecordFunction for tidemark any
// more. An op under way when it goes gets no end (its scope ends with the next one closed around
// it, or with the session).
__attribute__((visibility("default"))) void tidemark_torch_ops_remove() {
  g_on.store(false);
  const at::CallbackHandle handle = g_handle.exchange(at::INVALID_CALLBACK_HANDLE);
  if (handle == at::INVALID_CALLBACK_HANDLE) return;
  try {
    at::removeCallback(handle);
  } catch (...) {
  }
}

}  // extern "C"
