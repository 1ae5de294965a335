// The adapter's hottest hooks in native code (part of libtidemark_torch-<version>.so, built
// against each torch's own headers): the saved-tensor pack and unpack hooks, called for every
// tensor autograd saves for backward and every one it reads back, the storage of a tensor, and
// the agent's entry points the adapter calls for every module call and tag. In Python (through
// ctypes for the agent's calls) they cost a training step 2.3 ms of a dispatch-bound model's
// 5.8 (a GPU training's host side when its steps are launch-bound); see docs/adapter.md.
//
// They do what python/tidemark/adapter.py's Instrumenter._pack and _unpack do, reading the same
// state (the instrumenter's attributes: enabled, phases, the thread's module names, the step's
// saved storages), and hand every case they do not cover to those Python hooks, unchanged: a
// tensor of another type than torch.Tensor or torch.nn.Parameter (a subclass may define its
// storage otherwise), a low-precision tensor made by a copy (an autocast copy of a weight is
// named after the weight), the adapter disabled, a torch.compile under way, a backward moving on
// to another module's saved tensors, and any error. Nothing raises into torch from here but what
// the Python hooks would raise.
//
// The adapter makes them once per process (python/tidemark/native_hooks.py calls
// tidemark_python_hooks through ctypes.PyDLL, with the GIL held); every function runs with the
// GIL held, called by the interpreter.
#include <Python.h>
#include <dlfcn.h>

#include <cstdint>
#include <string>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

using TagFn = void (*)(uint64_t, uint64_t, int, uint32_t);
using ScopeFn = void (*)(uint32_t);
using PhaseFn = void (*)(int);

struct State {
  PyObject* inst = nullptr;           // the Instrumenter
  PyTypeObject* tensor = nullptr;     // torch.Tensor
  PyTypeObject* parameter = nullptr;  // torch.nn.Parameter
  PyObject* compiler = nullptr;       // torch.compiler's namespace (its flag), or null
  PyObject* pack = nullptr;           // the Python hooks and helpers the cases above go to
  PyObject* unpack = nullptr;
  PyObject* storageOf = nullptr;
  PyObject* savedNameId = nullptr;
  TagFn tag = nullptr;
  ScopeFn scopeBegin = nullptr, scopeEnd = nullptr;
  PhaseFn phaseBegin = nullptr, phaseEnd = nullptr;
  long activation = 0, recomputed = 0, input = 0;           // categories
  long forward = 0, eval = 0, backward = 0, recompute = 0;  // phases
  uint32_t target = 0;                                      // the name of a target's tag
  // Interned attribute names.
  PyObject *sEnabled = nullptr, *sLocal = nullptr, *sNames = nullptr, *sPhases = nullptr,
           *sSaved = nullptr, *sSavedNameIds = nullptr, *sBackwardModule = nullptr,
           *sIsParam = nullptr, *sCompilingFlag = nullptr, *empty = nullptr;
};

State g;  // one instrumenter a process; set once, under the GIL

// An attribute, or null without an error when it is not there.
PyObject* optionalAttr(PyObject* obj, PyObject* name) {
  PyObject* value = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  if (PyObject_GetOptionalAttr(obj, name, &value) < 0) PyErr_Clear();
#else
  if (_PyObject_LookupAttr(obj, name, &value) < 0) PyErr_Clear();
#endif
  return value;
}

// torch.compiler.is_compiling() outside code dynamo traces (whose calls never reach these
// builtins: dynamo cannot trace into them and the Python hooks decide there).
bool compiling() {
  if (g.compiler == nullptr) return false;
  PyObject* flag = PyDict_GetItemWithError(g.compiler, g.sCompilingFlag);  // borrowed
  if (flag == nullptr) {
    PyErr_Clear();
    return false;
  }
  return flag == Py_True;
}

bool inPhase(PyObject* phases, long phase) {
  if (!PyList_Check(phases)) return false;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(phases); ++i) {
    PyObject* p = PyList_GET_ITEM(phases, i);
    if (PyLong_Check(p) && PyLong_AsLong(p) == phase) return true;
  }
  return false;
}

