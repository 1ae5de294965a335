"""Applying a recompute plan (docs/plan-format.md) to a PyTorch model.

    import tidemark
    applied = tidemark.apply_plan(model, "plan.json")   # wraps the plan's modules
    ...                                                 # train as usual
    applied.remove()                                    # back to storing everything

A ``recompute`` segment of one module runs that module under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` (RNG state preserved). A segment of
several modules (blocks called one after another, each on the previous one's output) runs all of
them inside one checkpoint from the first module's call; the later modules then hand their input
through. A ``selective`` segment checkpoints the child modules the plan names. ``store`` segments
are left alone. A plan that does not fit the model (unknown module, a segment whose modules are not
siblings called in a chain) is refused with ``PlanError`` before anything changes.
"""
import json

PLAN_FORMAT = "tidemark-plan"
PLAN_VERSION = 1


class PlanError(ValueError):
    """The plan cannot be applied to this model; the message says why."""


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
        if seg.get("mode") not in ("store", "recompute", "selective"):
            raise PlanError("segments[%d]: mode %r is not store, recompute or selective"
                            % (i, seg.get("mode")))
        if not seg.get("modules"):
            raise PlanError("segments[%d]: no modules" % i)
    return doc


def _module_table(model, root_name):
    """Qualified name -> module, with the names the recording used ("TinyGPT.blocks.3")."""
    prefix = root_name or type(model).__name__
    table = {}
    for sub, m in model.named_modules():
        table[prefix + ("." + sub if sub else "")] = m
    return table


def _find(table, name):
    m = table.get(name)
    if m is None:
        near = sorted(n for n in table if n.rsplit(".", 1)[0] == name.rsplit(".", 1)[0])[:6]
        raise PlanError("the plan does not fit this model: it has no module %s%s"
                        % (name, " (it has %s)" % ", ".join(near) if near else ""))
    return m


def _checkpoint():
    # Looked up at call time: under `tidemark run` the adapter's wrapper marks the recompute phase.
    import torch.utils.checkpoint as ckpt
    return ckpt.checkpoint


class AppliedPlan:
    """The wrapped modules of one applied plan; ``remove()`` restores them."""

    def __init__(self, doc):
        self.plan = doc
        self._restore = []  # (module, had_own_forward, previous_forward)

    def _set_forward(self, module, forward):
        own = "forward" in module.__dict__
        self._restore.append((module, own, module.__dict__.get("forward")))
        module.forward = forward

    def remove(self):
        for module, own, previous in reversed(self._restore):
            if own:
                module.forward = previous
            else:
                module.__dict__.pop("forward", None)
        self._restore = []

    # One module under checkpoint.
    def wrap_one(self, module):
        import torch
        inner = module.forward

        def forward(*args, **kwargs):
            if not torch.is_grad_enabled():
                return inner(*args, **kwargs)
            return _checkpoint()(inner, *args, use_reentrant=False, **kwargs)

        self._set_forward(module, forward)

    # Several sibling modules, called in a chain, under one checkpoint.
    def wrap_chain(self, modules, names):
        import torch
        inners = [m.forward for m in modules]
        # The tensor the first module returned, which each later module must receive (and hands
        # on), and how many later modules are still to come in this pass.
        state = {"expect": None, "left": 0}

        def run(*args, **kwargs):
            y = inners[0](*args, **kwargs)
            for inner in inners[1:]:
                y = inner(y)
            return y

        def first(*args, **kwargs):
            if state["left"]:
                state["expect"], state["left"] = None, 0
                raise RuntimeError(
                    "tidemark plan: %s ran again before the rest of its segment; the segment "
                    "%s..%s is not a chain in this model" % (names[0], names[0], names[-1]))
            if not torch.is_grad_enabled():
                return inners[0](*args, **kwargs)
            y = _checkpoint()(run, *args, use_reentrant=False, **kwargs)
            state["expect"], state["left"] = y, len(inners) - 1
            return y

        def later(index):
            def forward(*args, **kwargs):
                if not state["left"]:
                    return inners[index](*args, **kwargs)
                if len(args) != 1 or kwargs or args[0] is not state["expect"]:
                    state["left"] = 0
                    raise RuntimeError(
                        "tidemark plan: %s was called with something other than %s's output; "
                        "the segment %s..%s is not a chain in this model"
                        % (names[index], names[index - 1], names[0], names[-1]))
                state["left"] -= 1
                if not state["left"]:
                    state["expect"] = None
                return args[0]
            return forward

        self._set_forward(modules[0], first)
        for i in range(1, len(modules)):
            self._set_forward(modules[i], later(i))


def apply_plan(model, plan, root_name=None):
    """Applies a plan document (path, JSON text or dict) to ``model`` and returns an
    ``AppliedPlan``. Module names in the plan are qualified by the model's class name (or
    ``root_name``), as tidemark records them. Raises ``PlanError`` when the plan does not fit;
    the model is then unchanged."""
    doc = load_plan(plan)
    table = _module_table(model, root_name)
    # Resolve and check everything first, so that a refusal changes nothing.
    actions = []
    wrapped = set()
    for seg in doc["segments"]:
        mode = seg["mode"]
        if mode == "store":
            for name in seg["modules"]:
                _find(table, name)
            continue
        if mode == "selective":
            _find(table, seg["modules"][0])
            children = seg.get("recompute") or []
            if not children:
                raise PlanError("selective segment of %s names no modules to recompute"
                                % seg["modules"][0])
            for name in children:
                actions.append(("one", [_find(table, name)], [name]))
            continue
        names = list(seg["modules"])
        modules = [_find(table, n) for n in names]
        parents = {n.rsplit(".", 1)[0] for n in names}
        if len(modules) > 1 and len(parents) != 1:
            raise PlanError("the segment %s..%s spans modules of different parents"
                            % (names[0], names[-1]))
        actions.append(("one" if len(modules) == 1 else "chain", modules, names))
    for _, modules, names in actions:
        for m, n in zip(modules, names):
            if id(m) in wrapped:
                raise PlanError("module %s appears twice in the plan" % n)
            wrapped.add(id(m))
    applied = AppliedPlan(doc)
    for kind, modules, names in actions:
        if kind == "one":
            applied.wrap_one(modules[0])
        else:
            applied.wrap_chain(modules, names)
    return applied
