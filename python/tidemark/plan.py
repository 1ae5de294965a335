"""Applying a recompute plan (docs/plan-format.md) to a PyTorch model.

    import tidemark
    applied = tidemark.apply_plan(model, "plan.json")   # wraps the plan's modules
    ...                                                 # train as usual
    applied.remove()                                    # back to storing everything

A ``recompute`` segment of one module runs that module under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` (RNG state preserved). A segment of
several modules (blocks called one after another, each on the previous one's output — or on the
first element of an output that is a tuple, as many `transformers` layers return — and the same
other arguments, as a transformer's layers get the attention mask) runs all of them inside one
checkpoint from the first module's call; the later modules then return the outputs computed
there. Later modules whose other arguments are not the first one's but come from it and from
their predecessor's output (a T5 stack's layers are handed the position bias the first one
returns beside its hidden states) run so in one step, each under a checkpoint of its own, and
from the next step on the chain hands them their arguments the way that step showed. Modules
that turn out not to be called as a chain at all (a U-Net's down path pools in between, a
residual is added outside the blocks) each run under a checkpoint of their own from then on: the
plan stays on, each of them keeping its own input, and says so (``AppliedPlan.notes``).

A recompute segment with ``inner`` segments (a nested plan, version 2) runs its re-run as they
say: their stored modules plainly, their recomputed ones under a checkpoint of their own,
inside the segment's (nested non-reentrant checkpoints, torch 2.1 or newer; refused with
``PlanError`` on older torches). A ``selective`` segment checkpoints the child modules the plan
names, or, with a ``policy`` (an op-level option), runs the block under a checkpoint that keeps
the outputs of the ops the policy names (or of the calls of them it names) and re-runs the rest
(torch's selective activation checkpointing, torch 2.4 or newer; refused with ``PlanError`` on
older torches). An ``offload``
segment runs each of its modules with saved-tensor hooks that copy what the module saves for its
backward (its parameters aside) to host memory as it is saved and back to its device when the
backward needs it (synchronous copies, pinned host memory; a tensor already in host memory stays
where it is). ``store`` segments are left alone. A model that checkpoints its own blocks (a
`transformers` model after ``gradient_checkpointing_enable()``) has that switch turned off on
the plan's modules and their containers while the plan is installed, and back on at
``remove()``: the plan decides what is recomputed. So with a script that checkpoints some blocks
itself (``checkpoint(block, x)``, ``checkpoint(block.forward, x)``): under ``tidemark run`` such a
call of a module the plan names runs the module plainly (the plan's wrapper, or its own forward
where the plan stores it) while the plan is on. A recomputed segment whose input has grown more
than 10 % past the ``input_bytes`` the plan was made for (a larger batch or sequence) turns the
plan off: its prediction does not hold there. A recomputation does not update a module's running
state a second time (BatchNorm's statistics, any buffer the forward changes in place). A plan
that does not fit the model by its names (an unknown module, a segment whose modules are at
different depths, a module twice) is refused with ``PlanError`` before anything changes; one that
fails when it runs (a module that cannot run under a checkpoint) turns itself off and the
module's own forward runs instead (``AppliedPlan.failed`` says why), so a plan never stops the
job (and a model's own checkpointing switch is on again). Either is said with a ``PlanWarning``
when the script applied the plan itself.

Under ``torch.compile`` (a plan applied to the model before or after it is compiled) the
wrappers are traced into the compiled graph as its checkpoint regions (dynamo's own
``torch.utils.checkpoint``, which the compiled backward re-runs): nothing in them breaks the
graph. What cannot be traced is left out there: the try-the-plan-else-the-module's-forward
fallback (an error in a compiled region is torch.compile's to report), the RNG rewinding of a
multi-module segment (its modules still draw in their own order) and the running-state
restoring, which compiled code does not need (the compiled graph updates a buffer once however
often it recomputes).
"""
import collections
import contextlib
import json
import re
import weakref

PLAN_FORMAT = "tidemark-plan"
PLAN_VERSION = 2  # 2: recompute segments may carry inner segments (nested plans)


class PlanError(ValueError):
    """The plan cannot be applied to this model; the message says why."""


class PlanWarning(RuntimeWarning):
    """A plan applied by the script turned itself off, or runs other than its document says
    (``AppliedPlan.failed``, ``AppliedPlan.notes``). Shown once each by default; make it an error
    with ``warnings.simplefilter("error", tidemark.PlanWarning)`` (or ``-W error::...``)."""


def load_plan(plan):
    """A plan document from a path, a JSON string or a dict, checked for format and version."""
    if isinstance(plan, dict):
        doc = plan
    else:
        text = plan
        if not plan.lstrip().startswith("{"):
            with open(plan, "r", encoding="utf-8") as f:
                text = f.read()
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise PlanError("the plan is not valid JSON: %s" % e)
    if doc.get("format") != PLAN_FORMAT:
        raise PlanError("not a tidemark plan (format is %r)" % doc.get("format"))
    if not isinstance(doc.get("version"), int) or doc["version"] > PLAN_VERSION:
        raise PlanError("plan version %r is newer than this tidemark reads (%d)"
                        % (doc.get("version"), PLAN_VERSION))
    segments = doc.get("segments")
    if not isinstance(segments, list) or not segments:
        raise PlanError("the plan has no segments")
    for i, seg in enumerate(segments):
        if seg.get("mode") not in ("store", "recompute", "selective", "offload"):
            raise PlanError("segments[%d]: mode %r is not store, recompute, selective or offload"
                            % (i, seg.get("mode")))
        if not seg.get("modules"):
            raise PlanError("segments[%d]: no modules" % i)
    return doc