// The interned name of what `module` saved ("<module>:saved"), from the adapter's cache.
bool savedNameId(PyObject* module, uint32_t* id) {
  PyObject* cache = PyObject_GetAttr(g.inst, g.sSavedNameIds);
  if (cache == nullptr) return false;
  PyObject* value = PyDict_Check(cache) ? PyDict_GetItemWithError(cache, module) : nullptr;
  Py_XINCREF(value);
  Py_DECREF(cache);
  if (value == nullptr) {
    if (PyErr_Occurred()) return false;
    value = PyObject_CallOneArg(g.savedNameId, module);
    if (value == nullptr) return false;
  }
  const unsigned long v = PyLong_AsUnsignedLong(value);
  Py_DECREF(value);
  if (v == static_cast<unsigned long>(-1) && PyErr_Occurred()) return false;
  *id = static_cast<uint32_t>(v);
  return true;
}

// The storage's address and size behind an exact torch.Tensor or Parameter; false (no error)
// for a tensor without storage.
bool storageOf(const at::Tensor& tensor, uint64_t* address, uint64_t* nbytes) {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const c10::Storage& storage = tensor.storage();
  *address = reinterpret_cast<uint64_t>(storage.data());
  *nbytes = static_cast<uint64_t>(storage.nbytes());
  return true;
}

bool exactTensor(PyObject* t) { return Py_TYPE(t) == g.tensor || Py_TYPE(t) == g.parameter; }

// Whether a low-precision tensor may be an autocast copy of a weight: a ToCopyBackward within
// three steps of its grad_fn through functions of one input (the Python hook's walk decides).
bool mayBeACast(const at::Tensor& tensor) {
  const c10::ScalarType type = tensor.scalar_type();
  if (type != c10::ScalarType::Half && type != c10::ScalarType::BFloat16) return false;
  torch::autograd::Node* fn = tensor.grad_fn().get();
  for (int i = 0; i < 3 && fn != nullptr; ++i) {
    if (fn->name().rfind("ToCopyBackward", 0) == 0) return true;
    torch::autograd::Node* next = nullptr;
    int inputs = 0;
    for (const torch::autograd::Edge& e : fn->next_edges()) {
      if (e.function) {
        ++inputs;
        next = e.function.get();
      }
    }
    if (inputs != 1) return false;
    fn = next;
  }
  return false;
}

// The Python hook for what is not covered here; its errors pass as they would.
PyObject* packInPython(PyObject* t) {
  PyErr_Clear();
  return PyObject_CallOneArg(g.pack, t);
}

