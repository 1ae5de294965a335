"""The adapter's hottest hooks in native code (agent/torch/python_hooks.cpp, part of
``libtidemark_torch-<torch version>.so``): the saved-tensor pack and unpack hooks, the storage of a
tensor, and the agent's entry points called for every module call and tag, as builtins that do
what the adapter's Python does and hand it every case they do not cover.

``TIDEMARK_NATIVE_HOOKS=0`` keeps them all in Python (the same records, at the Python cost: the
bench compares the two). They are not used on a torch whose compile state cannot be read natively
(2.0 to 2.2).
"""
import ctypes
import os

from . import _agent as A
from .torch_memory import load_library


def _compiler_namespace(torch):
    """(torch.compiler's namespace, whose _is_compiling_flag is what is_compiling() reads outside
    traced code; None on a torch that compiles nothing), or (None, why not usable)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "_is_compiling_flag"):
        return vars(compiler), None
    if not hasattr(torch, "compile"):
        return None, None  # torch 1.x
    return None, "torch %s keeps its compile state where native code cannot read it" % (
        torch.__version__)


def load(instrumenter, torch, storage_of_in_python):
    """(a dict of builtins: pack, unpack, storage_of, tag, scope_begin, scope_end, phase_begin,
    phase_end; None) or (None, why not)."""
    if os.environ.get("TIDEMARK_NATIVE_HOOKS", "1") == "0":
        return None, "TIDEMARK_NATIVE_HOOKS=0"
    namespace, why = _compiler_namespace(torch)
    if why:
        return None, why
    lib, why = load_library(torch)
    if lib is None:
        return None, why
    try:
        make = getattr(ctypes.PyDLL(lib._name), "tidemark_python_hooks")
    except (OSError, AttributeError):
        return None, "%s was built without them (no Python or pybind11 headers)" % lib._name
    make.argtypes = [ctypes.py_object]
    make.restype = ctypes.py_object
    config = {
        "instrumenter": instrumenter,
        "tensor": torch.Tensor,
        "parameter": torch.nn.Parameter,
        "compiler": namespace,
        "pack": instrumenter._pack,
        "unpack": instrumenter._unpack,
        "storage_of": storage_of_in_python,
        "saved_name_id": instrumenter._saved_name_id,
        "target": instrumenter.agent.intern("target"),
        "ACTIVATION": A.ACTIVATION, "RECOMPUTED": A.RECOMPUTED, "INPUT": A.INPUT,
        "FORWARD": A.FORWARD, "EVAL": A.EVAL, "BACKWARD": A.BACKWARD, "RECOMPUTE": A.RECOMPUTE,
    }
    try:
        hooks = make(config)
    except Exception as exc:  # noqa: BLE001 - the Python hooks stay
        return None, "cannot make them: %s" % exc
    if hooks is None:
        return None, "the agent is not in this process"
    return hooks, None
