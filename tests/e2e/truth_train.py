"""A training run that also computes, independently of tidemark, the ground truth the end-to-end
tests check tidemark's breakdown against. Runs under `tidemark run` (it never imports tidemark).

For every step it records the storages (address -> bytes) of:
  params      the model's parameters
  grads       the .grad tensors after backward
  optimizer   the optimizer's state tensors after the step
  saved       the tensors saved for backward, read from the autograd graph after forward
              (excluding parameters, the batch and the checkpoint inputs)
  ckpt_inputs the inputs of the checkpointed blocks
--model gpt2: a GPT-2 of the `transformers` library (torch 2), every layer checkpointed by its own
switch (non-reentrant): the regions are marked around each layer's checkpoint function.
The GPT's checkpointed blocks run under reentrant checkpoints (--checkpoint reentrant), or on
torch 2 non-reentrant ones (nonreentrant), or selective activation checkpointing with a policy
saving the matrix products (sac). Inside a non-reentrant region autograd keeps the checkpoint's
holders, not tensors: the walk leaves out the nodes made there (known by their sequence numbers)
and counts what the SAC policy saved instead (the outputs it was asked about).
Each set carries the CLOCK_MONOTONIC time it was taken at (the agent's clock): the test finds the
block that held each address at that time, then asks whether that block was live at the peak.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from tiny_gpt import TinyGPT, make_batch  # noqa: E402


def storage(t):
    try:
        s = t.untyped_storage()
    except AttributeError:
        s = t.storage()
    try:
        n = s.nbytes()
    except AttributeError:
        n = s.size() * s.element_size()
    return s.data_ptr(), n


class ConvNet(nn.Module):
    """Structurally unlike the GPT: convolutions, GroupNorm, residual stages run through
    checkpoint_sequential, trained with SGD + momentum."""

    def __init__(self, channels=32, stages=4):
        super().__init__()
        # A wide stem that is not checkpointed: its saved activations live until the very end of
        # backward, so they are part of the peak (which comes while a stage is recomputed).
        self.stem = nn.Sequential(nn.Conv2d(3, 2 * channels, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(2 * channels, channels, 3, padding=1))
        self.stages = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(4, channels),
                          nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU())
            for _ in range(stages)])
        self.head = nn.Linear(channels, 10)
        self.segments = stages  # checkpoint every stage but the last

    def forward(self, x, y):
        h = torch.relu(self.stem(x))
        h = checkpoint_sequential(self.stages, self.segments, h)
        logits = self.head(h.mean(dim=(2, 3)))
        return nn.functional.cross_entropy(logits, y)

    def checkpointed_modules(self):
        return list(self.stages)[:-1]


def next_sequence_nr():
    """The sequence number the next autograd node made on this thread gets."""
    with torch.enable_grad():
        return torch.zeros(1, requires_grad=True).sum().grad_fn._sequence_nr() + 1


class CheckpointedGPT(TinyGPT):
    """The GPT with its checkpointed blocks run under the given checkpoint form; records the
    sequence numbers of the nodes made inside non-reentrant regions, and what SAC saved."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        self.regions = []     # [first, last) sequence numbers of non-reentrant regions' nodes
        self.sac_saved = {}   # address -> bytes of the outputs the SAC policy saved

    def sac_policy(self, ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy
        save = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                      torch.ops.aten.bmm.default)
        if save and not ctx.is_recompute:
            for t in (ctx.op_output if isinstance(ctx.op_output, (tuple, list))
                      else [ctx.op_output]):
                if isinstance(t, torch.Tensor):
                    ptr, n = storage(t)
                    self.sac_saved[ptr] = n
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    def forward(self, idx, targets):
        import functools
        from torch.utils.checkpoint import checkpoint
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t))
        for i, block in enumerate(self.blocks):
            if i not in self.checkpointed or not self.training:
                x = block(x)
            elif self.form == "reentrant":
                x = checkpoint(block, x, use_reentrant=True)
            else:
                kwargs = {}
                if self.form == "sac":
                    from torch.utils.checkpoint import create_selective_checkpoint_contexts
                    kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                             self.sac_policy)
                first = next_sequence_nr()
                x = checkpoint(block, x, use_reentrant=False, **kwargs)
                self.regions.append((first, next_sequence_nr() - 1))
        logits = self.head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                 targets.view(-1))


def marked_region(checkpoint_fn, regions):
    """checkpoint_fn, recording the sequence numbers of the nodes made inside its region."""
    def run(*args, **kwargs):
        first = next_sequence_nr()
        out = checkpoint_fn(*args, **kwargs)
        regions.append((first, next_sequence_nr() - 1))
        return out
    return run


