"""torch's ops as op scopes (agent/torch/op_observer.cpp, in ``libtidemark_torch-<version>.so``):
every aten op the dispatcher runs, with its name, thread and time, so that ``tidemark ops``, the
peak's memory by op and the advisor see the ops of a job on the CPU too.

``TIDEMARK_OPS``: ``0`` (the default: op scopes cost a training step more than the 3 % tidemark
allows itself, bench/run.sh section 1) or ``1`` (``tidemark run --ops``; ``tidemark attach --ops``
asks for them through ``attach.start(ops=True)``). torch 2 only.
"""
import ctypes
import os
import sys

from .torch_memory import load_library


class TorchOps:
    """The op scopes of one process; every method is a no-op when they are off."""

    def __init__(self, wanted=None):
        """wanted: True or False, else $TIDEMARK_OPS decides (`tidemark attach --ops` says
        True: the job's environment was made without tidemark)."""
        self.lib = None
        self.status = "off"
        if wanted is None:
            wanted = os.environ.get("TIDEMARK_OPS", "0").lower() in ("1", "on", "yes")
        if not wanted:
            return
        import torch
        if int(torch.__version__.split(".")[0]) < 2:
            self._unavailable("op scopes need torch 2 (this job runs torch %s)"
                              % torch.__version__)
            return
        lib, why = load_library(torch)
        if lib is None:
            self._unavailable(why)
            return
        lib.tidemark_torch_ops_install.restype = ctypes.c_int
        lib.tidemark_torch_ops_remove.restype = None
        self.lib = lib
        self.status = "ready"

    def _unavailable(self, why):
        self.status = why
        sys.stderr.write("tidemark: op scopes are off: %s\n" % why)

    def enable(self, on):
        """On (registers torch's op callback) or off (takes it away: `tidemark detach`)."""
        if self.lib is None:
            return
        if not on:
            self.lib.tidemark_torch_ops_remove()
            self.status = "removed"
            return
        result = self.lib.tidemark_torch_ops_install()
        if result >= 0:
            self.status = "on"
        else:
            self._unavailable("torch refused the op callback" if result == -2 else
                              "the agent is not in this process")
            self.lib = None