def _inner_parts(seg, names, where, depth=0):
    """A recompute segment's inner segments as parts over its modules: (mode, first index, last
    index, the part's own parts or None), or None when it has none. Each inner segment must
    list the segment's next modules in order, and cover them all."""
    inner = seg.get("inner")
    if inner is None:
        return None
    if depth > 64 or not isinstance(inner, list) or not inner:
        raise PlanError("%s: inner must be a non-empty list (nested at most 64 deep)" % where)
    parts, at = [], 0
    for k, part in enumerate(inner):
        here = "%s.inner[%d]" % (where, k)
        if not isinstance(part, dict) or part.get("mode") not in ("store", "recompute"):
            raise PlanError("%s: an inner segment stores or recomputes" % here)
        mods = part.get("modules")
        if not isinstance(mods, list) or not mods or mods != names[at:at + len(mods)]:
            raise PlanError("%s: its modules are not the segment's next ones" % here)
        if part["mode"] == "recompute" and at == 0 and len(mods) == len(names):
            raise PlanError("%s: an inner segment is not the whole segment" % here)
        sub = _inner_parts(part, mods, here, depth + 1) if part["mode"] == "recompute" else None
        if sub is not None:
            sub = _shift(sub, at)
        parts.append((part["mode"], at, at + len(mods) - 1, sub))
        at += len(mods)
    if at != len(names):
        raise PlanError("%s: its inner segments cover %d of its %d modules"
                        % (where, at, len(names)))
    return parts


def _shift(parts, by):
    """Parts with their module indices moved by `by` (inner parts are read relative to their
    own segment)."""
    return [(m, lo + by, hi + by, None if sub is None else _shift(sub, by))
            for m, lo, hi, sub in parts]


# The ops whose outputs the "matmul" policy keeps, as torch's dispatcher names them (the advisor
# measures the same ops in the recording: src/advisor/chain_from_recording.cpp).
SAVE_POLICY_OPS = {"matmul": ("mm", "addmm", "bmm", "baddbmm", "convolution",
                              "_scaled_dot_product_flash_attention",
                              "_scaled_dot_product_flash_attention_for_cpu",
                              "_scaled_dot_product_efficient_attention",
                              "_scaled_dot_product_cudnn_attention")}


def _policy_calls(policy, where):
    """What a policy keeps: (op names kept at every call, {op name: call numbers kept}).
    "matmul" keeps every call of its ops; "matmul:addmm#0,bmm#1" the first aten::addmm and the
    second aten::bmm of the block's forward only (the calls counted from 0, per op)."""
    if policy in SAVE_POLICY_OPS:
        return set(SAVE_POLICY_OPS[policy]), {}
    head, _, calls = policy.partition(":") if isinstance(policy, str) else ("", "", "")
    some = {}
    for entry in calls.split(",") if head in SAVE_POLICY_OPS and calls else ():
        name, _, number = entry.partition("#")
        if not re.fullmatch(r"[a-z0-9_]+", name) or not re.fullmatch(r"[0-9]{1,9}", number):
            some = None
            break
        some.setdefault(name, set()).add(int(number))
    if not some:
        raise PlanError("%s: unknown policy %r (%s, or matmul:OP#N,... for some of the calls)"
                        % (where, policy, ", ".join(sorted(SAVE_POLICY_OPS))))
    return set(), some


def _save_policy_context(policy, where):
    """The checkpoint's context_fn for an op-level option: torch's selective activation
    checkpointing keeping the outputs of the policy's ops (or of some of their calls, counted in
    the block's forward), re-running the others."""
    import torch
    every, some = _policy_calls(policy, where)
    try:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    except ImportError:
        raise PlanError("%s: an op-level option needs torch's selective activation "
                        "checkpointing (torch 2.4 or newer; this is torch %s); make a plan from "
                        "a recording without op scopes" % (where, torch.__version__))

    def overloads(names):
        found = set()
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                raise PlanError("%s: policy %r names aten::%s, which this torch (%s) does not "
                                "have" % (where, policy, name, torch.__version__))
            found.update(getattr(packet, o) for o in packet.overloads())
        return found

    keep = overloads(every)
    counted = {op: name for name in some for op in overloads((name,))}

    def contexts():
        # Calls are counted per checkpoint run: the forward's and (torches that ask the policy
        # again when they re-run) the recomputation's, each from 0.
        calls = {False: {}, True: {}}

        def decide(ctx, op, *args, **kwargs):
            if op in keep:
                return CheckpointPolicy.MUST_SAVE
            name = counted.get(op)
            if name is None:
                return CheckpointPolicy.PREFER_RECOMPUTE
            seen = calls[bool(getattr(ctx, "is_recompute", False))]
            number = seen.get(name, 0)
            seen[name] = number + 1
            return (CheckpointPolicy.MUST_SAVE if number in some[name]
                    else CheckpointPolicy.PREFER_RECOMPUTE)

        return create_selective_checkpoint_contexts(decide)

    return contexts


def _storage_ptr(t):
    """Where a tensor's storage begins (views of one storage share it)."""
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return storage.data_ptr()


def _saved_tensor_hooks_supported():
    import torch
    return hasattr(torch.autograd, "graph") and hasattr(torch.autograd.graph,
                                                         "saved_tensors_hooks")


def _nested_checkpoints_supported():
    """Whether torch nests non-reentrant checkpoints (torch 2.1 on: an inner checkpoint's inputs
    are saved to its parent and recomputed with it). torch 1.13's would keep every inner
    checkpoint's input through the outer forward and mix up their saved tensors."""
    import torch
    try:
        major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 1)


