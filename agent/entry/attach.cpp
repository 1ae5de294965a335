// `tidemark attach` entry points. The injector stops one thread of the target and makes it call
// tidemark_attach (or tidemark_detach); that call only starts a thread of the agent and returns,
// so the stopped thread is released at once. The thread does the work: loads the agent, points
// the GOT entries of the loaded objects at the allocator hooks, opens a session, and, in a
// CPython process, starts the adapter under the GIL (tidemark.attach.start()), which finds the
// models and optimizers and seeds what was allocated before the attach. Progress goes into
// tidemark_attach_status, which the injector reads from outside.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>

#include "agent/agent.h"
#include "agent/entry/cuda_entry.h"
#include "agent/hooks/allocator_hooks.h"
#include "agent/hooks/got_patcher.h"
#include "tidemark/attach_status.h"

#define TIDEMARK_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" {
__attribute__((visibility("default"))) struct tidemark_attach_status_t tidemark_attach_status = {};
}

namespace tidemark::agent {
namespace {

char g_config[4096];  // written by the entry (on the target's thread), read by the agent's
GotPatcher g_got;

void setMessage(const std::string& m) {
  std::snprintf(tidemark_attach_status.message, sizeof tidemark_attach_status.message, "%s",
                m.c_str());
}

void finish(int32_t state) {
  tidemark_attach_status.state = state;
  __atomic_add_fetch(&tidemark_attach_status.generation, 1, __ATOMIC_SEQ_CST);
}

// "key=value" lines.
std::string configValue(const std::string& config, const std::string& key) {
  size_t pos = 0;
  while (pos < config.size()) {
    const size_t end = config.find('\n', pos);
    const std::string line = config.substr(pos, end == std::string::npos ? end : end - pos);
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return {};
}

// The CPython C API, looked up in the process (a python3 executable exports it); nullptr where
// this process is not a running CPython.
struct PythonApi {
  int (*isInitialized)();
  int (*gilEnsure)();
  void (*gilRelease)(int);
  int (*runString)(const char*);
  void* (*importModule)(const char*);
  void* (*getAttr)(void*, const char*);
  int (*setAttr)(void*, const char*, void*);
  void* (*callObject)(void*, void*);
  long (*listSize)(void*);
  void* (*listItem)(void*, long);  // borrowed
  void* (*typeOf)(void*);
  int (*isSubtype)(void*, void*);
  void* (*newList)(long);
  int (*append)(void*, void*);
  void (*decRef)(void*);
  void* (*moduleDict)();
  void* (*dictGet)(void*, const char*);  // borrowed
  void (*clearError)();
};

const PythonApi* pythonApi() {
  static PythonApi api;
  static const PythonApi* found = []() -> const PythonApi* {
    bool ok = true;
    auto bind = [&ok](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(RTLD_DEFAULT, name));
      ok = ok && *fn != nullptr;
    };
    bind(&api.isInitialized, "Py_IsInitialized");
    bind(&api.gilEnsure, "PyGILState_Ensure");
    bind(&api.gilRelease, "PyGILState_Release");
    bind(&api.runString, "PyRun_SimpleString");
    bind(&api.importModule, "PyImport_ImportModule");
    bind(&api.getAttr, "PyObject_GetAttrString");
    bind(&api.setAttr, "PyObject_SetAttrString");
    bind(&api.callObject, "PyObject_CallObject");
    bind(&api.listSize, "PyList_Size");
    bind(&api.listItem, "PyList_GetItem");
    bind(&api.typeOf, "PyObject_Type");
    bind(&api.isSubtype, "PyType_IsSubtype");
    bind(&api.newList, "PyList_New");
    bind(&api.append, "PyList_Append");
    bind(&api.decRef, "Py_DecRef");
    bind(&api.moduleDict, "PyImport_GetModuleDict");
    bind(&api.dictGet, "PyDict_GetItemString");
    bind(&api.clearError, "PyErr_Clear");
    return ok ? &api : nullptr;
  }();
  return found != nullptr && found->isInitialized() != 0 ? found : nullptr;
}

// Finds the live torch.nn.Module and torch.optim.Optimizer objects for the adapter, in C, under
// the GIL, and leaves them in tidemark.attach._scanned. In C because Python code could give up the
// GIL in the middle of a scan of gc.get_objects(), and torch warns when a tensor's C++ side dies
// while a reference it does not know about (such a scan's) keeps its Python object alive. Only
// once torch is imported; returns false otherwise (the adapter then instruments torch on import).
bool scanForModels(const PythonApi& py) {
  if (py.dictGet(py.moduleDict(), "torch") == nullptr) return false;  // torch not imported yet
  void* nn = py.importModule("torch.nn");
  void* optim = py.importModule("torch.optim");
  void* gc = py.importModule("gc");
  void* attach = py.importModule("tidemark.attach");
  void* moduleType = nn ? py.getAttr(nn, "Module") : nullptr;
  void* optimizerType = optim ? py.getAttr(optim, "Optimizer") : nullptr;
  void* getObjects = gc ? py.getAttr(gc, "get_objects") : nullptr;
  bool ok = false;
  if (moduleType && optimizerType && getObjects && attach) {
    void* all = py.callObject(getObjects, nullptr);
    void* found = py.newList(0);
    if (all != nullptr && found != nullptr) {
      const long n = py.listSize(all);
      for (long i = 0; i < n; ++i) {
        void* o = py.listItem(all, i);
        void* t = py.typeOf(o);
        if (t != nullptr && (py.isSubtype(t, moduleType) || py.isSubtype(t, optimizerType)))
          py.append(found, o);
        if (t != nullptr) py.decRef(t);
      }
      ok = py.setAttr(attach, "_scanned", found) == 0;
    }
    if (all != nullptr) py.decRef(all);  // every other object let go before the GIL is
    if (found != nullptr) py.decRef(found);
  }
  for (void* o : {nn, optim, gc, attach, moduleType, optimizerType, getObjects})
    if (o != nullptr) py.decRef(o);
  if (!ok) py.clearError();
  return ok;
}

// Under the GIL: puts `dir` on sys.path and imports tidemark.attach, scans for models if asked,
// then calls tidemark.attach.<call>. -1: no CPython here; else PyRun_SimpleString's result.
int runAdapter(const std::string& dir, const std::string& call, bool scan) {
  const PythonApi* py = pythonApi();
  if (py == nullptr) return -1;
  std::string quoted;
  for (char c : dir) {
    if (c == '\\' || c == '\'') quoted += '\\';
    quoted += c;
  }
  const std::string setup = "import sys\nif '" + quoted +
                            "' not in sys.path:\n    sys.path.insert(0, '" + quoted +
                            "')\nimport tidemark.attach\n";
  const int gil = py->gilEnsure();
  int rc = py->runString(setup.c_str());
  if (rc == 0 && scan) scanForModels(*py);
  if (rc == 0) rc = py->runString(("tidemark.attach." + call + "\n").c_str());
  py->gilRelease(gil);
  return rc;
}

void blockSignals() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, nullptr);
}