PyObject* pack(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) return PyErr_Format(PyExc_TypeError, "pack takes one tensor");
  PyObject* t = args[0];
  if (compiling() || !exactTensor(t)) return packInPython(t);
  PyObject* enabled = PyObject_GetAttr(g.inst, g.sEnabled);
  if (enabled == nullptr) return packInPython(t);
  const int on = PyObject_IsTrue(enabled);
  Py_DECREF(enabled);
  if (on != 1) return packInPython(t);
  // The module whose forward saves it: the top of the thread's names.
  PyObject* module = nullptr;
  if (PyObject* local = PyObject_GetAttr(g.inst, g.sLocal)) {
    PyObject* names = optionalAttr(local, g.sNames);
    Py_DECREF(local);
    if (names != nullptr && PyList_Check(names) && PyList_GET_SIZE(names) > 0) {
      module = PyList_GET_ITEM(names, PyList_GET_SIZE(names) - 1);
      Py_INCREF(module);
    }
    Py_XDECREF(names);
  } else {
    return packInPython(t);
  }
  if (module == nullptr) {
    module = g.empty;
    Py_INCREF(module);
  }
  if (!PyUnicode_Check(module)) {
    Py_DECREF(module);
    return packInPython(t);
  }
  PyObject* packed = PyTuple_Pack(2, t, module);
  if (packed == nullptr) {
    Py_DECREF(module);
    return nullptr;
  }
  auto done = [&]() {
    Py_DECREF(module);
    return packed;
  };
  auto inPython = [&]() {
    Py_DECREF(module);
    Py_DECREF(packed);
    return packInPython(t);
  };
  if (Py_TYPE(t) == g.parameter) return done();           // a weight: tagged as one already
  if (PyObject* isParam = optionalAttr(t, g.sIsParam)) {  // torch 2's Parameter check
    const int param = PyObject_IsTrue(isParam);
    Py_DECREF(isParam);
    if (param != 0) return inPython();
  }
  if (PyErr_Occurred()) return inPython();
  uint64_t address = 0, nbytes = 0;
  try {
    const at::Tensor& tensor = THPVariable_Unpack(t);
    if (!storageOf(tensor, &address, &nbytes) || address == 0) return done();
    PyObject* phases = PyObject_GetAttr(g.inst, g.sPhases);
    if (phases == nullptr) return inPython();
    const bool recomputing = inPhase(phases, g.recompute);
    const bool inModel = inPhase(phases, g.forward) || inPhase(phases, g.eval);
    Py_DECREF(phases);
    uint32_t name = 0;
    if (recomputing) {
      if (!savedNameId(module, &name)) return inPython();
      g.tag(address, nbytes, static_cast<int>(g.recomputed), name);
      return done();
    }
    if (!tensor.grad_fn() && !tensor.requires_grad() && !inModel) {
      // Saved outside a model's forward, made by no differentiable computation: a target.
      g.tag(address, nbytes, static_cast<int>(g.input), g.target);
      return done();
    }
    if (mayBeACast(tensor)) return inPython();
    if (!savedNameId(module, &name)) return inPython();
    PyObject* saved = PyObject_GetAttr(g.inst, g.sSaved);
    if (saved == nullptr) return inPython();
    if (PyDict_Check(saved)) {
      // address -> a weak reference to the tensor saved (the adapter's _saved_now reads it).
      if (PyDict_GET_SIZE(saved) > 1000000) PyDict_Clear(saved);  // as the Python hook bounds it
      PyObject* key = PyLong_FromUnsignedLongLong(address);
      PyObject* ref = key == nullptr ? nullptr : PyWeakref_NewRef(t, nullptr);
      if (ref == nullptr || PyDict_SetItem(saved, key, ref) != 0) {
        Py_XDECREF(ref);
        Py_XDECREF(key);
        Py_DECREF(saved);
        return inPython();
      }
      Py_DECREF(ref);
      Py_DECREF(key);
    }
    Py_DECREF(saved);
    g.tag(address, nbytes, static_cast<int>(g.activation), name);
    return done();
  } catch (...) {
    return inPython();
  }
}

PyObject* unpack(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) return PyErr_Format(PyExc_TypeError, "unpack takes what pack returned");
  PyObject* packed = args[0];
  if (!PyTuple_CheckExact(packed) || PyTuple_GET_SIZE(packed) != 2) {
    return PyObject_CallOneArg(g.unpack, packed);
  }
  PyObject* t = PyTuple_GET_ITEM(packed, 0);
  PyObject* module = PyTuple_GET_ITEM(packed, 1);
  auto same = [&]() {
    Py_INCREF(t);
    return t;
  };
  if (compiling() || !PyUnicode_Check(module) || PyUnicode_GET_LENGTH(module) == 0) return same();
  // The common case: backward still reads the saved tensors of the module it read last.
  PyObject* current = PyObject_GetAttr(g.inst, g.sBackwardModule);
  if (current == nullptr) {
    PyErr_Clear();
    return PyObject_CallOneArg(g.unpack, packed);
  }
  const int equal = PyUnicode_Check(current) ? PyUnicode_Compare(module, current) == 0 : 0;
  Py_DECREF(current);
  if (PyErr_Occurred()) PyErr_Clear();
  if (equal) return same();
  return PyObject_CallOneArg(g.unpack, packed);  // backward moves on (or not in backward): Python's
}

PyObject* storageOfTensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) return PyErr_Format(PyExc_TypeError, "storage_of takes one tensor");
  PyObject* t = args[0];
  if (!exactTensor(t)) return PyObject_CallOneArg(g.storageOf, t);
  uint64_t address = 0, nbytes = 0;
  try {
    if (!storageOf(THPVariable_Unpack(t), &address, &nbytes))
      return PyObject_CallOneArg(g.storageOf, t);  // its error
  } catch (...) {
    return PyObject_CallOneArg(g.storageOf, t);
  }
  return Py_BuildValue("(KK)", static_cast<unsigned long long>(address),
                       static_cast<unsigned long long>(nbytes));
}