def saved_storages(loss, regions=()):
    """Storages saved for backward, found by walking the autograd graph from the loss (leaving
    out the nodes of non-reentrant checkpoint regions: their saved values are the checkpoint's)."""
    out = {}
    seen = set()
    stack = [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        nr = fn._sequence_nr() if hasattr(fn, "_sequence_nr") else -1
        inside = any(first <= nr < last for first, last in regions)
        if "CheckpointFunction" not in type(fn).__name__ and not inside:
            # Built-in nodes keep them as _saved_<name>; an autograd.Function's node (a compiled
            # graph's, under torch.compile) as saved_tensors.
            for attr in dir(fn):
                if not attr.startswith("_saved_") and attr != "saved_tensors":
                    continue
                try:
                    value = getattr(fn, attr)
                except Exception:
                    continue
                values = value if isinstance(value, (tuple, list)) else [value]
                for v in values:
                    if isinstance(v, torch.Tensor) and v.layout == torch.strided:
                        ptr, n = storage(v)
                        if ptr:
                            out[ptr] = n
        for nxt, _ in fn.next_functions:
            stack.append(nxt)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["gpt", "convnet", "gpt2"], default="gpt")
    p.add_argument("--checkpoint", choices=["reentrant", "nonreentrant", "sac"],
                   default="reentrant", help="the GPT's checkpoint form")
    p.add_argument("--compile", choices=["none", "whole", "blocks"], default="none",
                   help="the GPT (no checkpoints then) under torch.compile, whole or per block")
    p.add_argument("--optimizer", choices=["default", "foreach", "fused"], default="default",
                   help="AdamW's implementation (torch 2: for-each over the tensor lists, or fused)")
    p.add_argument("--keep-grads", action="store_true",
                   help="zero_grad(set_to_none=False): the gradients live on, zeroed")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    optimizer_kwargs = {} if args.optimizer == "default" else {args.optimizer: True}
    if args.model == "gpt":
        model = CheckpointedGPT(args.checkpoint, d_model=64, n_layers=4, seq_len=64,
                                checkpointed=(1, 3) if args.compile == "none" else ())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **optimizer_kwargs)
        gen = torch.Generator().manual_seed(0)
        batches = [make_batch(gen, 4, 64, 256) for _ in range(args.steps)]
        ckpt_modules = [model.blocks[i] for i in sorted(model.checkpointed)]
    elif args.model == "gpt2":
        sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
        from train import build_gpt2
        model = build_gpt2(argparse.Namespace(seq_len=64, d_model=64, layers=4, checkpoint="all"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **optimizer_kwargs)
        gen = torch.Generator().manual_seed(0)
        batches = [make_batch(gen, 4, 64, 256) for _ in range(args.steps)]
        ckpt_modules = list(model.transformer.h)
        model.regions, model.sac_saved = [], {}
        for layer in ckpt_modules:
            layer._gradient_checkpointing_func = marked_region(
                layer._gradient_checkpointing_func, model.regions)
    else:
        model = ConvNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        batches = [(torch.randn(8, 3, 24, 24), torch.randint(0, 10, (8,)))
                   for _ in range(args.steps)]
        ckpt_modules = model.checkpointed_modules()

    collecting = {"on": False, "inputs": {}}

    def record_input(module, inputs):
        if collecting["on"]:
            for t in inputs:
                if isinstance(t, torch.Tensor):
                    ptr, n = storage(t)
                    collecting["inputs"][ptr] = n

    for m in ckpt_modules:
        m.register_forward_pre_hook(record_input)

    def snapshot(storages):
        return {"ts": time.monotonic_ns(), "storages": storages}

    forward = model
    if args.compile == "whole":
        forward = torch.compile(model)
    elif args.compile == "blocks":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block)
    params = snapshot(dict(storage(prm) for prm in model.parameters()))
    steps = []
    for x, y in batches:
        opt.zero_grad(**({"set_to_none": False} if args.keep_grads else {}))
        collecting["on"], collecting["inputs"] = True, {}
        regions = getattr(model, "regions", [])
        sac_saved = getattr(model, "sac_saved", {})
        regions.clear()
        sac_saved.clear()
        loss = model(input_ids=x, labels=x).loss if args.model == "gpt2" else forward(x, y)
        collecting["on"] = False
        batch = dict(storage(t) for t in (x, y))
        found = saved_storages(loss, regions)
        found.update(sac_saved)
        saved = snapshot({ptr: n for ptr, n in found.items()
                          if ptr not in params["storages"] and ptr not in batch and
                          ptr not in collecting["inputs"]})
        loss.backward()
        grads = snapshot(dict(storage(q.grad) for q in model.parameters() if q.grad is not None))
        opt.step()
        state = {}
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    ptr, n = storage(v)
                    state[ptr] = n
        steps.append({"loss": loss.item(), "saved": saved, "grads": grads,
                      "optimizer": snapshot(state),
                      "ckpt_inputs": dict(collecting["inputs"]), "batch": batch})
    with open(args.out, "w") as f:
        json.dump({"params": params, "steps": steps}, f)


if __name__ == "__main__":
    main()
