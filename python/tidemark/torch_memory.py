"""torch's tensor-level memory: every block torch's CUDA caching allocator hands out or takes back,
reported to the agent as it happens (``libtidemark_torch-<torch version>.so``,
agent/torch/memory_reporter.cpp).

The agent's CUPTI callbacks see the device memory the caching allocator reserves (its segments);
this sees the tensors inside them, so the server can count each tensor to its category and the
rest of the segments to ALLOCATOR_SLACK. The reporter is installed per thread (torch keeps it in
the thread's debug info; autograd's worker threads inherit it): on the thread that imports torch,
and on every thread at its first forward of a model.

``TIDEMARK_TORCH_MEMORY``: ``auto`` (default: when CUDA is available), ``off``, or ``all`` (CUPTI
or not, and CPU tensors too: they duplicate what the allocator hooks see; used by the tests).
"""
import ctypes
import os
import sys
import threading

def library_name(version):
    """The reporter built for torch `version` (one per torch: agent/CMakeLists.txt)."""
    return "libtidemark_torch-%s.so" % version


def find_library(version):
    """$TIDEMARK_TORCH_REPORTER, else the library for torch `version` beside the agent loaded in
    this process. A library built for another torch is never loaded: it would bring that torch's
    own libraries into the process."""
    path = os.environ.get("TIDEMARK_TORCH_REPORTER")
    if path:
        return path
    agent = _agent_file()
    if agent is None:
        return None
    candidate = os.path.join(os.path.dirname(agent), library_name(version))
    return candidate if os.path.exists(candidate) else None


def _agent_file():
    """The file of the agent loaded in this process, by the mapping that holds its code (it may
    be called otherwise than libtidemark_agent.so: `TIDEMARK_AGENT` can name a copy)."""
    try:
        import ctypes
        address = ctypes.cast(ctypes.CDLL(None).tidemark_abi_version, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6:
                    continue
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= address < high:
                    return fields[5].rstrip()
    except (OSError, ValueError):
        pass
    return None


def load_library(torch):
    """(the library built for the running torch, loaded, None) or (None, why not)."""
    path = find_library(torch.__version__)
    if path is None:
        return None, ("%s was not built (no headers of this torch where tidemark was built)"
                      % library_name(torch.__version__))
    try:
        lib = ctypes.CDLL(path)
        lib.tidemark_torch_built_for.restype = ctypes.c_char_p
        built_for = lib.tidemark_torch_built_for().decode()
    except (OSError, AttributeError) as exc:
        return None, "cannot load %s: %s" % (path, exc)
    if built_for != torch.__version__:
        return None, ("%s was built for torch %s, this job runs torch %s"
                      % (path, built_for, torch.__version__))
    return lib, None


class TensorMemory:
    """The reporter of one process; every method is a no-op when it is not available."""

    def __init__(self, mode=None):
        self.mode = (mode or os.environ.get("TIDEMARK_TORCH_MEMORY") or "auto").lower()
        self.lib = None
        self.status = "off"
        self.enabled = True
        if self.mode == "off":
            return
        import torch
        if self.mode == "auto" and not torch.cuda.is_available():
            self.status = "no CUDA"
            return
        lib, why = load_library(torch)
        if lib is None:
            self._unavailable(why)
            return
        lib.tidemark_torch_reporter_install.argtypes = [ctypes.c_int]
        lib.tidemark_torch_reporter_install.restype = ctypes.c_int
        lib.tidemark_torch_reporter_step_aside.restype = ctypes.c_int
        lib.tidemark_torch_reporter_enable.argtypes = [ctypes.c_int]
        lib.tidemark_torch_reporter_enable.restype = None
        self.lib = lib
        self.status = "ready"

    def _unavailable(self, why):
        self.status = why
        sys.stderr.write("tidemark: torch's tensor view is off: %s\n" % why)

    def install_here(self):
        """Installs the reporter on the calling thread. True when it reports here."""
        if self.lib is None:
            return False
        result = self.lib.tidemark_torch_reporter_install(1 if self.mode == "all" else 0)
        if result in (1, 2):
            self.status = "installed"
            if not self.enabled:
                self.lib.tidemark_torch_reporter_enable(0)
            return True
        if result == 0 and self.status != "busy":
            self.status = "busy"
            sys.stderr.write("tidemark: torch's tensor view is off on this thread: a torch "
                             "profiler is active on it\n")
        return False

    def make_way_for_profilers(self):
        """torch's profiler keeps its state where the reporter is, and torch 1.x refuses to start
        while any is there: the reporter steps aside on the thread that starts a profiler, and
        comes back when it stops (the profiler gets the memory reports meanwhile)."""
        if self.lib is None:
            return
        import torch.autograd.profiler as profiler
        enable = getattr(profiler, "_enable_profiler", None)
        disable = getattr(profiler, "_disable_profiler", None)
        if enable is None or disable is None or getattr(enable, "_tidemark", False):
            return
        lib = self.lib
        aside = threading.local()

        def tidemark_enable_profiler(*args, **kwargs):
            aside.was = lib.tidemark_torch_reporter_step_aside() == 1
            try:
                return enable(*args, **kwargs)
            except BaseException:
                self._come_back(aside)
                raise

        def tidemark_disable_profiler(*args, **kwargs):
            try:
                return disable(*args, **kwargs)
            finally:
                self._come_back(aside)

        tidemark_enable_profiler._tidemark = True
        profiler._enable_profiler = tidemark_enable_profiler
        profiler._disable_profiler = tidemark_disable_profiler

    def _come_back(self, aside):
        if getattr(aside, "was", False):
            aside.was = False
            self.install_here()

    def enable(self, on):
        """On or off in every thread (`tidemark detach` turns it off, `attach` on again)."""
        self.enabled = bool(on)
        if self.lib is not None:
            self.lib.tidemark_torch_reporter_enable(1 if on else 0)