void* attachThread(void*) {
  blockSignals();  // the job's signals stay with the job's threads
  RecursionGuard guard;
  const std::string config(g_config);
  AgentConfig c = AgentConfig::fromEnvironment();
  if (std::string v = configValue(config, "server"); !v.empty()) c.server = v;
  if (std::string v = configValue(config, "token"); !v.empty()) c.token = v;
  if (std::string v = configValue(config, "tls_ca"); !v.empty()) c.tlsCa = v;
  if (std::string v = configValue(config, "tls_cert"); !v.empty()) c.tlsCert = v;
  if (std::string v = configValue(config, "tls_key"); !v.empty()) c.tlsKey = v;
  c.sessionName = configValue(config, "name");
  c.quiet = configValue(config, "quiet") == "1";
  c.setSchedule(configValue(config, "capture_steps"), configValue(config, "capture_every"),
                configValue(config, "capture_window"));
  Agent& agent = Agent::instance();
  if (!agent.attach(c)) {
    setMessage("the agent could not map its buffers");
    finish(TIDEMARK_ATTACH_FAILED);
    return nullptr;
  }
  // `free` first, in every object, then `realloc` (which frees too), then what allocates: a
  // block allocated through a patched entry is then always freed (or moved) through a patched
  // one. The job runs on while the entries are written; were an object's posix_memalign patched
  // before its free (or another object's), a block allocated and freed in between would lose its
  // free and stay live in the recording.
  size_t patched = g_got.patchAll({{"free", reinterpret_cast<void*>(&hooks::free)}});
  patched += g_got.patchAll({{"realloc", reinterpret_cast<void*>(&hooks::realloc)}});
  patched += g_got.patchAll({{"posix_memalign", reinterpret_cast<void*>(&hooks::posixMemalign)},
                             {"aligned_alloc", reinterpret_cast<void*>(&hooks::alignedAlloc)},
                             {"memalign", reinterpret_cast<void*>(&hooks::memalign)},
                             {"valloc", reinterpret_cast<void*>(&hooks::valloc)}});
  tidemark_attach_status.patched_entries = g_got.patches().size();
  std::string message = "patched " + std::to_string(patched) + " GOT entries in " +
                        std::to_string(g_got.objects().size()) + " objects";
#ifdef TIDEMARK_HAVE_CUPTI
  message += "; " + startGpuCaptureOnAttach(agent);
#endif
  const std::string pythonDir = configValue(config, "python");
  const int py =
      pythonDir.empty() || configValue(config, "adapter") == "0"
          ? -1
          : runAdapter(pythonDir, configValue(config, "ops") == "1" ? "start(ops=True)" : "start()",
                       /*scan=*/true);
  tidemark_attach_status.python = py == 0 ? 1 : 0;
  if (py > 0 || py < -1) message += "; the Python adapter did not start (see the job's stderr)";
  if (py == 0) message += "; the Python adapter started";
  // The session id arrives with the server's answer to the handshake: waited for up to 20 s (5 s,
  // the bound before, is suspected of a missed id on a loaded machine; `tidemark attach` waits
  // 60 s for this report by default).
  for (int i = 0; i < 2000 && agent.sessionId() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  tidemark_attach_status.session_id = agent.sessionId();
  if (agent.sessionId() == 0) message += "; no answer from tidemarkd at " + c.server + " yet";
  setMessage(message);
  finish(TIDEMARK_ATTACH_RECORDING);
  return nullptr;
}

void* detachThread(void*) {
  blockSignals();
  RecursionGuard guard;
  const std::string config(g_config);
  const std::string pythonDir = configValue(config, "python");
  if (tidemark_attach_status.python != 0 && !pythonDir.empty())
    runAdapter(pythonDir, "stop()", /*scan=*/false);
  g_got.restore();
#ifdef TIDEMARK_HAVE_CUPTI
  stopGpuCaptureOnDetach(1000);
#endif
  Agent::instance().detach();
  setMessage("detached; the agent stays loaded and records nothing");
  finish(TIDEMARK_ATTACH_DORMANT);
  return nullptr;
}

int spawn(void* (*body)(void*), int32_t state) {
  tidemark_attach_status.state = state;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, body, nullptr);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    setMessage(std::string("could not start the agent's thread: ") + std::strerror(rc));
    finish(TIDEMARK_ATTACH_FAILED);
    return -1;
  }
  return 0;
}

}  // namespace

