#include "agent/python/python_stacks.h"

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/recorder/recorder.h"
#include "agent/transport/interner.h"

namespace tidemark::agent::python_stacks {
namespace {

// The interpreter's C API (CPython >= 3.9), as the process has it; objects are opaque here.
using ProfileFn = int (*)(void* obj, void* frame, int what, void* arg);
struct Api {
  void (*setProfile)(ProfileFn, void*) = nullptr;  // PyEval_SetProfile
  void* (*currentFrame)() = nullptr;               // PyEval_GetFrame: borrowed
  void* (*frameBack)(void*) = nullptr;             // PyFrame_GetBack: new reference
  void* (*frameCode)(void*) = nullptr;             // PyFrame_GetCode: new reference
  int (*frameLine)(void*) = nullptr;               // PyFrame_GetLineNumber
  void* (*getAttr)(void*, const char*) = nullptr;  // PyObject_GetAttrString: new reference
  const char* (*utf8)(void*) = nullptr;            // PyUnicode_AsUTF8
  void (*errClear)() = nullptr;                    // PyErr_Clear
  void (*decRef)(void*) = nullptr;                 // Py_DecRef
  int (*gilHeld)() = nullptr;                      // PyGILState_Check
};

// PyTrace_* (Include/cpython/pystate.h): the events a profile function gets.
constexpr int kCall = 0, kReturn = 3, kCCall = 4;
// At most this many frames, innermost first, in one stack.
constexpr size_t kMaxFrames = 64;
// Code objects named at most (each kept alive so that its address is never another's).
constexpr size_t kMaxCodes = 100000;

Api g_api;
std::atomic<bool> g_resolved{false};
std::atomic<uint64_t> g_minBytes{0};
Interner* g_interner = nullptr;

// Per code object, "qualified name (file" (the line is added per stack), and whether it is the
// adapter's own (its frames are left out of stacks: the job's code is what they are for).
// Touched only with the GIL held (profile events, followThisThread); labels are never freed, so
// a shadow entry may point at one from any thread.
struct Label {
  std::string text;
  bool hidden = false;
};
std::unordered_map<void*, const Label*>* g_labels = nullptr;
const Label* const g_unnamed = new Label{"<code> (?", false};
std::string* g_hiddenPrefix = nullptr;  // the adapter's package directory

struct Entry {
  const void* frame;  // compared, never read: the frame may be gone when the entry is stale
  const Label* label;
  int line;
};
struct Shadow {
  std::vector<Entry> frames;
};
// Trivially initialized: an allocation hook reads it without running a TLS constructor.
thread_local Shadow* t_shadow __attribute__((tls_model("initial-exec"))) = nullptr;

template <typename F>
bool resolve(F*& out, const char* name) {
  out = reinterpret_cast<F*>(dlsym(RTLD_DEFAULT, name));
  return out != nullptr;
}

bool resolveApi() {
  if (g_resolved.load(std::memory_order_acquire)) return true;
  Api a;
  const bool all =
      resolve(a.setProfile, "PyEval_SetProfile") && resolve(a.currentFrame, "PyEval_GetFrame") &&
      resolve(a.frameBack, "PyFrame_GetBack") && resolve(a.frameCode, "PyFrame_GetCode") &&
      resolve(a.frameLine, "PyFrame_GetLineNumber") &&
      resolve(a.getAttr, "PyObject_GetAttrString") && resolve(a.utf8, "PyUnicode_AsUTF8") &&
      resolve(a.errClear, "PyErr_Clear") && resolve(a.decRef, "Py_DecRef") &&
      resolve(a.gilHeld, "PyGILState_Check");
  if (!all) return false;
  g_api = a;
  g_resolved.store(true, std::memory_order_release);
  return true;
}

// A string attribute of obj, or "" (the error cleared).
std::string textAttr(void* obj, const char* name) {
  void* value = g_api.getAttr(obj, name);
  if (value == nullptr) {
    g_api.errClear();
    return {};
  }
  const char* text = g_api.utf8(value);
  std::string out = text != nullptr ? text : "";
  if (text == nullptr) g_api.errClear();
  g_api.decRef(value);
  return out;
}

// The label of frame's code (GIL held).
const Label* labelOf(void* frame) {
  void* code = g_api.frameCode(frame);
  if (code == nullptr) return g_unnamed;
  if (g_labels == nullptr) g_labels = new std::unordered_map<void*, const Label*>();
  if (auto it = g_labels->find(code); it != g_labels->end()) {
    g_api.decRef(code);
    return it->second;
  }
  if (g_labels->size() >= kMaxCodes) {
    g_api.decRef(code);
    return g_unnamed;
  }
  std::string name = textAttr(code, "co_qualname");  // 3.11; co_name before
  if (name.empty()) name = textAttr(code, "co_name");
  const std::string file = textAttr(code, "co_filename");
  const bool hidden = g_hiddenPrefix != nullptr && !g_hiddenPrefix->empty() &&
                      file.compare(0, g_hiddenPrefix->size(), *g_hiddenPrefix) == 0;
  const auto* label =
      new Label{(name.empty() ? "<code>" : name) + " (" + (file.empty() ? "?" : file), hidden};
  g_labels->emplace(code, label);  // the new reference kept: the code object stays
  return label;
}

Shadow& shadow() {
  if (t_shadow == nullptr) {
    t_shadow = new Shadow();
    t_shadow->frames.reserve(256);
  }
  return *t_shadow;
}

// Where frame is among the top few entries (returns missed, e.g. while the profile was off),
// or -1.
long findNear(const std::vector<Entry>& frames, const void* frame) {
  constexpr size_t kLookDown = 16;
  for (size_t i = frames.size(), seen = 0; i > 0 && seen < kLookDown; --i, ++seen) {
    if (frames[i - 1].frame == frame) return static_cast<long>(i - 1);
  }
  return -1;
}

int onEvent(void*, void* frame, int what, void*) {
  // Not recording (a forked child: a DataLoader's worker): nothing to keep.
  if (frame == nullptr || !Recorder::instance().recording()) return 0;
  RecursionGuard guard;  // what this allocates is the agent's, not the job's
  try {
    std::vector<Entry>& frames = shadow().frames;
    if (what == kCall) {
      // The caller's line now; entries above it (returns missed) go.
      if (void* back = g_api.frameBack(frame); back != nullptr) {
        if (const long at = findNear(frames, back); at >= 0) {
          frames.resize(static_cast<size_t>(at) + 1);
          frames.back().line = g_api.frameLine(back);
        }
        g_api.decRef(back);
      }
      frames.push_back({frame, labelOf(frame), g_api.frameLine(frame)});
    } else if (what == kReturn) {
      if (const long at = findNear(frames, frame); at >= 0) frames.resize(static_cast<size_t>(at));
    } else if (what == kCCall) {
      if (!frames.empty() && frames.back().frame == frame)
        frames.back().line = g_api.frameLine(frame);
    }
  } catch (...) {
    // Out of memory in the agent: the stack stays as it was; the job goes on.
  }
  return 0;
}

}  // namespace

void configure(uint64_t minBytes, Interner* interner) noexcept {
  g_interner = interner;
  g_minBytes.store(minBytes, std::memory_order_release);
}

uint64_t minBytes() noexcept { return g_minBytes.load(std::memory_order_acquire); }

int followThisThread(const char* hiddenPrefix) noexcept {
  if (minBytes() == 0 || g_interner == nullptr) return 0;
  if (!resolveApi() || g_api.gilHeld() != 1) return -1;
  RecursionGuard guard;
  try {
    if (hiddenPrefix != nullptr && g_hiddenPrefix == nullptr)
      g_hiddenPrefix = new std::string(hiddenPrefix);
    // The frames the thread is in now, outermost first.
    std::vector<Entry> now;
    void* frame = g_api.currentFrame();
    void* owned = nullptr;  // a reference to release once past it
    while (frame != nullptr && now.size() < 4096) {
      now.push_back({frame, labelOf(frame), g_api.frameLine(frame)});
      void* back = g_api.frameBack(frame);
      if (owned != nullptr) g_api.decRef(owned);
      owned = back;
      frame = back;
    }
    if (owned != nullptr) g_api.decRef(owned);
    std::vector<Entry>& frames = shadow().frames;
    frames.assign(now.rbegin(), now.rend());
  } catch (...) {
    return -1;
  }
  g_api.setProfile(&onEvent, nullptr);
  return 1;
}

uint32_t stackOfThisThread() noexcept {
  const Shadow* s = t_shadow;
  if (s == nullptr || s->frames.empty() || g_interner == nullptr) return 0;
  try {
    std::string text;
    text.reserve(96 * std::min(s->frames.size(), kMaxFrames));
    size_t n = 0;
    for (auto it = s->frames.rbegin(); it != s->frames.rend() && n < kMaxFrames; ++it) {
      if (it->label->hidden) continue;
      if (n++ > 0) text += '\n';
      text += it->label->text;
      text += ':';
      text += std::to_string(it->line);
      text += ')';
    }
    return n > 0 ? g_interner->intern(text) : 0;
  } catch (...) {
    return 0;
  }
}

}  // namespace tidemark::agent::python_stacks
