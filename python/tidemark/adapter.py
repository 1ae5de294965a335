"""The PyTorch adapter: module scopes, phases, steps and tensor categories, reported to the agent.

It works on torch 1.13 (Debian's) and 2.x. Everything is installed once, globally:

* global module forward hooks give module scopes (a module of no model called inside one's
  forward is named after its caller), find the root models (a module called while no other
  module runs, owning parameters) and the forward phase. A training forward's result is
  ACTIVATION, "<Model>:output" (a loop holds it through the backward). A root model some optimizer
  trains (or, before any optimizer holds it, one called with gradients on) is a training model;
  one that no optimizer trains (an EMA copy, a teacher, a reference model) is a frozen model,
  found also when it is never called (every module made is noted, and looked at at the next
  step's start): its weights are WEIGHT under the name "<Class> [frozen]";
* a root model's pass with gradients off (``torch.no_grad``, ``inference_mode``), and any pass of
  a frozen model, is the eval phase: never a step, nor part of one's forward;
* ``torch.autograd.backward`` is wrapped for the backward phase (a backward run inside it, by a
  reentrant checkpoint, is part of it);
* ``torch.optim.Optimizer`` construction is wrapped, so every optimizer's ``step`` gives the
  optimizer phase and the gradient and optimizer-state tags; a step (a training iteration) ends
  once every optimizer has stepped in it (see ``_optimizer_end``);
* ``torch.nn.utils.clip_grad_norm_`` and its kin run in the optimizer phase;
* a default ``saved_tensors_hooks`` pair tags every tensor saved for backward (ACTIVATION, or
  RECOMPUTED during a checkpoint's recomputation) and returns it unchanged; a tensor saved outside
  a model's forward that no differentiable computation made (a loss's target built in the step)
  is INPUT;
* ``torch.utils.checkpoint.checkpoint`` is wrapped: its tensor inputs are CHECKPOINT_INPUT and its
  second run (inside backward) is the recompute phase; the module scopes a recomputation stopped
  early leaves open (torch 2's non-reentrant checkpoint stops once it has what the backward
  needs) end with it; the autocast copies of weights its forward's hooks are handed (kept by
  autocast's cache, not by the checkpoint) are TEMPORARY; a checkpoint of a module an installed
  plan names, or ``checkpoint_sequential`` over such modules, runs them plainly (the plan decides
  what they recompute);
* batches coming out of a DataLoader, the tensors its dataset holds in memory (a
  ``TensorDataset``'s, a dataset's tensor attributes), and a root model's tensor inputs that are
  not the output of another computation of the step (a generator's output handed to a
  discriminator), are INPUT.

A tag names the storage's first byte, which is the address of the block the allocator returned,
so the server joins tags and allocations on the address.
"""
import functools
import sys
import threading
import types
import weakref

from . import _agent as A


def _storage_of_in_python(t):
    """(address, bytes) of the storage behind tensor t; raises for a tensor without one."""
    try:
        s = t.untyped_storage()
    except AttributeError:
        # torch 1.13: its untyped storage, without the Python TypedStorage that t.storage()
        # builds (7x the time; called for every tag and saved tensor).
        s = t._storage() if hasattr(t, "_storage") else t.storage()
    try:
        nbytes = s.nbytes()
    except AttributeError:
        nbytes = s.size() * s.element_size()
    return s.data_ptr(), nbytes


def _dataset_tensors(dataset, depth=0):
    """The tensors an in-memory dataset holds: a TensorDataset's, and those a dataset keeps as
    its attributes (one tensor, or a tuple or list of a few), through Subset and ConcatDataset."""
    import torch
    if dataset is None or depth > 3:
        return []
    found = []
    inner = getattr(dataset, "datasets", None)  # ConcatDataset
    if isinstance(inner, (list, tuple)):
        for d in inner[:64]:
            found += _dataset_tensors(d, depth + 1)
    inner = getattr(dataset, "dataset", None)  # Subset
    if inner is not None and inner is not dataset:
        found += _dataset_tensors(inner, depth + 1)
    try:
        attributes = list(vars(dataset).values())
    except TypeError:
        return found
    for value in attributes:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)) and 0 < len(value) <= 16 and all(
                isinstance(v, torch.Tensor) for v in value):
            found += value
    return found


# The native one where the adapter's native hooks are loaded (install; it calls the Python one for
# tensors of other types), else the Python one.
_storage_of = _storage_of_in_python


_LOW_PRECISION = ()  # torch.bfloat16, torch.float16 (install)


def _autocast_on():  # whether any autocast region is open on this thread (install: torch's own)
    return False
_Parameter = type(None)  # torch.nn.Parameter (install): read for every saved tensor
_Tensor = type(None)  # torch.Tensor (install): read for every optimizer state entry, every step


def _storage_address(t):
    try:
        return _storage_of(t)[0]
    except Exception:  # sparse, meta, or otherwise storage-less tensors
        return 0


def _compile_probe():
    try:
        from torch.compiler import is_compiling  # torch >= 2.3
        return is_compiling
    except ImportError:
        pass
    try:
        from torch._dynamo import is_compiling  # torch 2.0 - 2.2
        return is_compiling
    except ImportError:
        return lambda: False  # torch 1.13: nothing compiles


def _compiling():  # torch.compiler.is_compiling, once torch is imported (install)
    return False


def _original_module(module):
    """The module torch.compile(module) wrapped (an OptimizedModule's _orig_mod), else module:
    the model is the module the user wrote, named by its class."""
    return getattr(module, "_orig_mod", module) if type(module).__name__ == "OptimizedModule" \
        else module


def _holder(value):
    """A callable that returns value, where a weak reference would stand."""
    return lambda: value


def _qualified(prefix, path):
    """prefix.path, without the `_orig_mod` steps torch.compile(module) puts in (a compiled
    block is named as the block it compiles)."""
    parts = [p for p in path.split(".") if p and p != "_orig_mod"] if path else []
    return ".".join([prefix] + parts)


def _keyword_arguments_of_call():
    """The keyword arguments of the module call whose global forward pre-hook is running (read
    from torch's Module._call_impl frame; {} where that is not the caller)."""
    try:
        # _keyword_arguments_of_call <- _forward_pre <- _call_impl (torch 1.13), or <- inner, a
        # closure of _call_impl's that sees its kwargs (torch 2).
        frame = sys._getframe(2)
        for _ in range(2):
            if frame is None:
                break
            if frame.f_code.co_name in ("_call_impl", "inner"):
                kwargs = frame.f_locals.get("kwargs")
                if isinstance(kwargs, dict):
                    return kwargs
            frame = frame.f_back
    except Exception:  # noqa: BLE001 - only ever a missed tag
        pass
    return {}


