"""ctypes binding to the agent's C ABI (agent/include/tidemark/agent_api.h).

The agent is found among the libraries already loaded in the process (``tidemark run`` preloads
it). When it is absent every call is a no-op, so an instrumented script runs unchanged without
tidemark.
"""
import ctypes

# tidemark.v1.Category
WEIGHT = 1
GRADIENT = 2
OPTIMIZER_STATE = 3
ACTIVATION = 4
CHECKPOINT_INPUT = 5
RECOMPUTED = 6
INPUT = 7
TEMPORARY = 8

# tidemark.v1.Phase
FORWARD = 1
BACKWARD = 2
RECOMPUTE = 3
OPTIMIZER = 4
EVAL = 5

ABI_VERSION = 1


class Agent:
    """The agent's entry points, or no-ops when the agent is not loaded in this process."""

    def __init__(self):
        self.lib = None
        try:
            lib = ctypes.CDLL(None)
            version = lib.tidemark_abi_version
        except (OSError, AttributeError):
            return
        version.restype = ctypes.c_int
        if version() != ABI_VERSION:
            return
        lib.tidemark_agent_start.restype = ctypes.c_int
        lib.tidemark_recording.restype = ctypes.c_int
        lib.tidemark_flush.argtypes = [ctypes.c_int]
        lib.tidemark_flush.restype = ctypes.c_int
        lib.tidemark_session_id.restype = ctypes.c_uint64
        lib.tidemark_intern.argtypes = [ctypes.c_char_p]
        lib.tidemark_intern.restype = ctypes.c_uint32
        for name in ("tidemark_scope_begin", "tidemark_scope_end"):
            getattr(lib, name).argtypes = [ctypes.c_uint32]
            getattr(lib, name).restype = None
        for name in ("tidemark_op_begin", "tidemark_op_end"):
            getattr(lib, name).argtypes = [ctypes.c_uint32]
            getattr(lib, name).restype = None
        for name in ("tidemark_phase_begin", "tidemark_phase_end"):
            getattr(lib, name).argtypes = [ctypes.c_int]
            getattr(lib, name).restype = None
        for name in ("tidemark_step_begin", "tidemark_step_end"):
            getattr(lib, name).argtypes = [ctypes.c_int64]
            getattr(lib, name).restype = None
        lib.tidemark_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint32]
        lib.tidemark_tag.restype = None
        lib.tidemark_counters.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 3
        lib.tidemark_counters.restype = None
        lib.tidemark_take_plan.argtypes = [ctypes.c_char_p, ctypes.c_int64,
                                           ctypes.POINTER(ctypes.c_uint64)]
        lib.tidemark_take_plan.restype = ctypes.c_int64
        lib.tidemark_plan_result.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p,
                                             ctypes.c_int64]
        lib.tidemark_plan_result.restype = None
        # Newer than ABI 1's first agents: optional.
        self._seed = getattr(lib, "tidemark_seed_block", None)
        if self._seed is not None:
            self._seed.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
            self._seed.restype = None
        self._allocator_library = getattr(lib, "tidemark_tensor_allocator_library", None)
        if self._allocator_library is not None:
            self._allocator_library.argtypes = [ctypes.c_char_p]
            self._allocator_library.restype = ctypes.c_int
        self._job_plan_result = getattr(lib, "tidemark_job_plan_result", None)
        if self._job_plan_result is not None:
            self._job_plan_result.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                              ctypes.c_int64]
            self._job_plan_result.restype = None
        self._adapter_failed = getattr(lib, "tidemark_adapter_failed", None)
        if self._adapter_failed is not None:
            self._adapter_failed.argtypes = []
            self._adapter_failed.restype = None
        self._tensor_memory = getattr(lib, "tidemark_tensor_memory", None)
        if self._tensor_memory is not None:
            self._tensor_memory.argtypes = [ctypes.c_uint64, ctypes.c_int64, ctypes.c_int,
                                            ctypes.c_int64]
            self._tensor_memory.restype = None
        self.lib = lib
        self._names = {}
        # Bound once: these are called for every module call and every saved tensor. Through
        # ctypes.PyDLL, which keeps the GIL across the call: each only pushes a record (CDLL
        # gave the GIL up and took it back around every one of them). A push that waits for room
        # in a full ring waits with the GIL held, as an allocation made by torch does.
        hot = ctypes.PyDLL(None)
        for name in ("tidemark_scope_begin", "tidemark_scope_end", "tidemark_op_begin",
                     "tidemark_op_end", "tidemark_phase_begin", "tidemark_phase_end",
                     "tidemark_step_begin", "tidemark_step_end", "tidemark_tag"):
            fn, declared = getattr(hot, name), getattr(lib, name)
            fn.argtypes, fn.restype = declared.argtypes, declared.restype
            setattr(self, name[len("tidemark_"):], fn)

    def use_native(self, native):
        """The hot entry points as the native builtins of native_hooks (a call costs ~0.05 µs,
        through ctypes ~0.3-0.5)."""
        if self.lib is None:
            return
        for name in ("scope_begin", "scope_end", "phase_begin", "phase_end", "tag"):
            setattr(self, name, native[name])

    @property
    def present(self):
        return self.lib is not None

    def start(self):
        return bool(self.lib and self.lib.tidemark_agent_start())

    def stop(self):
        if self.lib:
            self.lib.tidemark_agent_stop()

    def recording(self):
        return bool(self.lib and self.lib.tidemark_recording())

    def flush(self, timeout_ms=5000):
        return bool(self.lib and self.lib.tidemark_flush(int(timeout_ms)))

    def session_id(self):
        return int(self.lib.tidemark_session_id()) if self.lib else 0

    def intern(self, name):
        iid = self._names.get(name)
        if iid is None:
            iid = self.lib.tidemark_intern(name.encode("utf-8", "replace")) if self.lib else 0
            self._names[name] = iid
        return iid

    def counters(self):
        if not self.lib:
            return {"recorded": 0, "sent": 0, "dropped": 0}
        vals = [ctypes.c_uint64() for _ in range(3)]
        self.lib.tidemark_counters(*[ctypes.byref(v) for v in vals])
        return {"recorded": vals[0].value, "sent": vals[1].value, "dropped": vals[2].value}


    def follow_python_stacks(self):
        """`tidemark run --stacks`: the calling thread's Python stack goes with each of its
        large allocations from now on, without the frames of this package (the adapter's own
        hooks and wrappers; agent/python/python_stacks.h). 1 on, 0 not asked, -1 no interpreter
        API found. Called through ctypes.PyDLL: the agent needs the GIL held."""
        if not self.lib:
            return 0
        try:
            fn = ctypes.PyDLL(None).tidemark_python_stacks_here
        except (OSError, AttributeError):
            return -1
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_char_p]
        import os
        package = os.path.dirname(os.path.abspath(__file__)) + os.sep
        return fn(package.encode("utf-8", "surrogateescape"))

    def adapter_failed(self):
        """A hook or wrapper of the adapter failed: counted by the agent, for the session's
        stats."""
        if self.lib and self._adapter_failed is not None:
            self._adapter_failed()

    def seed_block(self, address, nbytes):
        """A block allocated before `tidemark attach`: recorded as allocated now (no-op for a
        block the agent already tracks)."""
        if self.lib and self._seed is not None:
            self._seed(address, nbytes)

    def tensor_allocator_library(self, prefix):
        """The framework's tensor allocator lives in the loaded library whose file name starts
        with prefix: the agent tags what other libraries allocate for themselves as WORKSPACE.
        True if the agent found it."""
        if self.lib and self._allocator_library is not None:
            return self._allocator_library(prefix.encode("utf-8")) == 1
        return False

    def tensor_memory(self, address, size_delta, device, total_reserved=-1):
        """A tensor block of a framework's caching allocator: allocated (size_delta > 0) or freed
        (size_delta < 0) on device (-1 host)."""
        if self.lib and self._tensor_memory is not None:
            self._tensor_memory(address, size_delta, device, total_reserved)

    def take_plan(self):
        """(plan_id, plan JSON) of a plan the server sent, or None."""
        if not self.lib:
            return None
        plan_id = ctypes.c_uint64()
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lib.tidemark_take_plan(buf, size, ctypes.byref(plan_id))
            if n == 0:
                return None
            if n < size:
                return plan_id.value, buf.value.decode("utf-8", "replace")
            size = n  # too small: the plan waits for a bigger buffer

    def plan_result(self, plan_id, applied, message, step):
        if self.lib:
            self.lib.tidemark_plan_result(plan_id, 1 if applied else 0,
                                          message.encode("utf-8", "replace"), step)

    def job_plan_result(self, plan_json, applied, message, step):
        """What became of a plan the job applied itself (no plan id: its JSON and first step
        name it), for plan-check. False when this agent cannot say it."""
        if not self.lib or self._job_plan_result is None:
            return False
        self._job_plan_result(plan_json.encode("utf-8", "replace"), 1 if applied else 0,
                              message.encode("utf-8", "replace"), step)
        return True


class _Absent:
    """Stands in for Agent's hot entry points when the agent is not loaded."""

    @staticmethod
    def noop(*args):
        return None


def load():
    agent = Agent()
    if not agent.present:
        for name in ("scope_begin", "scope_end", "op_begin", "op_end", "phase_begin", "phase_end",
                     "step_begin", "step_end", "tag"):
            setattr(agent, name, _Absent.noop)
    return agent
