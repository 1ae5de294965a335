"""The adapter's side of ``tidemark attach`` (run by the agent's attach thread under the GIL).

``start()`` turns the adapter on in a process that is already training: it installs the hooks
(or turns them back on after a detach), finds the models (root ``nn.Module`` objects holding
parameters; those no optimizer trains are frozen models) and optimizers among the live objects,
and seeds what they already hold, so that the breakdown is complete from the first step after the
attach: each parameter and buffer (WEIGHT), gradient (GRADIENT) and optimizer state tensor
(OPTIMIZER_STATE) is recorded as allocated at the attach, then tagged. ``stop()`` (``tidemark detach``) turns every hook off.
"""
import gc
import os
import sys

from . import _agent as A
from .adapter import _storage_of, instance


# The agent's attach thread leaves the live modules and optimizers here, found in C under the
# GIL (agent/entry/attach.cpp, scanForModels): a scan of gc.get_objects() in Python could give up
# the GIL halfway, and torch warns when a tensor dies while such a scan holds its Python object.
_scanned = None


def _live_objects(kinds):
    """The live objects of the given types: the agent's scan, else one made here."""
    global _scanned
    found, _scanned = _scanned, None
    if found is None:
        # type(), not isinstance(): isinstance reads __class__, which some module shims warn on.
        found = [o for o in gc.get_objects() if issubclass(type(o), kinds)]
    return [o for o in found if isinstance(o, kinds)]


def _find_models_and_optimizers():
    import torch
    modules, optimizers = [], []
    for obj in _live_objects((torch.nn.Module, torch.optim.Optimizer)):
        (optimizers if isinstance(obj, torch.optim.Optimizer) else modules).append(obj)
    children = set()
    for m in modules:
        for c in m.children():
            children.add(id(c))
    roots = [m for m in modules
             if id(m) not in children and next(m.parameters(), None) is not None]
    return roots, optimizers


def _seed(inst, tensor, category, name, seen):
    try:
        address, nbytes = _storage_of(tensor)
    except Exception:
        return
    if not address:
        return
    if address not in seen:
        seen.add(address)
        if tensor.is_cuda:
            # A tensor of the CUDA caching allocator: recorded at the tensor level (the segments
            # it lies in are not known to an attach).
            inst.agent.tensor_memory(address, nbytes, tensor.device.index or 0)
        else:
            inst.agent.seed_block(address, nbytes)
    inst.tag_tensor(tensor, category, name)


def start(ops=False):
    """ops: turn torch's op scopes on too (`tidemark attach --ops`)."""
    inst = instance()
    if not inst.agent.present:
        raise RuntimeError("the tidemark agent is not loaded in this process")
    inst.enabled = True
    inst.state_tags.clear()  # a new session: what the models and optimizers hold is tagged again
    if "torch" not in sys.modules:
        # Not using torch yet: instrument it when it is imported (op scopes too, if asked).
        if ops:
            os.environ["TIDEMARK_OPS"] = "1"
        from .autostart import _TorchWatcher
        sys.meta_path.insert(0, _TorchWatcher())
        return
    import torch
    inst.install(enter_hooks_here=False)
    if inst.tensor_memory is not None:
        inst.tensor_memory.enable(True)
    if ops and (inst.torch_ops is None or inst.torch_ops.lib is None):
        from .torch_ops import TorchOps
        inst.torch_ops = TorchOps(wanted=True)
    if inst.torch_ops is not None:
        inst.torch_ops.enable(ops)  # this attach's choice, whatever an earlier one chose
    roots, optimizers = _find_models_and_optimizers()
    for o in optimizers:
        inst.register_optimizer(o)
    trained = inst._trained_parameters()
    for m in roots:
        # A model some optimizer trains, else a frozen one (an EMA copy, a teacher).
        if any(id(p) in trained for p in m.parameters()) or not optimizers:
            inst.register_model(m)
        else:
            inst.register_frozen(m, tag=False)
    seen = set()
    with torch.no_grad():
        for m in roots:
            prefix = inst.module_names.get(m, type(m).__name__)
            for name, p in m.named_parameters():
                _seed(inst, p, A.WEIGHT, prefix + "." + name, seen)
                if p.grad is not None:
                    _seed(inst, p.grad, A.GRADIENT, prefix + "." + name + ".grad", seen)
            for name, b in m.named_buffers():
                _seed(inst, b, A.WEIGHT, prefix + "." + name, seen)
        for o in optimizers:
            for p, state in o.state.items():
                base = inst._param_name(p, "param")
                for key, value in state.items():
                    if isinstance(value, torch.Tensor):
                        _seed(inst, value, A.OPTIMIZER_STATE, base + "." + str(key), seen)
    sys.stderr.write("tidemark: attached; %d model(s), %d optimizer(s), %d tensors already "
                     "allocated recorded\n" % (len(roots) - len(inst.frozen), len(optimizers),
                                               len(seen)))


def stop():
    inst = instance()
    inst.enabled = False
    if inst.tensor_memory is not None:
        inst.tensor_memory.enable(False)
    if inst.torch_ops is not None:
        inst.torch_ops.enable(False)
    # A step left open ends with the session.
    inst.step_open = False
    inst.phases = []