bool unsignedArg(PyObject* arg, unsigned long long* v) {
  *v = PyLong_AsUnsignedLongLong(arg);
  return !(*v == static_cast<unsigned long long>(-1) && PyErr_Occurred());
}

bool signedArg(PyObject* arg, long* v) {
  *v = PyLong_AsLong(arg);
  return !(*v == -1 && PyErr_Occurred());
}

PyObject* tag(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  unsigned long long address = 0, nbytes = 0, name = 0;
  long category = 0;
  if (nargs != 4 || !unsignedArg(args[0], &address) || !unsignedArg(args[1], &nbytes) ||
      !signedArg(args[2], &category) || !unsignedArg(args[3], &name)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tag(address, nbytes, category, name)");
    return nullptr;
  }
  g.tag(address, nbytes, static_cast<int>(category), static_cast<uint32_t>(name));
  Py_RETURN_NONE;
}

template <ScopeFn State::*fn>
PyObject* scope(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  unsigned long long id = 0;
  if (nargs != 1 || !unsignedArg(args[0], &id)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "takes a name's id");
    return nullptr;
  }
  (g.*fn)(static_cast<uint32_t>(id));
  Py_RETURN_NONE;
}

template <PhaseFn State::*fn>
PyObject* phase(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long p = 0;
  if (nargs != 1 || !signedArg(args[0], &p)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "takes a phase");
    return nullptr;
  }
  (g.*fn)(static_cast<int>(p));
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"pack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pack)), METH_FASTCALL,
     nullptr},
    {"unpack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(unpack)), METH_FASTCALL,
     nullptr},
    {"storage_of", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(storageOfTensor)),
     METH_FASTCALL, nullptr},
    {"tag", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tag)), METH_FASTCALL,
     nullptr},
    {"scope_begin",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(scope<&State::scopeBegin>)),
     METH_FASTCALL, nullptr},
    {"scope_end",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(scope<&State::scopeEnd>)),
     METH_FASTCALL, nullptr},
    {"phase_begin",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(phase<&State::phaseBegin>)),
     METH_FASTCALL, nullptr},
    {"phase_end",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(phase<&State::phaseEnd>)),
     METH_FASTCALL, nullptr},
};

// An item of the configuration, a new reference (an error set when missing).
PyObject* item(PyObject* config, const char* key) {
  PyObject* value = PyDict_GetItemString(config, key);  // borrowed
  if (value == nullptr) {
    PyErr_Format(PyExc_KeyError, "tidemark native hooks: no '%s'", key);
    return nullptr;
  }
  Py_INCREF(value);
  return value;
}

bool longItem(PyObject* config, const char* key, long* out) {
  PyObject* value = item(config, key);
  if (value == nullptr) return false;
  *out = PyLong_AsLong(value);
  Py_DECREF(value);
  return !(*out == -1 && PyErr_Occurred());
}

}  // namespace