void markPreloaded(bool on) {
  tidemark_attach_status.state = on ? TIDEMARK_ATTACH_PRELOADED : TIDEMARK_ATTACH_NONE;
}

}  // namespace tidemark::agent

using tidemark::agent::g_config;

// Called on a thread the injector stopped: copies the configuration and starts the attach
// thread. 0 started; 1 busy (attached, or an attach or detach under way); -1 failed.
TIDEMARK_EXPORT int tidemark_attach(const char* config) {
  const int32_t s = tidemark_attach_status.state;
  if (s != TIDEMARK_ATTACH_NONE && s != TIDEMARK_ATTACH_DORMANT && s != TIDEMARK_ATTACH_FAILED)
    return 1;
  std::snprintf(g_config, sizeof g_config, "%s", config != nullptr ? config : "");
  tidemark_attach_status.session_id = 0;
  tidemark_attach_status.message[0] = '\0';
  return tidemark::agent::spawn(&tidemark::agent::attachThread, TIDEMARK_ATTACH_STARTING);
}

// Called on a thread the injector stopped: starts the detach thread. 0 started; 1 not attached.
TIDEMARK_EXPORT int tidemark_detach(void) {
  if (tidemark_attach_status.state != TIDEMARK_ATTACH_RECORDING) return 1;
  return tidemark::agent::spawn(&tidemark::agent::detachThread, TIDEMARK_ATTACH_STOPPING);
}