def _module_table(model, root_name):
    """Qualified name -> module, with the names the recording used ("TinyGPT.blocks.3"). A module
    under torch.compile is named as the module it compiles (the recording leaves out the
    `_orig_mod` steps): the compiled wrapper, met first, is the one the plan wraps, since the
    model's calls go through it."""
    if type(model).__name__ == "OptimizedModule":
        model = getattr(model, "_orig_mod", model)
    prefix = root_name or type(model).__name__
    table = {}
    for sub, m in model.named_modules():
        parts = [p for p in sub.split(".") if p and p != "_orig_mod"]
        table.setdefault(".".join([prefix] + parts), m)
    return table


def _find(table, name):
    m = table.get(name)
    if m is None:
        near = sorted(n for n in table if n.rsplit(".", 1)[0] == name.rsplit(".", 1)[0])[:6]
        raise PlanError("the plan does not fit this model: it has no module %s%s"
                        % (name, " (it has %s)" % ", ".join(near) if near else ""))
    return m


_compile_probe = None


def _compiling():
    """Whether torch.compile is tracing this call (torch.compiler.is_compiling; False on torch
    1.13). Dynamo evaluates it while tracing, so a wrapper's compiled path has nothing else in
    it."""
    global _compile_probe
    if _compile_probe is None:
        from .adapter import _compile_probe as probe
        _compile_probe = probe()
    return _compile_probe()


def _checkpoint():
    # Looked up at call time: under `tidemark run` the adapter's wrapper marks the recompute phase.
    import torch.utils.checkpoint as ckpt
    return ckpt.checkpoint


def _stops_a_recomputation(e):
    """Whether e is an enclosing checkpoint's recomputation stopping early: torch 2's
    non-reentrant checkpoint raises it through whatever it re-runs (a plan's wrapper, when the job
    checkpoints a module the plan checkpoints a part of) once it has what the backward needs. Not
    a failure of the plan's: it must reach that checkpoint (caught, the checkpoint breaks)."""
    return type(e).__name__ == "_StopRecomputationError"


def _rng_state():
    """The RNG states a failed attempt may have advanced (CPU, and CUDA where it is in use)."""
    import torch
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _version(value):
    """A tensor's version counter (it rises with every in-place change); None for other values,
    and under torch.compile (which does not trace it; identity is checked there)."""
    return None if _compiling() else getattr(value, "_version", None)


def _set_rng_state(state):
    import torch
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _as_called(module, inner):
    """inner (the module's own forward) run as a call of the module would run it under tidemark's
    adapter: inside the module's scope. A recomputation calls the forward, not the module; without
    its scope the recording would not say which block was recomputed (the advisor reads it)."""
    def call(*args, **kwargs):
        if _compiling():  # no scopes inside a compiled region
            return inner(*args, **kwargs)
        from . import adapter
        inst = adapter._instance
        if inst is None or not inst.enabled:
            return inner(*args, **kwargs)
        inst._forward_pre(module, args)
        out = None
        try:
            out = inner(*args, **kwargs)
            return out
        finally:
            inst._forward_post(module, args, out)
    return call