def _tensors_in(obj, depth=0):
    import torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors_in(o, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors_in(o, depth + 1)


class Instrumenter:
    """The adapter's state. One per process (see ``instance()``)."""

    def __init__(self, agent):
        self.agent = agent
        self.installed = False
        self.module_names = weakref.WeakKeyDictionary()
        # What the module hooks read of module_names, by id(module): (weak reference, its name or
        # None, the scope's name, its interned id). module_names.get builds a weak reference each
        # time, and each module call asks twice; emptied whenever a module is named.
        self.scopes_by_id = {}
        self.saved_name_ids = {}  # module name -> interned "<name>:saved"
        # The last tag of each tensor a model or optimizer holds from step to step (_tag_state),
        # by id(tensor): (weak reference, data pointer, category, name).
        self.state_tags = {}
        self.model_state = {}  # id(root) -> its walk (_model_state_of)
        self.param_names = {}          # id(param) -> qualified name
        self.state_names = {}          # (id(param), state key or None) -> tag name
        self.roots = weakref.WeakSet()  # training models (root modules an optimizer trains)
        self.frozen = weakref.WeakSet()  # root modules with parameters no optimizer trains
        self.new_modules = weakref.WeakSet()  # modules made since the last look for frozen ones
        # Optimizers that stepped in the open step, and those that missed a whole step (left out
        # of "every optimizer has stepped").
        self.stepped = weakref.WeakSet()
        self.idle_optimizers = weakref.WeakSet()
        # Storages saved for backward in the open step (address -> a weak reference to the tensor
        # saved): a root's input among them is another model's output (the generator's images,
        # even detached), not the batch. Weak, and read through _saved_now: once the saved tensor
        # is gone its storage may be freed and its address another tensor's.
        self.saved_this_step = {}
        self.optimizers = weakref.WeakSet()
        self.stepping = weakref.WeakSet()  # optimizers inside their step now
        # torch 1.13: optimizer classes whose step is wrapped
        self.wrapped_classes = weakref.WeakSet()
        self.local = threading.local()
        self.phases = []                # the phase stack (training runs on one thread)
        self.hook_failure_said = False  # a hook failed, and stderr was told (_hook_failed)
        self.step = 0
        self.step_open = False
        self.backward_module = None  # whose saved tensors backward is consuming now
        self.applied_plan = None  # the recompute plan the server had applied (tidemark apply)
        self.previous_plan = None  # the one it replaced, restored if the new one fails its trial
        self.plan_on_trial = None  # (plan id, first step) of a plan whose first step is running
        self.plan_ids = {}  # id(AppliedPlan) -> plan id, for plans reported applied
        self.plan_first_steps = {}  # id(AppliedPlan) -> the first step it ran in
        self.path_check = None  # plan.PathCheck of the applied plan, until it found a difference
        # Plans sent for a later step (apply_at_step: every rank of a job switches at the same
        # one), in the order they came: [(plan id, text, step)].
        self.held_plans = []
        # Plans the script applied itself (tidemark.apply_plan), for plan-check: [AppliedPlan,
        # its JSON, its first step, the (applied, message) last reported]; the last 64.
        self.jobs_own_plans = []
        # The saved-tensor hooks: these methods, or their native versions (native_hooks, loaded
        # at install; native_hooks_status says which, or why not).
        self.pack_hook, self.unpack_hook = self._pack, self._unpack
        self.native_hooks_status = "not installed"
        self.tensor_memory = None  # torch's tensor-level memory (torch_memory.TensorMemory)
        self.torch_ops = None  # torch's ops as op scopes (torch_ops.TorchOps)
        # False after `tidemark detach`: every hook returns at once (they stay installed, and
        # `tidemark attach` turns them on again).
        self.enabled = True
        # Whether every saved-tensor hooks context of every thread was entered after the adapter
        # was installed (see _ensure_thread_hooks). Set by install(), before any hook exists.
        self.contexts_all_seen = False
        # After an attach: the parameters whose gradients are to be seeded, [(weak reference,
        # the gradient's name)], on a training thread outside backward (_seed_gradients_held).
        self.gradients_to_seed = []

    # ----- helpers -----------------------------------------------------------------------------
    def _depth(self):
        return getattr(self.local, "depth", 0)

    def _scope_of(self, module):
        """(module_names.get(module), the scope's name: that or the class's, its interned id)."""
        entry = self.scopes_by_id.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1], entry[2], entry[3]
        name = self.module_names.get(module)
        scope = name if name is not None else type(module).__name__
        iid = self.agent.intern(scope)
        try:
            self.scopes_by_id[id(module)] = (weakref.ref(module), name, scope, iid)
        except TypeError:  # a module that cannot be weakly referenced: not cached
            pass
        if len(self.scopes_by_id) > 100000:  # modules made and dropped every step: bounded
            self.scopes_by_id.clear()
        return name, scope, iid

    def _saved_name_id(self, module):
        iid = self.saved_name_ids.get(module)
        if iid is None:
            if len(self.saved_name_ids) > 100000:
                self.saved_name_ids.clear()
            iid = self.saved_name_ids[module] = self.agent.intern(module + ":saved")
        return iid

    def _tag_state(self, t, category, name):
        """tag_tensor for what a model or optimizer holds from step to step (weights, gradients,
        optimizer state), tagged at every step: sent again only when the tensor's storage moved
        (its data pointer changed) or its category or name did. A tag holds for its block's whole
        life (docs/categories.md), so the repeats said nothing new, and they cost the job's host
        a few microseconds each, hundreds of times a step."""
        try:
            pointer = t.data_ptr()
        except Exception:  # storage-less tensors
            return
        key = id(t)
        entry = self.state_tags.get(key)
        if (entry is not None and entry[0]() is t and entry[1] == pointer and
                entry[2] == category and entry[3] == name):
            return
        self.tag_tensor(t, category, name)
        try:
            ref = weakref.ref(t)
        except TypeError:
            return
        if len(self.state_tags) > 65536:  # bounded, however many tensors come and go (a
            self.state_tags.clear()       # clear costs one repeat of each tag, nothing more)
        self.state_tags[key] = (ref, pointer, category, name)

    def _group_unchanged(self, key, tensors, category):
        """Whether `tensors` — all a model or an optimizer holds from step to step, in its order
        — are the same tensors at the same data pointers as at the group's last call (under
        `key`, for `category`), which then needs no tag of its own: a step's check of a few
        hundred tensors comes down to two list comparisons. Remembered for the next call either
        way, by ids and pointers (no reference kept), in state_tags (emptied with it)."""
        try:
            pointers = [t.data_ptr() for t in tensors]
        except Exception:  # a storage-less tensor: tagged one by one
            return False
        ids = list(map(id, tensors))
        key = ("group", category, key)
        last = self.state_tags.get(key)
        self.state_tags[key] = (ids, pointers)
        return last is not None and last[1] == pointers and last[0] == ids

    def _in_phase(self, phase):
        return phase in self.phases

    def _phase_begin(self, phase):
        self.phases.append(phase)
        self.agent.phase_begin(phase)

    def _phase_end(self, phase):
        phases = self.phases  # (a detach replaces the list: this one is the training thread's)
        if phase in phases:
            # Close it and whatever was left open inside it.
            while phases:
                p = phases.pop()
                if p == phase:
                    break
        self.agent.phase_end(phase)

    def _guarded(self, what, hook, *args):
        """hook(*args), whose failure does not reach the job (_hook_failed): its value, or None
        where it failed."""
        try:
            return hook(*args)
        except Exception as e:  # noqa: BLE001 - never into the job's step
            self._hook_failed(what, e)
            return None

    def _backward_begin(self, phase):
        """A backward's phase (loss.backward(), torch.autograd.grad); outside any phase and any
        step, the step's begin too: a loss made without a model's forward (a loop calling
        model.forward(x) itself, a functional model) has no forward to begin its step, which
        began at the optimizer's and left its backward, often the step's peak, between steps."""
        if not self.step_open and not self.phases:
            self._begin_step_if_needed()
        self._phase_begin(phase)

    def _in_phase_around(self, what, phase, call, before_end=None, begin=None):
        """call() inside phase (begun by begin(phase), else _phase_begin; before_end() run
        before the phase ends): the job's call runs and returns, or raises, as it would without
        the adapter, whatever the adapter's own marks around it do (_guarded)."""
        self._guarded(what, begin or self._phase_begin, phase)
        try:
            return call()
        finally:
            if before_end is not None:
                self._guarded(what, before_end)
            self._guarded(what, self._phase_end, phase)

    def _hook_failed(self, what, error):
        """A hook of the adapter's that failed: the job's call goes on as if it were not there
        (that call's scope, phase or tags may be missing from the recording); said once on
        stderr, and counted by the agent every time (the session's stat "adapter_failures")."""
        try:
            self.agent.adapter_failed()
        except Exception:  # noqa: BLE001 - the agent itself may be what failed
            pass
        if not self.hook_failure_said:
            self.hook_failure_said = True
            sys.stderr.write("tidemark: the adapter's %s failed (%s: %s); the job goes on, the "
                             "recording may miss what that call marks (further failures not "
                             "said)\n" % (what, type(error).__name__, error))

    def seed_tensor(self, t, category, name, seen):
        """An attach: t, allocated before it (its storage not among the blocks the agent saw
        allocated), recorded as allocated now, then tagged. seen: the storages seeded so far."""
        try:
            address, nbytes = _storage_of(t)
        except Exception:  # storage-less tensors
            return
        if not address:
            return
        if address not in seen:
            seen.add(address)
            if t.is_cuda:
                # A tensor of the CUDA caching allocator: recorded at the tensor level (the
                # segments it lies in are not known to an attach).
                self.agent.tensor_memory(address, nbytes, t.device.index or 0)
            else:
                self.agent.seed_block(address, nbytes)
        self.tag_tensor(t, category, name)

    def _seed_gradients_held(self, in_backward_unknown=False):
        """Seeds the gradients the models held at the attach, from a training thread between a
        backward and the next: the attach thread cannot read a parameter's .grad while a
        backward may be replacing it (torch's autograd engine writes it without the GIL, and a
        read then took a reference to a gradient being freed: the job died of SIGSEGV). Called
        at a step's begin and at an optimizer's step; in_backward_unknown: a step begun by a
        forward, which under torch 1.13 cannot tell a recomputation inside a backward (then the
        optimizer's step seeds them)."""
        if not self.gradients_to_seed:
            return
        import torch
        current = getattr(torch._C, "_current_graph_task_id", None)
        if current is not None:
            if current() != -1:  # inside a backward
                return
        elif in_backward_unknown:
            return
        held, self.gradients_to_seed = self.gradients_to_seed, []
        seen = set()
        for ref, name in held:
            p = ref()
            grad = p.grad if p is not None else None
            if grad is not None:
                self.seed_tensor(grad, A.GRADIENT, name, seen)

    def tag_tensor(self, t, category, name=""):
        try:
            address, nbytes = _storage_of(t)
        except Exception:  # sparse, meta, or otherwise storage-less tensors
            return
        if address:
            self.agent.tag(address, nbytes, category, self.agent.intern(name) if name else 0)

    def _begin_step_if_needed(self):
        if not self.step_open:
            self.step += 1
            self.step_open = True
            self.stepped = weakref.WeakSet()
            self.saved_this_step = {}
            self.agent.step_begin(self.step)
            self._seed_gradients_held(in_backward_unknown=True)
            self._find_frozen_models()
            for root in list(self.roots) + list(self.frozen):
                self._tag_model_state(root)

    def _end_step(self):
        if self.step_open:
            self.agent.step_end(self.step)
            self.step_open = False

    def _tag_model_state(self, root):
        held = [(ref(), name) for ref, name in self._model_state_of(root)[1]]
        held = [(t, name) for t, name in held if t is not None]
        if self._group_unchanged(id(root), [t for t, _ in held], A.WEIGHT):
            return
        for t, name in held:
            self._tag_state(t, A.WEIGHT, name)

    def _model_state_of(self, root):
        """(places, tensors) of root's walk. tensors: what root holds from step to step — its
        parameters, then its buffers, each once, named as named_parameters and named_buffers
        name them — as (tensor, name). places: where each of those and each child module was
        found, as (module, its dict: _parameters, _buffers or _modules, the key, what was there),
        and each module's three dict sizes. All by weak reference. The walk is made again only
        when the model changed (a parameter, buffer or child replaced, added or removed), which
        checking the places sees at a fraction of a walk's cost, once a step."""
        key = id(root)
        cached = self.model_state.get(key)
        if cached is not None and cached[0]() is root and self._walk_current(cached[1][0]):
            return cached[1]
        prefix = self.module_names.get(root, type(root).__name__)
        places, tensors, seen = [], [], set()
        walked = list(root.named_modules())
        try:
            refs = [weakref.ref(m) for _, m in walked]
            for mref, (_, m) in zip(refs, walked):
                places.append((mref, None, (len(m._parameters), len(m._buffers),
                                            len(m._modules)), None))
                places.extend((mref, "_modules", name, weakref.ref(c))
                              for name, c in m._modules.items() if c is not None)
            for kind in ("_parameters", "_buffers"):
                for mref, (path, m) in zip(refs, walked):
                    for name, t in getattr(m, kind).items():
                        if t is None:
                            continue
                        ref = weakref.ref(t)
                        places.append((mref, kind, name, ref))
                        if id(t) not in seen:
                            seen.add(id(t))
                            tensors.append((ref, _qualified(prefix, path + "." + name
                                                            if path else name)))
        except TypeError:  # something that cannot be weakly referenced: walked every step
            held = list(root.named_parameters()) + list(root.named_buffers())
            return None, [(_holder(t), _qualified(prefix, name)) for name, t in held]
        walk = (places, tensors)
        if len(self.model_state) > 1000:  # models made and dropped: bounded
            self.model_state.clear()
        self.model_state[key] = (weakref.ref(root), walk)
        return walk

    @staticmethod
    def _walk_current(places):
        for mref, kind, key, ref in places:
            m = mref()
            if m is None:
                return False
            if kind is None:
                if key != (len(m._parameters), len(m._buffers), len(m._modules)):
                    return False
            elif getattr(m, kind).get(key) is not ref():
                return False
        return True

    # ----- models ------------------------------------------------------------------------------
    def _name_model(self, model, prefix, rename=False):
        """Names the model's modules and parameters prefix.<path>; names given before stay
        unless rename (a frozen model an optimizer took on: named as a training model)."""
        for sub, m in model.named_modules():
            if rename or m not in self.module_names:
                self.module_names[m] = _qualified(prefix, sub)
        self.scopes_by_id.clear()
        self.state_names.clear()
        self.model_state.clear()
        for pname, p in model.named_parameters():
            if rename or id(p) not in self.param_names:
                self.param_names[id(p)] = _qualified(prefix, pname)

    def register_model(self, model, name=None):
        if model in self.roots:
            return
        rename = model in self.frozen  # an optimizer took it on after all
        self.frozen.discard(model)
        self._name_model(model, name or type(model).__name__, rename)
        self.roots.add(model)
        if self.step_open:
            self._tag_model_state(model)

    def register_frozen(self, model, tag=True):
        """A model no optimizer trains: its weights are WEIGHT named "<Class> [frozen]" (tagged
        now unless tag is False: an attach seeds the blocks first)."""
        if model in self.frozen or model in self.roots:
            return
        taken = {self.module_names.get(m) for m in self.frozen}
        prefix, n = type(model).__name__ + " [frozen]", 1
        while prefix in taken:
            n += 1
            prefix = "%s [frozen %d]" % (type(model).__name__, n)
        self._name_model(model, prefix)
        self.frozen.add(model)
        if tag:
            self._tag_model_state(model)

    def _trained_parameters(self):
        ids = set()
        for opt in list(self.optimizers):
            for group in opt.param_groups:
                ids.update(id(p) for p in group["params"])
        return ids

    def _is_training_model(self, module):
        """Whether a root module is a training model: an optimizer holds one of its parameters,
        or (no optimizer holding it yet) it is called with gradients on and has parameters that
        want them."""
        import torch
        trained = self._trained_parameters()
        params = list(module.parameters())
        if any(id(p) in trained for p in params):
            return True
        return torch.is_grad_enabled() and any(p.requires_grad for p in params)

    def _note_new_module(self, module):
        try:
            self.new_modules.add(module)
        except TypeError:
            pass

    def _find_frozen_models(self):
        """Among the modules made since the last look: the outermost ones with parameters that
        are no training model's part and that no optimizer trains (an EMA copy made with
        copy.deepcopy, a teacher loaded for distillation) become frozen models, their weights
        tagged from now on, whether or not they are ever called."""
        if not self.enabled or not len(self.new_modules):
            return
        new = list(self.new_modules)
        self.new_modules = weakref.WeakSet()
        try:
            self._register_frozen_among(new)
        except Exception:  # noqa: BLE001 - a module that cannot be walked: only a missed tag
            pass

    def _register_frozen_among(self, new):
        inner = set()
        for m in new:
            inner.update(id(c) for c in m.children())
        candidates = [m for m in new if id(m) not in inner and m not in self.roots and
                      m not in self.frozen and next(m.parameters(), None) is not None]
        if not candidates:
            return
        known = set()
        for root in list(self.roots) + list(self.frozen):
            known.update(id(m) for m in root.modules())
        trained = self._trained_parameters()
        for m in candidates:
            if id(m) in known or any(id(p) in trained for p in m.parameters()):
                continue
            self.register_frozen(m)

    def _ensure_thread_hooks(self):
        """The saved-tensor hooks and torch's memory reporter are per thread in torch. The
        reporter is installed on each training thread once, for its life; the hooks are entered
        at each root forward where no other saved-tensor hooks are active on the thread, and
        left at the step's end (_leave_thread_hooks).

        torch keeps a thread's saved-tensor hooks on a stack, and a context's exit pops the top:
        ours entered inside another context (a non-reentrant checkpoint's, `save_on_cpu`) would
        take its tensors, and its exit would pop ours and leave it in place for good (the next
        backward fails). `_track_saved_hooks_contexts` counts the contexts entered and left on
        each thread since the adapter was installed."""
        if getattr(self.local, "saved_hooks", None) is not None:
            return
        if getattr(self.local, "hooks_contexts", 0) != 0:
            return  # inside someone else's: a later step boundary
        import torch
        hooks = torch.autograd.graph.saved_tensors_hooks(self.pack_hook, self.unpack_hook)
        hooks._tidemark = True
        hooks.__enter__()
        self.local.saved_hooks = hooks
        if self.tensor_memory is not None and not getattr(self.local, "reporter", False):
            self.local.reporter = True
            self.tensor_memory.install_here()

    def _leave_thread_hooks(self):
        """Leaves the thread's saved-tensor hooks at a step's end, when they are on top (no other
        context entered after them is still open); the next root forward enters them again.

        torch copies a thread's saved-tensor hooks, Python objects, into the state of the work it
        hands to its own threads (a collective of torch.distributed: the barrier at the end of a
        training); the worker thread that drops that work takes the GIL to release them. During
        the interpreter's exit that thread is made to exit instead, which aborts the process
        ("terminate called without an active exception", ProcessGroupGloo). Hooks that are on
        only while a step's model runs are in no work started between steps or after the last."""
        hooks = getattr(self.local, "saved_hooks", None)
        if hooks is None or getattr(self.local, "hooks_contexts", 0) != 0:
            return
        self.local.saved_hooks = None
        try:
            hooks.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - never into the job's step
            pass

    def _track_saved_hooks_contexts(self):
        """Counts, per thread, the saved-tensor hooks contexts entered and not yet left (other
        than the adapter's own), by wrapping the context class's __enter__/__exit__ in place. A
        context entered before the adapter was installed (an attach in the middle of a
        checkpointed forward) is seen leaving: the count goes below zero until a step boundary,
        where it is known to be zero again."""
        import functools
        import torch
        cls = torch.autograd.graph.saved_tensors_hooks
        if getattr(cls.__enter__, "_tidemark_wrapped", False):
            return
        enter, leave = cls.__enter__, cls.__exit__
        local = self.local

        @functools.wraps(enter)
        def tracked_enter(hooks, *args, **kwargs):
            if getattr(local, "checkpoint_entry", False) is True and _autocast_on():
                # Entered between tidemark_checkpoint's call and the function's start: a
                # non-reentrant checkpoint's hooks, which keep nothing of what they are handed.
                self._name_autocast_cache(hooks)
            result = enter(hooks, *args, **kwargs)
            if not getattr(hooks, "_tidemark", False):
                local.hooks_contexts = getattr(local, "hooks_contexts", 0) + 1
            return result

        @functools.wraps(leave)
        def tracked_exit(hooks, *args, **kwargs):
            if not getattr(hooks, "_tidemark", False):
                local.hooks_contexts = getattr(local, "hooks_contexts", 0) - 1
            return leave(hooks, *args, **kwargs)

        tracked_enter._tidemark_wrapped = True
        cls.__enter__ = tracked_enter
        cls.__exit__ = tracked_exit

    def _name_autocast_cache(self, hooks):
        """Wraps the pack hook of a non-reentrant checkpoint's forward so that the autocast copies
        of weights it is handed are named. The checkpoint keeps none of them; autocast's cache
        holds each one until its region exits (right after the forward, before the backward):
        TEMPORARY, named `<weight> (bfloat16 cast, autocast cache)`. Without a checkpoint the
        same copies are saved for backward (ACTIVATION, `_pack`). The hook's result is passed
        back untouched, and the hook's attributes are the wrapper's (torch 2 marks its own hooks
        by attributes of the function and reads them through the stack of hooks in use).
        Only under autocast at the checkpoint's call (otherwise every tensor its forward saves
        would pay a call for nothing): a function that enters autocast itself, inside the
        checkpoint, leaves its casts UNKNOWN."""
        pack = getattr(hooks, "pack_hook", None)
        if not isinstance(pack, types.FunctionType):
            return

        def pack_naming_casts(t):
            if t.dtype in _LOW_PRECISION and self.enabled:
                try:
                    cast_of = self._weight_cast_of(t)
                    address, nbytes = _storage_of(t) if cast_of is not None else (0, 0)
                    if address:
                        self.agent.tag(address, nbytes, A.TEMPORARY, self.agent.intern(
                            "%s (%s cast, autocast cache)" % (
                                cast_of, str(t.dtype).replace("torch.", ""))))
                except Exception:  # noqa: BLE001 - never into the job's forward
                    pass
            return pack(t)

        pack_naming_casts.__dict__ = pack.__dict__  # one dict for both: set and deleted alike
        hooks.pack_hook = pack_naming_casts

    def _forward_pre(self, module, inputs):
        # Inside torch.compile's tracing every hook does nothing (what dynamo traces must have no
        # side effects outside torch): a compiled region has no module scopes of its own.
        if not self.enabled or _compiling():
            return
        try:
            local = self.local
            depth = getattr(local, "depth", 0)
            if depth and self.path_check is None:
                # The common case, once per module call: a module seen before, inside a forward.
                # What the rest of this hook would do comes down to opening its scope.
                entry = self.scopes_by_id.get(id(module))
                stack = getattr(local, "names", None)
                if entry is not None and stack and entry[1] is not None and entry[0]() is module:
                    self.agent.scope_begin(entry[3])
                    local.depth = depth + 1
                    stack.append(entry[2])
                    return
            module = _original_module(module)
            name, scope, iid = self._scope_of(module)
            stack = getattr(local, "names", None)
            if name is None and depth and stack:
                # A module of no model, called inside one's forward (a function `transformers` made
                # a module of, `Func`, shared by every layer): named after the module calling it, so
                # that its memory is that layer's.
                scope = stack[-1] + "." + scope
                iid = self.agent.intern(scope)
            if name is None and depth == 0 and not self._in_phase(A.BACKWARD):
                has_params = next(module.parameters(), None) is not None
                if has_params:
                    try:
                        training = self._is_training_model(module)
                    except Exception:  # noqa: BLE001 - cannot tell: as before frozen models existed
                        training = True
                    if training:
                        self.register_model(module)
                    else:
                        self.register_frozen(module)
                name, scope, iid = self._scope_of(module)
            name = scope
            if depth == 0 and not self._in_phase(A.BACKWARD) and (module in self.roots or
                                                                   module in self.frozen):
                # Only where every context of the thread was seen entering: everywhere when torch
                # was imported under the adapter; after an attach, once the thread passed a step
                # end (a forward under way at the attach may sit in a context not counted).
                if self.contexts_all_seen or getattr(self.local, "passed_step_end", False):
                    self._ensure_thread_hooks()
                import torch
                evaluation = module in self.frozen or not torch.is_grad_enabled()
                if evaluation:
                    self._phase_begin(A.EVAL)  # evaluation: no step, not a step's forward
                else:
                    self._begin_step_if_needed()
                    self._phase_begin(A.FORWARD)
                if self.path_check is not None:
                    self.path_check.begin_forward(not evaluation)
                self._tag_inputs(inputs)
                # Keyword arguments too (`model(input_ids=x, labels=y)`, as `transformers` models
                # are called): global pre-hooks are given the positional ones only.
                self._tag_inputs(_keyword_arguments_of_call())
            if self.path_check is not None and not self._in_phase(A.RECOMPUTE):
                self.path_check.saw(name)
            self.agent.scope_begin(iid)
            self.local.depth = depth + 1
            stack = getattr(self.local, "names", None)
            if stack is None:
                stack = self.local.names = []
            stack.append(name)
        except Exception as e:  # noqa: BLE001 - never into the job's forward
            self._hook_failed("forward pre-hook", e)

    def _saved_now(self, address):
        """Whether a tensor saved for backward in the open step still lies at `address` (its
        storage's). A saved tensor that is gone says nothing: the storage may have been freed
        since and the address be a new tensor's (a model's output tagged or not by chance)."""
        ref = self.saved_this_step.get(address)
        t = ref() if ref is not None else None
        return t is not None and _storage_address(t) == address

    def _tag_inputs(self, inputs):
        for t in _tensors_in(inputs):
            # The batch, not another model's output (made by a differentiable computation, or
            # saved for backward in this step: a generator's images, even detached).
            address = _storage_address(t) if t.grad_fn is None else 0
            if address and not self._saved_now(address):
                self.agent.tag(address, _storage_of(t)[1], A.INPUT, self.agent.intern("input"))

    def _forward_post(self, module, inputs, output):
        if not self.enabled or _compiling():
            return
        try:
            local = self.local
            depth = getattr(local, "depth", 0)
            if depth > 1:  # as in _forward_pre: a module inside a forward, seen before
                entry = self.scopes_by_id.get(id(module))
                stack = getattr(local, "names", None)
                if entry is not None and stack and entry[0]() is module:
                    local.depth = depth - 1
                    # (A module of no model: its scope is named after its caller's, _forward_pre.)
                    self.agent.scope_end(entry[3] if entry[1] is not None else
                                         self.agent.intern(stack[-1]))
                    stack.pop()
                    return
            module = _original_module(module)
            depth = max(0, depth - 1)
            self.local.depth = depth
            stack = getattr(self.local, "names", None)
            # The name its scope was opened under (a module of no model's is its caller's too).
            self.agent.scope_end(self.agent.intern(stack.pop()) if stack else
                                 self._scope_of(module)[2])
            # The phase stack read once: a detach (the agent's thread, stop()) empties it
            # between any two reads.
            top = self.phases[-1:]
            if depth == 0 and top and top[0] in (A.FORWARD, A.EVAL) and (
                    module in self.roots or module in self.frozen):
                if top[0] == A.FORWARD:
                    self._tag_output(module, output)
                self._phase_end(top[0])
        except Exception as e:  # noqa: BLE001 - never into the job's forward
            self._hook_failed("forward hook", e)

    def _tag_output(self, module, output):
        """A training forward's result (a `transformers` model's `logits`, the loss): ACTIVATION,
        named `<Model>:output`. The loop often holds it through the backward (`out =
        model(...)`, then `out.loss.backward()`), where autograd does not (on a language model,
        batch × tokens × vocabulary). Only tensors made by the forward: not a view (of a weight,
        an input) and not one saved for backward (tagged already)."""
        try:
            name_id = None
            for t in _tensors_in(output):
                if t.grad_fn is None or t._base is not None or isinstance(t, _Parameter):
                    continue
                address, nbytes = _storage_of(t)
                if not address or self._saved_now(address):
                    continue
                if name_id is None:
                    name_id = self.agent.intern(self._scope_of(module)[1] + ":output")
                self.agent.tag(address, nbytes, A.ACTIVATION, name_id)
        except Exception:  # noqa: BLE001 - never into the job's step
            pass

    # ----- backward and saved tensors ------------------------------------------------------------
    # A saved tensor remembers the module that saved it. When backward unpacks it, that module's
    # backward is running: the adapter reports it as a scope "<module> [backward]", which lasts
    # until backward moves on to another module's saved tensors (or the backward phase ends).
    def _pack(self, t):
        if not self.enabled or _compiling():
            return (t, "")
        stack = getattr(self.local, "names", None)
        module = stack[-1] if stack else ""
        try:
            if not isinstance(t, _Parameter):
                address, nbytes = _storage_of(t)
                if not address:
                    pass
                elif self._in_phase(A.RECOMPUTE):
                    self.agent.tag(address, nbytes, A.RECOMPUTED, self._saved_name_id(module))
                elif (t.grad_fn is None and not t.requires_grad and
                      not self._in_phase(A.FORWARD) and not self._in_phase(A.EVAL)):
                    # Saved outside a model's forward (by the loss, a module or a function) and
                    # made by no differentiable computation: a target built in the step (labels
                    # of ones, shifted tokens).
                    self.agent.tag(address, nbytes, A.INPUT, self.agent.intern("target"))
                else:
                    saved = self.saved_this_step
                    if len(saved) > 1000000:  # steps that never end: bounded all the same
                        saved.clear()
                    try:
                        saved[address] = weakref.ref(t)
                    except TypeError:  # a tensor type without weak references: left out
                        pass
                    cast_of = self._weight_cast_of(t) if t.dtype in _LOW_PRECISION else None
                    # An autocast copy of a weight is kept for backward like an activation (and
                    # like one it is made again when its block is recomputed): ACTIVATION, named
                    # after the weight it copies.
                    if cast_of is None:
                        name_id = self._saved_name_id(module)
                    else:
                        name_id = self.agent.intern("%s (%s cast)" % (
                            cast_of, str(t.dtype).replace("torch.", "")))
                    self.agent.tag(address, nbytes, A.ACTIVATION, name_id)
        except Exception as e:  # noqa: BLE001 - never into the job's forward
            self._hook_failed("pack hook", e)
        return (t, module)

    def _weight_cast_of(self, t):
        """The name of the parameter t is an autocast copy of (through a view or two: addmm
        keeps the transposed copy), or None."""
        fn = t.grad_fn
        for _ in range(3):
            if fn is None:
                return None
            if type(fn).__name__.startswith("ToCopyBackward"):
                for nxt, _ in fn.next_functions:
                    variable = getattr(nxt, "variable", None)
                    if isinstance(variable, _Parameter):
                        return self._param_name(variable, "param")
                return None
            nexts = [n for n, _ in fn.next_functions if n is not None]
            if len(nexts) != 1:
                return None
            fn = nexts[0]
        return None

    def _unpack(self, packed):
        t, module = packed
        if _compiling():
            return t
        # (A recomputation reading what selective checkpointing kept is not backward moving on:
        # its module scopes are open above the backward one.)
        if (module and module != self.backward_module and self._in_phase(A.BACKWARD) and
                not self._in_phase(A.RECOMPUTE)):
            try:
                self._end_backward_scope()
                self.agent.scope_begin(self.agent.intern(module + " [backward]"))
                self.backward_module = module
            except Exception as e:  # noqa: BLE001 - never into the job's backward
                self._hook_failed("unpack hook", e)
        return t

    def _own_hooks_on_top(self, ckpt):
        """Whether the saved-tensor hooks a tensor saved now would go through (checkpoints' own
        left aside) are the adapter's."""
        try:
            hooks = ckpt._current_user_saved_tensors_hooks()
        except Exception:
            return False
        return hooks is not None and (hooks[0] is self.pack_hook or
                                      getattr(hooks[0], "__func__", None) is Instrumenter._pack)

    def _close_scopes_left_open(self, depth, held):
        """Back to `depth` module scopes, `held` names, as before a recomputation: torch 2's
        non-reentrant checkpoint stops re-running a function once it has made every tensor the
        backward needs (an exception raised inside the last module that saves one), so the
        modules it was inside never see their post hooks. Their scopes end here, innermost
        first; left open, the thread stayed inside a forward, and the next micro-batch's forward
        of a step (gradient accumulation) was taken for a module inside one: no forward phase,
        its memory UNKNOWN."""
        names = getattr(self.local, "names", None)
        while names is not None and len(names) > held:
            self.agent.scope_end(self.agent.intern(names.pop()))
        self.local.depth = depth

    def _end_backward_scope(self):
        module, self.backward_module = self.backward_module, None
        if module:
            self.agent.scope_end(self.agent.intern(module + " [backward]"))

    # ----- optimizers --------------------------------------------------------------------------
    def register_optimizer(self, opt):
        if opt in self.optimizers:
            return
        self.optimizers.add(opt)
        inst = self
        if len(self.frozen):  # a model taken for frozen that this optimizer trains after all
            trained = {id(p) for group in opt.param_groups for p in group["params"]}
            for m in list(self.frozen):
                if any(id(p) in trained for p in m.parameters()):
                    self.register_model(m)

        if hasattr(opt, "register_step_pre_hook"):  # torch 2
            opt.register_step_pre_hook(
                lambda o, args, kwargs: inst._guarded("optimizer hook", inst._optimizer_begin, o))
            opt.register_step_post_hook(
                lambda o, args, kwargs: inst._guarded("optimizer hook", inst._optimizer_end, o,
                                                      _closure_in(args[1:], kwargs)))
            return
        # torch 1.13 has no step hooks. `optimizer.step` must stay what torch and user code read:
        # every LR scheduler takes `optimizer.step.__self__` and `__func__` and re-binds the
        # function, so the class's step is wrapped (the optimizer's stays a bound method). A step
        # that somebody already replaced on the instance (a scheduler made before `tidemark
        # attach`) is wrapped in place, keeping its attributes (`_with_counter`).
        if "step" in vars(opt):
            opt.step = self._step_wrapper(vars(opt)["step"], owner=opt)
        elif type(opt) not in self.wrapped_classes:
            self.wrapped_classes.add(type(opt))
            type(opt).step = self._step_wrapper(type(opt).step)

    def _step_wrapper(self, step, owner=None):
        """`step` with the optimizer phase around it, for the optimizers this adapter registered,
        while it is enabled; any other call passes straight through. owner: the optimizer whose
        instance attribute `step` is (else step is the class's function, called with it)."""
        inst = self

        def around(opt, call, closure):
            if not inst.enabled or opt not in inst.optimizers or opt in inst.stepping:
                return call()
            # Only the outermost step of an optimizer counts (a subclass calling super().step()).
            inst.stepping.add(opt)
            inst._guarded("optimizer hook", inst._optimizer_begin, opt)
            try:
                return call()
            finally:
                inst.stepping.discard(opt)
                inst._guarded("optimizer hook", inst._optimizer_end, opt, closure)

        if owner is not None:
            owner_ref = weakref.ref(owner)  # the wrapper lives on the optimizer: no cycle

            @functools.wraps(step)
            def step_of_instance(*args, **kwargs):
                return around(owner_ref(), lambda: step(*args, **kwargs),
                              _closure_in(args, kwargs))

            return step_of_instance

        @functools.wraps(step)
        def step_of_class(opt, *args, **kwargs):
            return around(opt, lambda: step(opt, *args, **kwargs), _closure_in(args, kwargs))

        return step_of_class

    def _param_name(self, p, fallback):
        return self.param_names.get(id(p), fallback)

    def _state_name(self, p, key, index):
        """The name p's gradient (key None) or optimizer state entry key is tagged with, made
        once per parameter and key: a step tags hundreds of them. index: p's place among its
        optimizer's parameters, its name where no model names it."""
        cache_key = (id(p), key)
        name = self.state_names.get(cache_key)
        if name is None:
            if key is None:
                name = self._param_name(p, "param%d" % index) + ".grad"
            else:
                name = self._param_name(p, "param") + "." + str(key)
            self._remember_name(cache_key, name)
        return name

    def _remember_name(self, cache_key, name):
        """Keeps a made name in state_names (looked up first by whoever made it)."""
        if len(self.state_names) > 100000:  # parameters made and dropped: bounded
            self.state_names.clear()
        self.state_names[cache_key] = name

    def _optimizer_begin(self, opt):
        if not self.enabled or _compiling():
            return
        if self.step_open and opt in self.stepped:
            # It steps a second time in this step: an optimizer that never stepped in it is idle
            # (left out of "every optimizer" until it steps again), and this step ended with
            # the last optimizer step.
            for o in list(self.optimizers):
                if o not in self.stepped:
                    self.idle_optimizers.add(o)
            self._step_boundary()
        self.idle_optimizers.discard(opt)
        self._begin_step_if_needed()
        self._seed_gradients_held()
        self._tag_gradients(opt)
        self._phase_begin(A.OPTIMIZER)

    def _tag_gradients(self, opt):
        """The gradients of opt's parameters; and the parameters no registered model holds
        (fp32 master copies of a model's bfloat16 weights, which the loop copies back itself:
        they were UNKNOWN), WEIGHT, named after their place in the optimizer."""
        i = 0
        names = self.param_names
        for g, group in enumerate(opt.param_groups):
            for k, p in enumerate(group["params"]):
                grad = p.grad
                if grad is not None:
                    self._tag_state(grad, A.GRADIENT, self._state_name(p, None, i))
                if id(p) not in names:
                    key = (id(p), "param_groups")
                    name = self.state_names.get(key)
                    if name is None:
                        name = "%s.param_groups[%d][%d]" % (type(opt).__name__, g, k)
                        self._remember_name(key, name)
                    self._tag_state(p, A.WEIGHT, name)
                i += 1

    def _optimizer_end(self, opt, closure=False):
        if not self.enabled or _compiling():
            return
        self._phase_end(A.OPTIMIZER)
        if closure:
            # A step given a closure (LBFGS, Lightning's training loop) runs the forward and
            # backward inside it, after the pre-hook, and each backward of torch 2 makes new
            # gradients (the last step's were UNKNOWN): tagged again (only then: 61-100 us a call
            # on the dispatch-bound GPT's 77 parameters).
            self._tag_gradients(opt)
        # Tensors in its state's entries, and in lists of them (LBFGS keeps its history of
        # directions and steps in lists, under its first parameter, growing for 100 steps).
        held = [t for state in opt.state.values() for v in state.values()
                for t in _state_tensors(v)]
        if not self._group_unchanged(id(opt), held, A.OPTIMIZER_STATE):
            for p, state in opt.state.items():
                for key, value in state.items():
                    for t in _state_tensors(value):
                        self._tag_state(t, A.OPTIMIZER_STATE, self._state_name(p, key, 0))
        # A step is a training iteration: it ends once every optimizer (but the idle ones) has
        # stepped in it, so two optimizers (a GAN's, or one per parameter group) make one step.
        self.stepped.add(opt)
        if any(o not in self.stepped and o not in self.idle_optimizers
               for o in list(self.optimizers)):
            return
        self._step_boundary()

    def _step_boundary(self):
        """The step ends here; between steps, the thread's state is reset and a plan applied."""
        self._end_step()
        # An exception inside a forward skips its post hooks: a step boundary resets the depth.
        self.local.depth = 0
        self.local.names = []
        # Outside any forward: a count below zero was a context entered before the adapter.
        if getattr(self.local, "hooks_contexts", 0) < 0:
            self.local.hooks_contexts = 0
        self.local.passed_step_end = True
        self._leave_thread_hooks()
        self._apply_pending_plan()

    # ----- recompute plans sent by the server ----------------------------------------------------
    def jobs_own_plan(self, plan):
        """The script applied `plan` (an AppliedPlan) itself: its first step is the next one to
        begin; what becomes of it goes to the server like a plan `tidemark apply` sent (so that
        plan-check measures it), from the end of that step on."""
        if not self.enabled:
            return
        import json
        self.jobs_own_plans.append([plan, json.dumps(plan.plan, sort_keys=True),
                                    self.step + 1, None])
        del self.jobs_own_plans[:-64]

    def _report_jobs_own_plans(self):
        for entry in self.jobs_own_plans:
            plan, text, first, told = entry
            if self.step < first:
                continue  # its first step has not ended yet
            if plan.failed is not None:
                now = (False, plan.failed)
            elif plan.notes:
                now = (True, "applied; but in step %d %s" % (first, "; and ".join(plan.notes)))
            else:
                now = (True, "applied")
            if now != told and self.agent.job_plan_result(text, now[0], now[1], first):
                entry[3] = now

    def _apply_pending_plan(self):
        """At a step boundary: settles the plan applied at the previous boundary (its first step
        ran: applied, or, if it turned itself off, removed with the plan before it restored), then
        applies the plans `tidemark apply` sent that are due (_plans_due). Each plan's fate goes
        to the server once its first step has run (or at once when it is refused before). Then
        reports what became of the plans the script applied itself."""
        self._settle_plan()
        self._report_jobs_own_plans()
        for plan_id, text in self._plans_due():
            from .plan import PlanError, apply_plan
            roots = list(self.roots)
            if len(roots) != 1:
                self.agent.plan_result(plan_id, False, "the process trains %d models; a plan "
                                       "applies to exactly one" % len(roots), 0)
                continue
            model = roots[0]
            previous = self.applied_plan
            try:
                plan = apply_plan(model, text, self.module_names.get(model), install=False,
                                  warn=False)
            except (PlanError, ValueError) as e:
                self.agent.plan_result(plan_id, False, str(e), 0)
                continue
            except Exception as e:  # noqa: BLE001 - a plan never stops the job
                self.agent.plan_result(plan_id, False, "%s: %s" % (type(e).__name__, e), 0)
                continue
            if self.plan_on_trial is not None:
                # Two plans at one boundary: the first never ran a step. The plan to come back
                # to, should the new one fail, stays the one that ran before both.
                self.agent.plan_result(self.plan_on_trial[0], False,
                                       "replaced by plan %d before its first step" % plan_id, 0)
            else:
                self.previous_plan = previous
            if previous is not None:
                previous.remove()
            plan.install()
            self.applied_plan = plan
            self.plan_on_trial = (plan_id, self.step + 1)
            from .plan import PathCheck
            self.path_check = PathCheck(plan.plan)

    def _plans_due(self):
        """The plans to apply at this boundary, in the order they came: those held for the step
        that begins now (or one passed), and the newly sent ones without a later step; plans for
        a later step are held until its boundary."""
        import json
        while True:
            pending = self.agent.take_plan()
            if pending is None:
                break
            plan_id, text = pending
            try:
                at = json.loads(text).get("apply_at_step", 0)
            except Exception:  # noqa: BLE001 - not JSON: apply_plan says why, in order
                at = 0
            self.held_plans.append((plan_id, text, at if isinstance(at, int) else 0))
        upcoming = self.step + 1  # the step that begins after this boundary
        due = [(i, t) for i, t, at in self.held_plans if at <= upcoming]
        self.held_plans = [h for h in self.held_plans if h[2] > upcoming]
        return due

    def _settle_plan(self):
        plan = self.applied_plan
        if plan is None:
            return
        # The path the steps under it took, once: a plan that applies may still not be the
        # plan for what runs now (said with its result, or sent again with a note later).
        why = self.path_check.take_difference() if self.path_check is not None else None
        if why is not None:
            self.path_check = None
        # And what the plan does other than its document says (a segment that is not a chain
        # in this model runs a checkpoint per module).
        notes = ([why] if why is not None else []) + plan.take_notes()
        why = "; and ".join(notes) if notes else None
        if self.plan_on_trial is not None:
            plan_id, first_step = self.plan_on_trial
            self.plan_on_trial = None
            if plan.failed is None:
                self.agent.plan_result(plan_id, True, "applied" if why is None else
                                       "applied; but in step %d %s" % (first_step, why),
                                       first_step)
                self.plan_ids[id(plan)] = plan_id
                self.plan_first_steps[id(plan)] = first_step
                self.previous_plan = None
                return
            self._turn_off(plan, restore=self.previous_plan)
            self.agent.plan_result(plan_id, False, plan.failed, 0)
            return
        if plan.failed is not None:  # turned itself off later (a path its first step missed)
            self._turn_off(plan, restore=None)
            self.plan_first_steps.pop(id(plan), None)
            self.agent.plan_result(self.plan_ids.pop(id(plan), 0), False, plan.failed, 0)
        elif why is not None and id(plan) in self.plan_ids:
            self.agent.plan_result(self.plan_ids[id(plan)], True,
                                   "applied; but in step %d %s" % (self.step, why),
                                   self.plan_first_steps.get(id(plan), 0))

    def _turn_off(self, plan, restore):
        plan.remove()
        self.applied_plan = None
        self.previous_plan = None
        self.path_check = None
        if restore is not None and restore.failed is None:
            restore.install()
            self.applied_plan = restore

    # ----- installation ------------------------------------------------------------------------
    def _follow_python_stacks(self):
        """`tidemark run --stacks` (TIDEMARK_STACKS): the Python stack of large allocations, on
        this thread from now on and on every thread started after this (threading.setprofile: a
        new thread's first profile event hands it to the agent's C profile function). A thread
        with a profiler of its own keeps it; said once."""
        import os
        if not os.environ.get("TIDEMARK_STACKS"):
            return
        agent = self.agent

        def follow():
            if sys.getprofile() is not None:
                return "this thread has a profiler of its own (%r)" % (sys.getprofile(),)
            got = agent.follow_python_stacks()
            return None if got >= 0 else "the interpreter's C API was not found"

        told = []

        def tell(why):
            if why and not told:
                told.append(why)
                sys.stderr.write("tidemark: --stacks: some allocations go without their Python "
                                 "stack: %s\n" % why)

        tell(follow())
        # New threads: the script's own profiler for them (threading.setprofile before torch
        # came) stays theirs.
        theirs = getattr(threading, "getprofile", lambda: None)()
        if theirs is not None:
            tell("new threads have a profiler of the script's own (%r)" % (theirs,))
            return

        def on_new_thread(frame, event, arg):
            sys.setprofile(None)  # this function only hands the thread over
            tell(follow())

        threading.setprofile(on_new_thread)

    def install(self, enter_hooks_here=True):
        """Installs the global hooks and patches. Idempotent. enter_hooks_here: the installing
        thread is known to be outside any saved-tensor hooks context (torch was just imported);
        `tidemark attach` runs in the middle of whatever the job was doing, and leaves it to the
        thread's next root forward or step end."""
        if self.installed:
            return
        self.installed = True
        # Before the first hook is registered: the job's threads run them at once (an attach
        # installs from another thread, and the interpreter switches threads at any bytecode).
        self.contexts_all_seen = enter_hooks_here
        import torch
        global _compiling, _LOW_PRECISION, _Parameter, _Tensor
        _compiling = _compile_probe()
        _LOW_PRECISION = (torch.bfloat16, torch.float16)
        _Parameter = torch.nn.Parameter
        _Tensor = torch.Tensor
        global _autocast_on
        _autocast_on = getattr(torch._C, "_is_any_autocast_enabled", None) or (  # torch 1.13
            lambda: torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled())
        # The hottest hooks in native code where this torch's library has them (native_hooks).
        from . import native_hooks
        native, self.native_hooks_status = native_hooks.load(self, torch, _storage_of_in_python)
        if native is not None:
            global _storage_of
            _storage_of = native["storage_of"]
            self.pack_hook, self.unpack_hook = native["pack"], native["unpack"]
            self.agent.use_native(native)
            self.native_hooks_status = "on"
        import warnings
        # torch.compile(model) warns that global module hooks fire once more for the wrapper it
        # makes: the adapter's are the only ones, and it looks through the wrapper.
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there "
                                r"are global hooks on modules")
        import torch.autograd
        import torch.utils.checkpoint as ckpt
        import torch.utils.data.dataloader as dl
        from torch.nn.modules import module as nn_module

        # torch's CPU tensors come from c10::alloc_cpu, in libc10: every other caller of the
        # aligned allocators (oneDNN's primitive caches and scratchpads) is a native library's.
        self.agent.tensor_allocator_library("libc10.so")
        # A child that records (TIDEMARK_FOLLOW_CHILDREN=1) is a session of its own: it tags
        # everything again.
        import os
        os.register_at_fork(after_in_child=self.state_tags.clear)
        self._track_saved_hooks_contexts()
        nn_module.register_module_forward_pre_hook(self._forward_pre)
        nn_module.register_module_forward_hook(self._forward_post)

        # torch's tensor-level memory (CUDA), and the per-thread hooks on this thread now.
        from .torch_memory import TensorMemory
        self.tensor_memory = TensorMemory()
        self.tensor_memory.make_way_for_profilers()
        from .torch_ops import TorchOps
        self.torch_ops = TorchOps()
        self.torch_ops.enable(True)
        if enter_hooks_here:
            self._ensure_thread_hooks()
            self._follow_python_stacks()

        inst = self
        backward = torch.autograd.backward

        def tidemark_backward(*args, **kwargs):
            if not inst.enabled or inst._in_phase(A.BACKWARD):
                # Inside backward (a reentrant checkpoint's own): one backward phase, so what it
                # hands back to the outer one (the gradient of the segment's input) is born and
                # dies in it.
                return backward(*args, **kwargs)
            return inst._in_phase_around("backward wrapper", A.BACKWARD,
                                         lambda: backward(*args, **kwargs),
                                         before_end=inst._end_backward_scope,
                                         begin=inst._backward_begin)

        torch.autograd.backward = tidemark_backward
        grad = torch.autograd.grad

        @functools.wraps(grad)
        def tidemark_grad(*args, **kwargs):
            # torch.autograd.grad outside any phase (a step that takes its gradients so, a
            # gradient penalty's before the loss's backward): a backward phase, as
            # tidemark_backward's; what it makes and frees is TEMPORARY (it was UNKNOWN, 11 of
            # 41 MiB at a step's peak). Inside a forward (a model's derivative of its own) or a
            # backward it stays part of that phase.
            if not inst.enabled or _compiling() or inst.phases:
                return grad(*args, **kwargs)
            return inst._in_phase_around("autograd.grad wrapper", A.BACKWARD,
                                         lambda: grad(*args, **kwargs),
                                         before_end=inst._end_backward_scope,
                                         begin=inst._backward_begin)

        torch.autograd.grad = tidemark_grad
        self._wrap_gradient_clipping()
        self._note_modules_made(torch)

        checkpoint = ckpt.checkpoint
        import inspect
        try:
            sac_hooks_choice = "respect_saved_tensors_hooks" in inspect.signature(
                checkpoint).parameters
        except (TypeError, ValueError):
            sac_hooks_choice = False

        def tidemark_checkpoint(function, *args, **kwargs):
            if not inst.enabled or _compiling():
                return checkpoint(function, *args, **kwargs)
            # The job's own checkpoint of a module an installed plan names: the plan decides
            # (it stores the module, or recomputes it under its own checkpoint).
            from .plan import plan_deciding, without_checkpoint
            if inst._guarded("checkpoint wrapper", plan_deciding, function) is not None:
                return without_checkpoint(function, args, kwargs)
            if (sac_hooks_choice and kwargs.get("context_fn") is not None and
                    kwargs.get("use_reentrant") is False and
                    "respect_saved_tensors_hooks" not in kwargs and inst._own_hooks_on_top(ckpt)):
                # Selective checkpointing keeps the tensors its policy saves outside autograd,
                # and asks whether they should go through the saved-tensor hooks in scope: the
                # adapter's are the only ones, so yes (they keep each tensor as it is, and tag it
                # ACTIVATION). Left unsaid, torch would warn, in a job that never asked for hooks.
                kwargs["respect_saved_tensors_hooks"] = True
            inst._guarded("checkpoint wrapper", inst._tag_tensors, args, A.CHECKPOINT_INPUT,
                          "checkpoint_input")

            def run(*a, **k):
                inst.local.checkpoint_entry = False
                if not inst._in_phase(A.BACKWARD):
                    return function(*a, **k)
                depth = getattr(inst.local, "depth", 0)
                names = getattr(inst.local, "names", None)
                held = len(names) if names is not None else 0
                return inst._in_phase_around(
                    "checkpoint wrapper", A.RECOMPUTE, lambda: function(*a, **k),
                    before_end=lambda: inst._close_scopes_left_open(depth, held))

            # From here until the function runs, the checkpoint takes the random-number
            # generators' states it re-runs the function with (tidemark_rng_state).
            # (Selective checkpointing saves some weight casts itself, through the adapter's
            # hooks: its checkpoint's own hooks are left alone, `_name_autocast_cache`.)
            inst.local.checkpoint_entry = True if kwargs.get("context_fn") is None else "selective"
            try:
                return checkpoint(run, *args, **kwargs)
            finally:
                inst.local.checkpoint_entry = False

        tidemark_checkpoint.__wrapped__ = checkpoint
        tidemark_checkpoint.__doc__ = checkpoint.__doc__
        ckpt.checkpoint = tidemark_checkpoint

        checkpoint_sequential = ckpt.checkpoint_sequential

        def tidemark_checkpoint_sequential(functions, segments, input, *args, **kwargs):
            # Modules an installed plan names among them: they run in turn, plainly (the plan
            # decides); otherwise torch's, whose checkpoints are the wrapper's above.
            if inst.enabled and not _compiling():
                modules = inst._guarded("checkpoint wrapper", _planned_modules, functions)
                if modules:
                    for m in modules:
                        input = m(input)
                    return input
            return checkpoint_sequential(functions, segments, input, *args, **kwargs)

        tidemark_checkpoint_sequential.__wrapped__ = checkpoint_sequential
        tidemark_checkpoint_sequential.__doc__ = checkpoint_sequential.__doc__
        ckpt.checkpoint_sequential = tidemark_checkpoint_sequential
        self._tag_checkpoint_rng_states(torch)

        optimizer_init = torch.optim.Optimizer.__init__

        @functools.wraps(optimizer_init)
        def tidemark_optimizer_init(opt, *args, **kwargs):
            optimizer_init(opt, *args, **kwargs)
            if inst.enabled:  # after `tidemark detach`, new optimizers are left alone
                inst._guarded("optimizer hook", inst.register_optimizer, opt)

        torch.optim.Optimizer.__init__ = tidemark_optimizer_init

        iter_next = dl._BaseDataLoaderIter.__next__

        def tidemark_next(it):
            batch = iter_next(it)
            if inst.enabled:
                inst._guarded("DataLoader hook", inst._tag_batch, it, batch)
            return batch

        dl._BaseDataLoaderIter.__next__ = tidemark_next

    def _tag_tensors(self, obj, category, name):
        for t in _tensors_in(obj):
            self.tag_tensor(t, category, name)

    def _tag_batch(self, it, batch):
        """A DataLoader's batch: INPUT; and once an iterator (an epoch), its dataset's tensors."""
        self._tag_tensors(batch, A.INPUT, "batch")
        if not getattr(it, "_tidemark_dataset_tagged", False):
            it._tidemark_dataset_tagged = True
            for t in _dataset_tensors(getattr(it, "_dataset", None)):
                self._tag_state(t, A.INPUT, "dataset")

    def _tag_checkpoint_rng_states(self, torch):
        """A checkpoint keeps the random-number generators' states to re-run its function alike
        (`preserve_rng_state`, the default): the CPU generator's, 5,056 bytes, and each device's,
        tensors taken with torch.get_rng_state and torch.cuda.get_rng_state as the checkpoint
        begins, held until its backward. What the checkpoint keeps: CHECKPOINT_INPUT, named
        "checkpoint rng state" (they were UNKNOWN, a block per checkpointed region)."""
        inst = self

        def tagging(get_state):
            @functools.wraps(get_state)
            def tidemark_rng_state(*args, **kwargs):
                state = get_state(*args, **kwargs)
                if getattr(inst.local, "checkpoint_entry", False) and inst.enabled:
                    try:
                        inst.tag_tensor(state, A.CHECKPOINT_INPUT, "checkpoint rng state")
                    except Exception:  # noqa: BLE001 - never into the job's forward
                        pass
                return state

            tidemark_rng_state._tidemark_wrapped = True
            return tidemark_rng_state

        for owner in (torch, getattr(torch, "cuda", None)):
            get_state = getattr(owner, "get_rng_state", None)
            if get_state is not None and not getattr(get_state, "_tidemark_wrapped", False):
                owner.get_rng_state = tagging(get_state)

    def _wrap_gradient_clipping(self):
        """Gradient clipping works on the gradients for the optimizer: its scratch (a norm per
        gradient, |g| for the inf norm) belongs to the optimizer phase."""
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_grad
        for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_",
                     "clip_grads_with_norm_", "get_total_norm"):
            original = getattr(clip_grad, name, None)
            if original is None or getattr(original, "_tidemark_wrapped", False):
                continue

            clipping = self._in_optimizer_phase(original)
            setattr(clip_grad, name, clipping)
            if getattr(nn_utils, name, None) is original:
                setattr(nn_utils, name, clipping)

    def _in_optimizer_phase(self, function):
        """function, run inside the optimizer phase (unless it is already open)."""
        inst = self

        @functools.wraps(function)
        def in_phase(*args, **kwargs):
            if not inst.enabled or _compiling() or inst._in_phase(A.OPTIMIZER):
                return function(*args, **kwargs)
            return inst._in_phase_around("gradient clipping wrapper", A.OPTIMIZER,
                                         lambda: function(*args, **kwargs))

        in_phase._tidemark_wrapped = True
        return in_phase

    def _note_modules_made(self, torch):
        """Every module made from now on (constructed, or copied: copy.deepcopy and torch.load
        restore a module's state with __setstate__) is noted for _find_frozen_models."""
        module_cls = torch.nn.Module
        if getattr(module_cls.__init__, "_tidemark_wrapped", False):
            return
        init, setstate = module_cls.__init__, module_cls.__setstate__
        inst = self

        @functools.wraps(init)
        def noting_init(module, *args, **kwargs):
            init(module, *args, **kwargs)
            if not _compiling():
                inst._guarded("module hook", inst._note_new_module, module)

        @functools.wraps(setstate)
        def noting_setstate(module, state):
            setstate(module, state)
            if not _compiling():
                inst._guarded("module hook", inst._note_new_module, module)

        noting_init._tidemark_wrapped = True
        module_cls.__init__ = noting_init
        module_cls.__setstate__ = noting_setstate


def _planned_modules(functions):
    """The modules of a checkpoint_sequential call, where an installed plan names one of them
    (the plan decides: they run in turn, plainly), else None."""
    import torch
    from .plan import plan_deciding
    modules = (list(functions.children())
               if isinstance(functions, torch.nn.Sequential) else list(functions))
    return modules if any(plan_deciding(m) is not None for m in modules) else None


def _state_tensors(value):
    """The tensors of an optimizer's state entry: itself, nearly always (without _tensors_in's
    generator: 36 against 97 us a step for AdamW's 231 entries of a 77-parameter model; 16 before
    lists were looked into), or those in a list of them."""
    return (value,) if isinstance(value, _Tensor) else _tensors_in(value)


def _closure_in(args, kwargs):
    """Whether an optimizer step's arguments (the optimizer's own left out) hand it a closure."""
    return kwargs.get("closure") is not None or any(callable(a) for a in args)


_instance = None
_lock = threading.Lock()


def instance():
    global _instance
    with _lock:
        if _instance is None:
            _instance = Instrumenter(A.load())
        return _instance