// The native hooks for the instrumenter `config["instrumenter"]`, as a dict of builtins (pack,
// unpack, storage_of, tag, scope_begin, scope_end, phase_begin, phase_end); None when the agent
// is not in the process. config: the instrumenter, torch.Tensor, torch.nn.Parameter, torch.
// compiler's namespace (a dict, or None), the Python hooks and helpers (pack, unpack,
// storage_of, saved_name_id) and the numbers of the categories, phases and the target's name.
// Called once per process, with the GIL (ctypes.PyDLL); an error is raised as a Python error.
extern "C" __attribute__((visibility("default"))) PyObject* tidemark_python_hooks(
    PyObject* config) {
  if (!PyDict_Check(config)) {
    PyErr_SetString(PyExc_TypeError, "tidemark native hooks: the configuration is a dict");
    return nullptr;
  }
  auto tagFn = reinterpret_cast<TagFn>(dlsym(RTLD_DEFAULT, "tidemark_tag"));
  auto begin = reinterpret_cast<ScopeFn>(dlsym(RTLD_DEFAULT, "tidemark_scope_begin"));
  auto end = reinterpret_cast<ScopeFn>(dlsym(RTLD_DEFAULT, "tidemark_scope_end"));
  auto phaseBegin = reinterpret_cast<PhaseFn>(dlsym(RTLD_DEFAULT, "tidemark_phase_begin"));
  auto phaseEnd = reinterpret_cast<PhaseFn>(dlsym(RTLD_DEFAULT, "tidemark_phase_end"));
  if (tagFn == nullptr || begin == nullptr || end == nullptr || phaseBegin == nullptr ||
      phaseEnd == nullptr) {
    Py_RETURN_NONE;
  }
  State s;
  long target = 0;
  s.inst = item(config, "instrumenter");
  PyObject* tensor = item(config, "tensor");
  PyObject* parameter = item(config, "parameter");
  s.compiler = item(config, "compiler");
  s.pack = item(config, "pack");
  s.unpack = item(config, "unpack");
  s.storageOf = item(config, "storage_of");
  s.savedNameId = item(config, "saved_name_id");
  if (s.inst == nullptr || tensor == nullptr || parameter == nullptr || s.compiler == nullptr ||
      s.pack == nullptr || s.unpack == nullptr || s.storageOf == nullptr ||
      s.savedNameId == nullptr || !longItem(config, "ACTIVATION", &s.activation) ||
      !longItem(config, "RECOMPUTED", &s.recomputed) || !longItem(config, "INPUT", &s.input) ||
      !longItem(config, "FORWARD", &s.forward) || !longItem(config, "EVAL", &s.eval) ||
      !longItem(config, "BACKWARD", &s.backward) || !longItem(config, "RECOMPUTE", &s.recompute) ||
      !longItem(config, "target", &target)) {
    return nullptr;  // (a reference or two kept for the process's life: this is an error path)
  }
  if (!PyType_Check(tensor) || !PyType_Check(parameter)) {
    PyErr_SetString(PyExc_TypeError, "tidemark native hooks: tensor and parameter are types");
    return nullptr;
  }
  s.tensor = reinterpret_cast<PyTypeObject*>(tensor);
  s.parameter = reinterpret_cast<PyTypeObject*>(parameter);
  if (s.compiler == Py_None) {
    Py_DECREF(s.compiler);
    s.compiler = nullptr;
  } else if (!PyDict_Check(s.compiler)) {
    PyErr_SetString(PyExc_TypeError, "tidemark native hooks: compiler is a namespace dict");
    return nullptr;
  }
  s.target = static_cast<uint32_t>(target);
  s.tag = tagFn;
  s.scopeBegin = begin;
  s.scopeEnd = end;
  s.phaseBegin = phaseBegin;
  s.phaseEnd = phaseEnd;
  s.sEnabled = PyUnicode_InternFromString("enabled");
  s.sLocal = PyUnicode_InternFromString("local");
  s.sNames = PyUnicode_InternFromString("names");
  s.sPhases = PyUnicode_InternFromString("phases");
  s.sSaved = PyUnicode_InternFromString("saved_this_step");
  s.sSavedNameIds = PyUnicode_InternFromString("saved_name_ids");
  s.sBackwardModule = PyUnicode_InternFromString("backward_module");
  s.sIsParam = PyUnicode_InternFromString("_is_param");
  s.sCompilingFlag = PyUnicode_InternFromString("_is_compiling_flag");
  s.empty = PyUnicode_FromString("");
  if (s.empty == nullptr || s.sCompilingFlag == nullptr || s.sIsParam == nullptr) return nullptr;
  // A second instrumenter in the process (installed again): the first's references are kept
  // (builtins made for it may still be held).
  g = s;
  PyObject* out = PyDict_New();
  if (out == nullptr) return nullptr;
  for (PyMethodDef& def : g_methods) {
    PyObject* fn = PyCFunction_New(&def, nullptr);
    if (fn == nullptr || PyDict_SetItemString(out, def.ml_name, fn) != 0) {
      Py_XDECREF(fn);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(fn);
  }
  return out;
}
