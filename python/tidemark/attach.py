"""The adapter's side of ``tidemark attach`` (run by the agent's attach thread under the GIL).

``start()`` turns the adapter on in a process that is already training: it installs the hooks
(or turns them back on after a detach), finds the models (root ``nn.Module`` objects holding
parameters; those no optimizer trains are frozen models) and optimizers among the live objects,
and seeds what they already hold, so that the breakdown is complete from the first step after the
attach: each parameter and buffer (WEIGHT) and optimizer state tensor (OPTIMIZER_STATE) is recorded
as allocated at the attach, then tagged; the gradients (GRADIENT) at the training thread's next
step (a backward may be replacing them now). ``stop()`` (``tidemark detach``) turns every hook off.
"""
import gc
import os
import sys
import weakref

from . import _agent as A
from .adapter import instance


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


def start(ops=False):
    """ops: turn torch's op scopes on too (`tidemark attach --ops`)."""
    inst = instance()
    if not inst.agent.present:
        raise RuntimeError("the tidemark agent is not loaded in this process")
    inst.state_tags.clear()  # a new session: what the models and optimizers hold is tagged again
    if "torch" not in sys.modules:
        # Not using torch yet: instrument it when it is imported (op scopes too, if asked).
        inst.enabled = True
        if ops:
            os.environ["TIDEMARK_OPS"] = "1"
        from .autostart import _TorchWatcher
        sys.meta_path.insert(0, _TorchWatcher())
        return
    # The hooks stay off until everything is registered and seeded: the job's threads run on
    # meanwhile (the interpreter switches threads at any bytecode, and every seed is a call that
    # gives the GIL up), and a step they began before the gradients were handed over would have
    # ended without those held at the attach.
    inst.enabled = False
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
    seen, gradients = set(), []
    with torch.no_grad():
        for m in roots:
            prefix = inst.module_names.get(m, type(m).__name__)
            for name, p in list(m.named_parameters()):
                inst.seed_tensor(p, A.WEIGHT, prefix + "." + name, seen)
                # Not p.grad: a backward running now may be replacing it (seeded by the training
                # thread itself, at its next step or optimizer step: Instrumenter
                # ._seed_gradients_held).
                gradients.append((weakref.ref(p), prefix + "." + name + ".grad"))
            for name, b in list(m.named_buffers()):
                inst.seed_tensor(b, A.WEIGHT, prefix + "." + name, seen)
        # Lists taken whole (one call under the GIL each): the training thread runs between the
        # seeds, and its optimizer's first step adds state while this reads it.
        for o in optimizers:
            for p, state in list(o.state.items()):
                base = inst._param_name(p, "param")
                for key, value in list(state.items()):
                    if isinstance(value, torch.Tensor):
                        inst.seed_tensor(value, A.OPTIMIZER_STATE, base + "." + str(key), seen)
    inst.gradients_to_seed = gradients
    inst.enabled = True
    sys.stderr.write("tidemark: attached; %d model(s), %d optimizer(s), %d tensors already "
                     "allocated recorded (their gradients at the next step)\n"
                     % (len(roots) - len(inst.frozen), len(optimizers), len(seen)))


def stop():
    inst = instance()
    inst.enabled = False
    inst.gradients_to_seed = []
    if inst.tensor_memory is not None:
        inst.tensor_memory.enable(False)
    if inst.torch_ops is not None:
        inst.torch_ops.enable(False)
    # A step left open ends with the session.
    inst.step_open = False
    inst.phases = []
