"""tidemark: memory profiler and recompute advisor for training jobs (Python adapter).

Under ``tidemark run`` this package is imported at interpreter start and instruments PyTorch as
soon as it is imported, with no change to the script. ``tidemark.instrument(model, optimizer)``
is the explicit form. Without the agent in the process, every call here is a no-op.
"""
from . import _agent
from .adapter import instance as _instance
from .plan import PlanError, PlanWarning, apply_plan, load_plan

__all__ = ["instrument", "available", "session_id", "flush", "counters", "apply_plan",
           "load_plan", "PlanError", "PlanWarning"]
__version__ = "0.1.0"


def instrument(model=None, optimizer=None, name=None):
    """Instruments PyTorch, and names ``model`` and ``optimizer`` explicitly (both optional)."""
    inst = _instance()
    inst.agent.start()
    inst.install()
    if model is not None:
        inst.register_model(model, name)
    if optimizer is not None:
        inst.register_optimizer(optimizer)
    return inst


def available():
    """True when the agent is loaded in this process."""
    return _instance().agent.present


def session_id():
    """The server's id of this process's session (0 while not connected)."""
    return _instance().agent.session_id()


def flush(timeout_s=5.0):
    """Waits until everything recorded so far has been sent. True if it was."""
    return _instance().agent.flush(int(timeout_s * 1000))


def counters():
    """The agent's counters: events recorded, sent, dropped."""
    return _instance().agent.counters()