def _outside_dispatch_modes():
    """A context where the ops run are the adapter's own, not the model's: outside torch's
    dispatch modes (selective activation checkpointing records and replays every op of a
    recomputation in one; a copy of the running state must not be one of them). torch 1.13 has
    none in a checkpoint."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:
        return contextlib.nullcontext()
    return _disable_current_modes()


def _once_with_state(modules, fn, again=None):
    """fn for one checkpoint: its first call is the forward, later calls (`again`, when given)
    its recomputation.

    A recomputation runs the modules' forward again in training mode, and a module with running
    state (BatchNorm's running mean, variance and batch count, or any buffer its forward changes
    in place) would update it a second time. The buffers the forward changed are known from the
    first call (their version counters moved); each later call puts them back as they were before
    it, so the state is the model's own as without the plan. A native kernel may change a buffer
    without moving its counter (batch_norm's running mean and variance; its batch count moves),
    so all the buffers of a module count once one of them moved, and a normalization layer's
    always do. Buffers the forward leaves alone (a causal mask) are never copied. Under
    torch.compile: fn itself (the compiled graph updates the state once)."""
    import torch
    if _compiling():
        return fn
    owners = [(sub, list(sub.buffers(recurse=False)))
              for m in modules for sub in m.modules()]
    owners = [(sub, bufs) for sub, bufs in owners if bufs]
    running = []
    calls = [0]

    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            before = [[b._version for b in bufs] for _, bufs in owners]
            out = fn(*args, **kwargs)
            running[:] = [b for (sub, bufs), versions in zip(owners, before)
                          if isinstance(sub, torch.nn.modules.batchnorm._NormBase) or
                          any(b._version != v for b, v in zip(bufs, versions))
                          for b in bufs]
            return out
        rerun = again or fn
        if not running:
            return rerun(*args, **kwargs)
        with torch.no_grad(), _outside_dispatch_modes():
            saved = [b.detach().clone() for b in running]
        try:
            return rerun(*args, **kwargs)
        finally:
            # Also when torch stops a recomputation early (it raises once it has what it needs).
            with torch.no_grad(), _outside_dispatch_modes():
                for b, v in zip(running, saved):
                    b.copy_(v)

    call.tidemark_plans_own = True  # the plan's own checkpoint: plan_deciding passes over it
    return call


# How much larger than the recorded one a segment's input may be before the plan turns itself
# off: its predicted peak assumed the recorded input (a larger batch or sequence grows every
# activation with it).
INPUT_GROWTH_ALLOWED = 1.10


def _input_bytes(args):
    """The bytes of the first positional argument when it is a tensor, else None."""
    import torch
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    return args[0].nelement() * args[0].element_size()


def _passed_on(output):
    """What a module's output gives the next module of a chain: the output, or its first element
    when it is a tuple or list starting with a tensor (a block that returns its hidden states
    with other things, as the layers of many `transformers` models do, called in a loop as
    `h = layer(h, ...)[0]`)."""
    if isinstance(output, (tuple, list)) and output:
        import torch
        if isinstance(output[0], torch.Tensor):
            return output[0]
    return output


def _sources_of(call, first, previous):
    """Where a later module's other arguments come from, or None when not all from the first
    module's other arguments and its predecessor's output: for each positional one and each
    keyword one, ("first", position or name) or ("output", element of the predecessor's output).
    Its input must be what the predecessor hands on (_passed_on)."""
    (args, kwargs), (first_args, first_kwargs) = call, first
    if not args or args[0] is not _passed_on(previous):
        return None
    elements = list(previous) if isinstance(previous, (tuple, list)) else []

    def source(value, same, key):
        if same is not _MISSING and value is same:
            return ("first", key)
        return next((("output", m) for m, e in enumerate(elements) if value is e), None)
    positional = [source(v, first_args[p] if p < len(first_args) else _MISSING, p)
                  for p, v in enumerate(args[1:])]
    keywords = {k: source(v, first_kwargs.get(k, _MISSING), k) for k, v in kwargs.items()}
    if None in positional or None in keywords.values():
        return None
    return positional, keywords


_MISSING = object()


def _arguments_from(sources, first_args, first_kwargs, previous):
    """A later module's other arguments as `sources` (_sources_of) says, from the first module's
    and its predecessor's output."""
    positional, keywords = sources

    def value(source):
        kind, key = source
        if kind == "output":
            return previous[key]
        return first_args[key] if isinstance(key, int) else first_kwargs[key]
    return [value(s) for s in positional], {k: value(s) for k, s in keywords.items()}


def _seen(args, kwargs):
    """Arguments as they are now: each object with its version counter."""
    return ([(a, _version(a)) for a in args],
            {k: (v, _version(v)) for k, v in kwargs.items()})


def _same(args, kwargs, seen):
    """Whether the arguments are the very objects seen, none changed in place since."""
    seen_args, seen_kwargs = seen
    return (len(args) == len(seen_args) and kwargs.keys() == seen_kwargs.keys() and
            all(a is b and _version(a) == v for a, (b, v) in zip(args, seen_args)) and
            all(kwargs[k] is b and _version(kwargs[k]) == v
                for k, (b, v) in seen_kwargs.items()))


class PathCheck:
    """Whether the training still runs the chain the plan was made for: the blocks (modules
    <prefix>.<n> of the prefixes of the plan's modules) each forward ran, in order, against the
    plan's modules, each once. A data-dependent branch (a model that goes deeper on some inputs),
    a block called twice, or a plan made for another configuration of the model: the predicted
    peak may not hold, which plan-check says."""

    MAX_CALLS = 100000  # per forward: bounded whatever the model does

    def __init__(self, doc):
        self.expected = [m for seg in doc["segments"] for m in seg["modules"]]
        self.prefixes = {prefix for prefix, _, index in (m.rpartition(".") for m in self.expected)
                         if prefix and index.isdigit()}
        self.forwards = []
        self.current = None

    def begin_forward(self, training):
        """A model's forward begins (an evaluation's is not watched)."""
        self.current = [] if training and self.prefixes else None
        if self.current is not None and len(self.forwards) < 64:
            self.forwards.append(self.current)

    def saw(self, name):
        current = self.current
        if current is None or len(current) >= self.MAX_CALLS:
            return
        prefix, _, index = name.rpartition(".")
        if index.isdigit() and prefix in self.prefixes:
            current.append(name)

    def take_difference(self):
        """How the forwards since the last call differ from the plan's chain, or None."""
        forwards, self.forwards, self.current = self.forwards, [], None
        for ran in forwards:
            # None of the blocks seen: a forward under torch.compile, whose compiled region calls
            # no module hooks (nothing to compare, not a path without the blocks).
            if ran == self.expected or not ran:
                continue
            known = set(self.expected)
            calls = {}  # in the order first called
            for n in ran:
                calls[n] = calls.get(n, 0) + 1
            parts = []
            unknown = [n for n in calls if n not in known]
            if unknown:
                parts.append("ran %s, which the plan does not list" % _names(unknown))
            missing = [n for n in self.expected if n not in calls]
            if missing:
                parts.append("did not run %s" % _names(missing))
            twice = [n for n, k in calls.items() if k > 1]
            if twice:
                parts.append("ran %s more than once" % _names(twice))
            if not parts:
                parts.append("ran the blocks in another order (%s)" % _names(list(calls)))
            return ("its forward took another path than the step the plan was made from: it %s; "
                    "the predicted peak may not hold (a data-dependent branch, a block called "
                    "twice, or another configuration of the model)" % "; ".join(parts))
        return None


def _names(names, shown=3):
    more = len(names) - shown
    return ", ".join(names[:shown]) + (" and %d more" % more if more > 0 else "")


# One thing a plan wraps: kind "one" (a module under a checkpoint), "chain" (modules under one
# checkpoint from the first one's call) or "offload" (a module whose saved tensors go to host
# memory); the input bytes the plan was made for (or None); a chain's inner parts when the plan
# nests (or None); a checkpoint context_fn (an op-level option's policy, or None).
_Action = collections.namedtuple("_Action", "kind modules names input_bytes parts context")


class AppliedPlan:
    """The wrapped modules of one applied plan; ``remove()`` restores them.

    A plan never stops the job. Each wrapper tries the plan's way (a checkpoint); if that raises,
    the random number generators are put back, the plan turns itself off (``failed`` says why)
    and the module's own forward runs instead, so the step goes on as without the plan (an error
    of the job's own is raised again by its own forward). A segment of several modules returns
    each module's true output, computed inside one checkpoint, each later module called there
    with its predecessor's output and the first module's other arguments; a later module called
    with anything else (the model is not a chain there), or a chain that raises, makes the
    segment's modules run under a checkpoint each from then on (``notes`` says so), so the
    values are always the model's own. What a failure in the recomputation during backward does
    cannot be undone: the wrappers' forward runs first, and is where a plan that does not fit
    fails."""

    def __init__(self, doc, actions, warn=True, switches=(), named=()):
        self.plan = doc
        self._named = list(named)  # every module the plan names, stored ones too
        # Modules whose own activation-checkpointing switch the plan turns off while it is
        # installed (_own_switches): the plan decides what its blocks recompute.
        self._switches = list(switches)
        self._switched = []
        self.failed = None  # why the plan turned itself off
        self.notes = []  # what the plan does other than its document says, while on
        self._new_notes = []
        self.warn = warn  # say failures and notes as PlanWarnings
        self._warned = {}  # the warnings registry of this plan's
        self._actions = actions  # _Action
        self._restore = []  # (module, had_own_forward, previous_forward)

    def install(self):
        """Wraps the plan's modules (again, after a remove())."""
        if self._restore:
            return
        for m in self._switches:
            if getattr(m, "gradient_checkpointing", None) is True:
                m.gradient_checkpointing = False
                self._switched.append(m)
        for m in self._named:
            _PLANNED[m] = weakref.ref(self)
        for a in self._actions:
            if a.kind == "offload":
                self.wrap_offload(a.modules[0], a.names[0])
            elif a.kind == "one":
                self.wrap_one(a.modules[0], a.names[0], a.input_bytes, a.context)
            else:
                self.wrap_chain(a.modules, a.names, a.input_bytes, a.parts)

    def _set_forward(self, module, forward):
        own = "forward" in module.__dict__
        self._restore.append((module, own, module.__dict__.get("forward")))
        module.forward = forward
        _PLAN_FORWARDS[forward] = weakref.ref(module)

    def remove(self):
        for m in self._named:
            ref = _PLANNED.get(m)
            if ref is not None and ref() is self:
                del _PLANNED[m]
        for module, own, previous in reversed(self._restore):
            if own:
                module.forward = previous
            else:
                module.__dict__.pop("forward", None)
        self._restore = []
        self._switch_back()

    def _switch_back(self):
        """The model's own checkpointing switches on again, as before the plan."""
        for m in self._switched:
            m.gradient_checkpointing = True
        self._switched = []

    def _fail(self, why):
        if self.failed is None:
            self.failed = why
            # The modules' own forwards run from now on: with the model's own checkpointing,
            # as without the plan (left off, the job would store what it recomputed before).
            self._switch_back()
            self._warn("the plan was turned off: " + why)

    def _note(self, what):
        """Something the plan does other than its document says (it stays on): said once."""
        if what not in self.notes:
            self.notes.append(what)
            self._new_notes.append(what)
            self._warn("the plan runs, but " + what)

    def take_notes(self):
        """The notes made since the last call (the adapter reports them to plan-check)."""
        notes, self._new_notes = self._new_notes, []
        return notes

    def _warn(self, message):
        # A plan a script applied itself: its log says so (warnings: the script's filters
        # apply), as from tidemark rather than from a line of this file. Not from inside a
        # compiled region (nothing there may have side effects).
        if self.warn and not _compiling():
            import warnings
            warnings.warn_explicit(message, PlanWarning, "tidemark", 0, module="tidemark.plan",
                                   registry=self._warned)

    def _input_fits(self, name, recorded, args):
        """False (and the plan off) when a segment's input outgrew the one the plan was made
        for."""
        got = _input_bytes(args)
        if not recorded or got is None or got <= recorded * INPUT_GROWTH_ALLOWED:
            return True
        self._fail("%s got an input of %d bytes; the plan was made for %d (a larger batch or "
                   "sequence?): its predicted peak does not hold; the plan was turned off. Make "
                   "a plan from a step with these inputs" % (name, got, recorded))
        return False

    def _attempt(self, name, planned, own, args, kwargs):
        """planned() the plan's way; on an exception, the own way (see the class). Under
        torch.compile, planned() (see the module's doc)."""
        if _compiling():
            return planned()
        state = _rng_state()
        try:
            return planned()
        except Exception as e:  # noqa: BLE001 - whatever the plan did wrong, the job goes on
            if _stops_a_recomputation(e):
                raise
            self._fail("%s failed under the plan (%s: %s); the plan was turned off"
                       % (name, type(e).__name__, e))
            _set_rng_state(state)
            return own(*args, **kwargs)

    def _checkpointed(self, module, name, inner, args, kwargs, context=None):
        """A call of one module (its own forward: inner) under a checkpoint of its own (with a
        context_fn: an op-level option's policy), or its own forward if that fails (_attempt)."""
        options = {"context_fn": context} if context is not None else {}
        return self._attempt(
            name, lambda: _checkpoint()(
                _once_with_state([module], inner, _as_called(module, inner)), *args,
                use_reentrant=False, **options, **kwargs),
            inner, args, kwargs)

    # One module under checkpoint (with a context_fn: an op-level option's policy).
    def wrap_one(self, module, name, input_bytes=None, context=None):
        import torch
        inner = module.forward

        def forward(*args, **kwargs):
            if (self.failed is not None or not torch.is_grad_enabled() or
                    not self._input_fits(name, input_bytes, args)):
                return inner(*args, **kwargs)
            return self._checkpointed(module, name, inner, args, kwargs, context)

        self._set_forward(module, forward)

    # One module whose saved tensors live in host memory between its forward and its backward.
    def wrap_offload(self, module, name):
        import torch
        inner = module.forward

        def from_host(packed):
            device, t = packed
            return t if device is None else t.to(device)

        def forward(*args, **kwargs):
            if self.failed is not None or not torch.is_grad_enabled():
                return inner(*args, **kwargs)
            owned = None  # the module's parameters' storages, once a device tensor is saved

            def to_host(t):
                nonlocal owned
                if t.device.type == "cpu":
                    return (None, t)  # host memory already
                if owned is None:
                    owned = {_storage_ptr(p) for p in module.parameters()}
                if _storage_ptr(t) in owned:
                    return (None, t)  # a parameter (or a view of one): it stays
                host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=True)
                host.copy_(t)
                return (t.device, host)

            def planned():
                with torch.autograd.graph.saved_tensors_hooks(to_host, from_host):
                    return inner(*args, **kwargs)
            return self._attempt(name, planned, inner, args, kwargs)

        self._set_forward(module, forward)

    # Several sibling modules, called in a chain, under one checkpoint (its re-run following
    # `parts`, the segment's inner segments, when the plan nests).
    def wrap_chain(self, modules, names, input_bytes=None, parts=None):
        import torch
        inners = [m.forward for m in modules]
        # Computed ahead for the later modules: pending[i] = (the input module i must be called
        # with — its predecessor's output, or the first element of an output that is a tuple —,
        # that input's version counter when it was computed, module i's output, the RNG state
        # right after module i ran, the other arguments it must be called with: the first
        # module's, the very same objects). A later module called with anything else — another
        # object, or that one changed in place since — shows that the modules are not a chain
        # in this model: from then on each of them runs under a checkpoint of its own (`alone`),
        # said once (a note) — unless each later module's arguments turn out to come from the
        # first module's and its predecessor's output in a way learnt in that step (`sources`:
        # a T5 stack's layers are handed the position bias the first one returns beside its
        # hidden states), which the chain then follows from the next step on. The RNG is wound
        # back to where each module would leave it, so the draws of the job are those of a run
        # without plan, whichever way the modules turn out to be called.
        pending = {}
        ran = []
        alone = []  # [why] once the segment runs a checkpoint per module
        # Where the later modules' arguments come from, learnt in one step (segments without
        # inner parts): sources[i] (absent: the first module's other arguments). Meanwhile
        # `seen` holds the first module's other arguments and the last output a module of the
        # segment returned, only while the segment's modules are being called (they are alive
        # then anyway), and learning["found"] what each module's call showed.
        seen = {"first": None, "out": None, "version": None}
        learning = {"why": None, "found": {}}
        sources = {}

        def give(index, y):
            """Module `index` returns y: the next module's call is compared with it."""
            if index == len(modules) - 1:
                seen["first"] = seen["out"] = None
            else:
                seen["out"], seen["version"] = y, _version(_passed_on(y))
            return y

        def note_alone(why):
            self._note("%s..%s is not a chain in this model (%s): each of its modules ran under "
                       "a checkpoint of its own, each keeping its input, so the peak may be above "
                       "the prediction" % (names[0], names[-1], why))

        def cannot_learn(why):
            alone.append(why)
            learning["why"] = None
            note_alone(why)
        # The recomputation: the same, each module in its scope.
        called = [_as_called(m, f) for m, f in zip(modules, inners)]
        whole = parts or [("store", 0, len(modules) - 1, None)]

        def run_parts(todo, x, others, kwargs, again):
            """The modules of `todo` (parts: stored modules run in turn, recomputed ones under a
            checkpoint of their own whose re-run follows their parts) from input x, each called
            with its predecessor's output and the first module's other arguments; their outputs.
            `again`: a re-run (each module in its scope), else the forward (the RNG state after
            each module noted for the later modules)."""
            fns = called if again else inners
            ys = []
            for mode, lo, hi, sub in todo:
                if mode == "store":
                    for i in range(lo, hi + 1):
                        if sources.get(i) is not None and ys:
                            a, kw = _arguments_from(sources[i], others, kwargs, ys[-1])
                            ys.append(fns[i](x, *a, **kw))
                        else:
                            ys.append(fns[i](x, *others, **kwargs))
                        x = _passed_on(ys[-1])
                        if not again and not _compiling():
                            ran.append(_rng_state())
                    continue
                inner_todo = sub or [("store", lo, hi, None)]
                fn = _once_with_state(
                    modules[lo:hi + 1],
                    lambda x_, *o, _t=inner_todo, _a=again, **kw:
                        tuple(run_parts(_t, x_, o, kw, _a)),
                    lambda x_, *o, _t=inner_todo, **kw: tuple(run_parts(_t, x_, o, kw, True)))
                outs = _checkpoint()(fn, x, *others, use_reentrant=False, **kwargs)
                ys.extend(outs)
                x = _passed_on(outs[-1])
            return ys

        def run(*args, **kwargs):
            return tuple(run_parts(whole, args[0], args[1:], kwargs, False))

        def run_again(*args, **kwargs):
            return tuple(run_parts(whole, args[0], args[1:], kwargs, True))

        def run_alone(index, args, kwargs, why=None):
            """Module `index` under a checkpoint of its own; with `why`, the segment runs so from
            now on, which the plan notes (unless the module cannot run under a checkpoint at
            all: then the plan turns itself off, as for any module)."""
            if why is not None and not alone:
                alone.append(why)
                pending.clear()
            y = self._checkpointed(modules[index], names[index], inners[index], args, kwargs)
            if why is not None and self.failed is None:
                note_alone(why)
            return y

        def learnt():
            """At the first module's call after the step that learnt: the chain follows what
            every later module's call showed from the one that differed on, or, if a module was
            not called then, each module runs under a checkpoint of its own from now on."""
            found = learning["found"]
            if found and all(i in found for i in range(min(found), len(modules))):
                sources.update(found)
                learning["why"] = None
                learning["found"] = {}
            else:
                cannot_learn(learning["why"])

        def learn(index, args, kwargs):
            """Module `index` called while learning: where its arguments come from, and it
            runs under a checkpoint of its own; or the segment runs so from now on."""
            got = None
            if (seen["first"] is not None and seen["out"] is not None and args and
                    _version(args[0]) == seen["version"]):
                got = _sources_of((args, kwargs), seen["first"], seen["out"])
            if got is None:
                cannot_learn(learning["why"])
            else:
                learning["found"][index] = got
            return give(index, run_alone(index, args, kwargs))

        def first(*args, **kwargs):
            pending.clear()
            if (self.failed is not None or not torch.is_grad_enabled() or
                    not self._input_fits(names[0], input_bytes, args)):
                return inners[0](*args, **kwargs)
            if not _compiling():
                seen["first"] = seen["out"] = None
                if learning["why"] is not None:
                    learnt()
            if alone:
                return run_alone(0, args, kwargs)
            if not args:
                return run_alone(0, args, kwargs, "%s was called without a positional input"
                                 % names[0])
            del ran[:]
            others = _seen(args[1:], kwargs)

            def planned():
                return _checkpoint()(_once_with_state(modules, run, run_again), *args,
                                     use_reentrant=False, **kwargs)
            if _compiling():
                ys = planned()
            else:
                state = _rng_state()
                try:
                    ys = planned()
                except Exception as e:  # noqa: BLE001 - not a chain: a module at a time
                    if _stops_a_recomputation(e):
                        raise
                    del ran[:]
                    _set_rng_state(state)
                    return run_alone(0, args, kwargs, "the modules called in a chain raised %s: "
                                     "%s" % (type(e).__name__, e))
            # (Under torch.compile no RNG state was noted: none to rewind.)
            if len(ys) == len(inners) and (len(ran) == len(inners) or _compiling()):
                for i in range(1, len(ys)):
                    given = _passed_on(ys[i - 1])
                    expected = others
                    if sources.get(i) is not None:
                        expected = _seen(*_arguments_from(sources[i], args[1:], kwargs,
                                                          ys[i - 1]))
                    pending[i] = (given, _version(given), ys[i], ran[i] if ran else None,
                                  expected)
                if ran:
                    _set_rng_state(ran[0])
            del ran[:]
            if not _compiling():
                seen["first"] = (args[1:], kwargs)
                give(0, ys[0])
            return ys[0]

        def later(index):
            def forward(*args, **kwargs):
                if alone or learning["why"] is not None:
                    if self.failed is not None or not torch.is_grad_enabled():
                        return inners[index](*args, **kwargs)
                    if alone:
                        return run_alone(index, args, kwargs)
                    return learn(index, args, kwargs)
                ahead = pending.pop(index, None)
                if (ahead is not None and args and args[0] is ahead[0] and
                        _version(args[0]) == ahead[1] and _same(args[1:], kwargs, ahead[4])):
                    if ahead[3] is not None:
                        _set_rng_state(ahead[3])
                    return give(index, ahead[2]) if not _compiling() else ahead[2]
                if ahead is None:
                    return inners[index](*args, **kwargs)
                pending.clear()
                why = ("%s was called with something other than %s's output and %s's other "
                       "arguments, or with them changed in place"
                       % (names[index], names[index - 1], names[0]))
                if _compiling():
                    self._fail("%s: the segment %s..%s is not a chain in this model; the plan "
                               "was turned off" % (why, names[0], names[-1]))
                    return inners[index](*args, **kwargs)
                if (parts is None and not sources and args and args[0] is ahead[0] and
                        _version(args[0]) == ahead[1]):
                    # Its input is right, its other arguments are not the first module's: where
                    # do they come from? This call and the rest of the step say
                    # (each module under a checkpoint of its own meanwhile); the next first call
                    # takes it up.
                    learning["why"] = why
                    return learn(index, args, kwargs)
                return run_alone(index, args, kwargs, why)
            return forward

        self._set_forward(modules[0], first)
        for i in range(1, len(modules)):
            self._set_forward(modules[i], later(i))


# The modules an installed plan names (each mapped to the plan), and the forwards it installed
# (each mapped to its module), weakly both ways: a job's own checkpoint of one of them is left to
# the plan.
_PLANNED = weakref.WeakKeyDictionary()
_PLAN_FORWARDS = weakref.WeakKeyDictionary()
_CHECKPOINT_OPTIONS = ("use_reentrant", "context_fn", "determinism_check", "debug",
                       "preserve_rng_state", "early_stop")


def plan_deciding(function):
    """The installed plan (not turned off) that names the module `function` calls, else None.
    (Asked at every checkpoint call of a job: nothing more than an empty lookup while no plan is
    installed.)"""
    if not _PLANNED or getattr(function, "tidemark_plans_own", False):
        return None
    module = _module_called_by(function)
    ref = _PLANNED.get(module) if module is not None else None
    plan = ref() if ref is not None else None
    return plan if plan is not None and plan.failed is None else None


def _module_called_by(function, depth=0):
    """The module a job's checkpoint runs through `function`: the module, its bound forward or
    `__call__`, the forward a plan installed on it, any of these under `functools.partial`, or
    the one module a function of the job's own holds in its closure (older `transformers`'
    `create_custom_forward(layer)`, a `lambda h: layer(h)` over a loop's layer). None where it
    is none of these, or a closure holds more than one module (the job's checkpoint then covers
    more than the block, and stays)."""
    import functools
    import torch
    if isinstance(function, torch.nn.Module):
        return function
    owner = getattr(function, "__self__", None)
    if isinstance(owner, torch.nn.Module) and getattr(function, "__name__", "") in (
            "forward", "__call__"):
        return owner
    try:
        ref = _PLAN_FORWARDS.get(function)
    except TypeError:  # not weakly referable: no plan installed it
        ref = None
    if ref is not None:
        return ref()
    if depth > 0:
        return None
    if isinstance(function, functools.partial):
        return _module_called_by(function.func, depth + 1)
    modules = set()
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if isinstance(value, torch.nn.Module) or isinstance(
                getattr(value, "__self__", None), torch.nn.Module) or isinstance(
                value, functools.partial):
            module = _module_called_by(value, depth + 1)
            modules.add(module if module is not None else value)
    return modules.pop() if len(modules) == 1 else None


def without_checkpoint(function, args, kwargs):
    """`function` called as a checkpoint would call it, without the checkpoint."""
    return function(*args, **{k: v for k, v in kwargs.items() if k not in _CHECKPOINT_OPTIONS})


def _own_switches(table, names):
    """The modules among `names` and their ancestors whose own activation checkpointing is on:
    a `transformers` model's switch (`gradient_checkpointing_enable()` sets
    `gradient_checkpointing` on every layer since transformers 5, on the layers' container
    before). Under a plan that is off: a block the plan stores is stored, one it recomputes is
    checkpointed once."""
    found, seen = [], set()
    for name in names:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            m = table.get(".".join(parts[:k]))
            if m is None or id(m) in seen:
                continue
            seen.add(id(m))
            if getattr(m, "gradient_checkpointing", None) is True:
                found.append(m)
    return found


def apply_plan(model, plan, root_name=None, install=True, warn=True):
    """Applies a plan document (path, JSON text or dict) to ``model`` and returns an
    ``AppliedPlan``. Module names in the plan are qualified by the model's class name (or
    ``root_name``), as tidemark records them. Raises ``PlanError`` when the plan does not fit;
    the model is then unchanged. install=False checks the plan and returns it without wrapping
    anything (``install()`` does it later). warn: a plan that turns itself off, or runs other
    than its document says (``AppliedPlan.notes``), says so with a ``PlanWarning``."""
    doc = load_plan(plan)
    table = _module_table(model, root_name)
    # Resolve and check everything first, so that a refusal changes nothing.
    actions = []
    wrapped = set()
    for k, seg in enumerate(doc["segments"]):
        mode = seg["mode"]
        if mode == "store":
            for name in seg["modules"]:
                _find(table, name)
            continue
        if mode == "offload":
            if not _saved_tensor_hooks_supported():
                import torch
                raise PlanError("segments[%d]: offloading needs saved-tensor hooks (torch 1.10 "
                                "or newer; this is torch %s)" % (k, torch.__version__))
            for name in seg["modules"]:
                actions.append(_Action("offload", [_find(table, name)], [name], None, None,
                                       None))
            continue
        if mode == "selective":
            block = _find(table, seg["modules"][0])
            if seg.get("policy") is not None:
                where = "segments[%d] (%s)" % (k, seg["modules"][0])
                recorded = seg.get("input_bytes")
                actions.append(_Action("one", [block], [seg["modules"][0]],
                                       recorded if isinstance(recorded, int) else None, None,
                                       _save_policy_context(seg["policy"], where)))
                continue
            children = seg.get("recompute") or []
            if not children:
                raise PlanError("selective segment of %s names no modules to recompute"
                                % seg["modules"][0])
            # The children's inputs are not in the plan (only the block's): not checked.
            for name in children:
                actions.append(_Action("one", [_find(table, name)], [name], None, None, None))
            continue
        names = list(seg["modules"])
        modules = [_find(table, n) for n in names]
        # A chain's blocks are at one depth, none inside another (they may sit in several
        # containers called in turn, as a ResNet's layer1.1 and layer2.0).
        depths = {n.count(".") for n in names}
        if len(modules) > 1 and len(depths) != 1:
            raise PlanError("the segment %s..%s mixes modules of different depths (%s): its "
                            "modules cannot be a chain" % (names[0], names[-1], ", ".join(names)))
        parts = _inner_parts(seg, names, "segments[%d]" % k)
        if parts is not None and not _nested_checkpoints_supported():
            import torch
            raise PlanError("the plan nests recomputed segments (%s..%s), which needs nested "
                            "non-reentrant checkpoints: torch 2.1 or newer (this is torch %s); "
                            "make a plan without --nested" % (names[0], names[-1],
                                                              torch.__version__))
        recorded = seg.get("input_bytes")
        actions.append(_Action("one" if len(modules) == 1 else "chain", modules, names,
                               recorded if isinstance(recorded, int) else None, parts, None))
    for a in actions:
        for m, n in zip(a.modules, a.names):
            if id(m) in wrapped:
                raise PlanError("module %s appears twice in the plan" % n)
            wrapped.add(id(m))
    named = [n for seg in doc["segments"] for n in seg["modules"]]
    applied = AppliedPlan(doc, actions, warn, _own_switches(table, named),
                          [_find(table, n) for n in named])
    if install:
        applied.install()
        # The script's own (the adapter installs the plans it applies itself): under tidemark,
        # plan-check is told of it.
        from . import adapter
        if adapter._instance is not None:
            adapter._instance.jobs_own_plan(applied)
    return applied
