"""Trainings written the way users write them, each computing its own ground truth, independently
of tidemark, for test_patterns.py. Runs under `tidemark run` (it never imports tidemark).

  ema   a checkpointed GPT (reentrant) with an EMA copy of the model made by copy.deepcopy,
        gradients clipped by their inf norm before AdamW's step, and an evaluation pass of the
        model and of the EMA copy between steps and after the last one;
  gan   a generator and a discriminator with an optimizer each, the generator's images handed
        to the discriminator (detached for its step), targets of ones and zeros built in the step;
  zoo   a model with what real ones have: tied input and output embeddings, BatchNorm (its
        running statistics are buffers), a frozen layer, two parameter groups, gradients
        accumulated over two micro-batches per optimizer step;
  accumulate  a GPT whose every block runs under a non-reentrant checkpoint (torch 2's default
        form, whose recomputation stops early, inside a block, once it has made what the
        backward needs), gradients accumulated over two micro-batches per optimizer step;
  autocast  the GPT under torch.autocast (bfloat16 on the CPU): the copies of the weights it
        casts and keeps for backward, found in the autograd graph;
  helper  blocks that call a module of no model (made once, outside the model, shared by every
        block: as `transformers` makes modules of functions, `Func`), the model's output held by
        the loop through the backward;
  autocast_checkpoint  the GPT under torch.autocast with every block under a non-reentrant
        checkpoint: the checkpoint keeps none of the blocks' weight copies, autocast's cache holds
        them until its region exits (found by asking the cache for each weight again);
  lbfgs  a model trained by LBFGS: the forward and backward run in the closure handed to its
        step, up to four times a step (new gradients each time), and it keeps its history of
        directions and steps in lists of tensors, growing from step to step;
  autograd_grad  a model whose gradients the loop takes with torch.autograd.grad and hands to
        the optimizer itself (`p.grad = g`), as meta-learning and gradient-penalty loops do;
  forward_call  a model holding its parameters itself (no submodule: `F.linear` on them) whose
        forward the loop calls itself (`model.forward(x)`, which skips the model's hooks): no
        forward of a model begins the step;
  master_weights  a bfloat16 model trained through fp32 master copies of its weights (mixed
        precision by hand): the optimizer holds the copies, the loop moves gradients and weights
        between the two.

The truth names storages by address, with the CLOCK_MONOTONIC time they were seen at (the agent's
clock), and the time windows of the passes: the test finds the blocks and their categories.
"""
import argparse
import copy
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from tiny_gpt import TinyGPT, make_batch  # noqa: E402
from truth_train import storage  # noqa: E402


def now():
    return time.monotonic_ns()


def snapshot(tensors):
    return {"ts": now(), "storages": dict(storage(t) for t in tensors)}


def ema_run(steps):
    # A wide vocabulary: the head's gradient (512 KiB) stands out among the step's blocks, and so
    # does its |g| copy when the inf norm is taken.
    model = TinyGPT(vocab=2048, d_model=64, n_layers=4, seq_len=64, checkpointed=(1,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ema = copy.deepcopy(model).requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    batches = [make_batch(gen, 4, 64, 2048) for _ in range(steps)]
    val = make_batch(gen, 4, 64, 2048)
    truth = {"params": snapshot(model.parameters()),
             "ema": snapshot(list(ema.parameters()) + list(ema.buffers())),
             "steps": [], "evals": []}

    def evaluate():
        model.eval()
        ema.eval()
        losses = []
        with torch.no_grad():
            for m in (model, ema):
                begin = now()
                losses.append(m(*val).item())
                truth["evals"].append([begin, now()])
        model.train()
        return losses

    for i, (x, y) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        backward_begin = now()
        loss.backward()
        backward_end = now()
        grads = snapshot(p.grad for p in model.parameters())
        clip_begin = now()
        # The norm it returns is kept (to the next step): what is born and dies here is scratch.
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=float("inf"))
        clip_end = now()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
        truth["steps"].append({"loss": loss.item(), "grads": grads, "norm": norm.item(),
                               "backward": [backward_begin, backward_end],
                               "clip": [clip_begin, clip_end],
                               "largest_grad": max(g for g in grads["storages"].values())})
        evaluate()  # between steps, and after the last one
    return truth


def accumulate_run(steps):
    model = TinyGPT(vocab=256, d_model=64, n_layers=4, seq_len=32, checkpointed=(0, 1, 2, 3),
                    reentrant=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    truth = {"steps": []}
    for _ in range(steps):
        forwards = []
        for _ in range(2):  # micro-batches
            x, y = make_batch(gen, 4, 32, 256)
            begin = now()
            loss = model(x, y) / 2
            forwards.append([begin, now()])
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        truth["steps"].append({"forwards": forwards})
    return truth


def weight_casts(loss, params):
    """{address: [bytes, parameter name]} of the saved tensors that are casts of parameters (a
    saved tensor whose node leads, through views, to a ToCopyBackward of a parameter)."""
    names = {id(p): n for n, p in params}
    out, seen, stack = {}, set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for attr in dir(fn):
            if attr.startswith("_saved_"):
                try:
                    v = getattr(fn, attr)
                except Exception:
                    continue
                if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 and v.grad_fn:
                    g = v.grad_fn
                    for _ in range(3):
                        if g is None or type(g).__name__.startswith("ToCopyBackward"):
                            break
                        g = g.next_functions[0][0] if len(g.next_functions) == 1 else None
                    if g is not None and type(g).__name__.startswith("ToCopyBackward"):
                        var = getattr(g.next_functions[0][0], "variable", None)
                        if var is not None and id(var) in names:
                            ptr, n = storage(v)
                            out[ptr] = [n, names[id(var)]]
        stack.extend(n for n, _ in fn.next_functions)
    return out


def autocast_run(steps):
    model = TinyGPT(vocab=256, d_model=64, n_layers=2, seq_len=32, checkpointed=())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    truth = {"params": snapshot(model.parameters()), "steps": []}
    for _ in range(steps):
        x, y = make_batch(gen, 4, 32, 256)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        casts = weight_casts(loss, model.named_parameters())
        truth["steps"].append({"casts": {"ts": now(), "storages": {a: c[0] for a, c in
                                                                   casts.items()},
                                         "names": {a: c[1] for a, c in casts.items()}}})
        loss.backward()
        opt.step()
    return truth


def autocast_checkpoint_run(steps):
    model = TinyGPT(vocab=256, d_model=64, n_layers=2, seq_len=32, checkpointed=(0, 1),
                    reentrant=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    in_blocks = [(n, p) for n, p in model.named_parameters()
                 if n.startswith("blocks.") and p.dim() == 2]
    truth = {"steps": []}
    for _ in range(steps):
        x, y = make_batch(gen, 4, 32, 256)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
            # Each block weight's bfloat16 copy is in autocast's cache until the region exits: a
            # linear with the weight gets it again, and saves it (behind hooks of the test's own,
            # which keep it as it is and hand nothing to anyone else's).
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                probes = [F.linear(torch.zeros(1, p.size(1), requires_grad=True), p)
                          for _, p in in_blocks]
                casts = weight_casts(sum(q.sum() for q in probes), in_blocks)
            ts = now()
            del probes
        truth["steps"].append({"casts": {"ts": ts, "exit": now(),
                                         "storages": {a: c[0] for a, c in casts.items()},
                                         "names": {a: c[1] for a, c in casts.items()}}})
        loss.backward()
        opt.step()
    return truth


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


SWISH = Swish()  # not in any model's modules


class HelperBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(SWISH(self.up(x)))


def helper_run(steps):
    model = nn.Sequential(HelperBlock(64), HelperBlock(64))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    truth = {"steps": []}
    for _ in range(steps):
        opt.zero_grad()
        # The output (logits over 64 classes) held by the loop through the backward, which does
        # not save it (cross entropy keeps its log-softmax).
        out = model(torch.randn(16, 64))
        F.cross_entropy(out, torch.randint(0, 64, (16,))).backward()
        truth["steps"].append({"output": snapshot([out])})
        opt.step()
    return truth


class Zoo(nn.Module):
    def __init__(self, vocab=512, d=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(d, 2 * d), nn.BatchNorm1d(2 * d), nn.ReLU(),
                                  nn.Linear(2 * d, d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens, targets):
        h = self.body(self.frozen(self.embed(tokens)))
        return F.cross_entropy(self.head(h), targets)


def state_storages(opt):
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def zoo_run(steps):
    model = Zoo()
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() > 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": [p for p in trainable if p.dim() <= 1],
                              "weight_decay": 0.0}], lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    truth = {"weights": snapshot(list(model.parameters()) + list(model.buffers())), "steps": []}
    for step in range(steps):
        if step == 1:
            # A weight's storage replaced between steps (as `p.data = ...` does): the new block
            # is the weight from then on (the adapter tags it again: its storage moved).
            with torch.no_grad():
                decay[0].data = decay[0].data.clone()
        if step == 2:
            # A buffer and a parameter replaced by new tensors (a module's attribute assigned):
            # the new ones are weights from then on (the adapter walks the model again).
            with torch.no_grad():
                model.body[1].running_var = model.body[1].running_var.clone()
                model.frozen.weight = nn.Parameter(model.frozen.weight.clone(),
                                                   requires_grad=False)
        for _ in range(2):  # micro-batches
            tokens = torch.randint(0, 512, (32,), generator=gen)
            loss = model(tokens, tokens.roll(1)) / 2
            loss.backward()
        opt.step()
        # Right after the optimizer: every gradient and state tensor, and the step ends here.
        truth["steps"].append({"grads": snapshot(p.grad for p in trainable),
                               "optimizer": snapshot(state_storages(opt)),
                               "frozen_grads": [p.grad is None for p in
                                                model.frozen.parameters()]})
        opt.zero_grad(set_to_none=True)
    return truth


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def lbfgs_run(steps):
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8))
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 64, generator=gen), torch.randn(128, 8, generator=gen)
    truth = {"steps": []}

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
        # Right after the optimizer: the gradients of its last closure, and its state (lists
        # of tensors included).
        # (No list of them kept here: the next step's own would be held through it.)
        truth["steps"].append({"grads": snapshot(p.grad for p in model.parameters()),
                               "optimizer": snapshot(t for st in opt.state.values()
                                                     for v in st.values()
                                                     for t in tensors_in(v))})
    return truth


def autograd_grad_run(steps):
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 16))
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    truth = {"steps": []}
    for _ in range(steps):
        x, y = torch.randn(256, 256, generator=gen), torch.randn(256, 16, generator=gen)
        opt.zero_grad(set_to_none=True)
        grads = torch.autograd.grad(F.mse_loss(model(x), y), params)
        for p, g in zip(params, grads):
            p.grad = g
        del grads
        opt.step()
        truth["steps"].append({"grads": snapshot(p.grad for p in params)})
    return truth


class FunctionalMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(1024, 256) / 16)
        self.w2 = nn.Parameter(torch.randn(16, 1024) / 32)

    def forward(self, x):
        return F.linear(F.relu(F.linear(x, self.w1)), self.w2)


def forward_call_run(steps):
    model = FunctionalMLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    truth = {"steps": []}
    for _ in range(steps):
        x, y = torch.randn(256, 256, generator=gen), torch.randn(256, 16, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model.forward(x), y)
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        loss.backward()
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        opt.step()
        truth["steps"].append({"backward": [before, after],
                               "grads": snapshot(p.grad for p in model.parameters()),
                               "weights": snapshot(model.parameters())})
    return truth


def master_weights_run(steps):
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64)).to(torch.bfloat16)
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    opt = torch.optim.Adam(master, lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    truth = {"steps": []}
    for _ in range(steps):
        x = torch.randn(64, 64, generator=gen).to(torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(m)
        truth["steps"].append({"weights": snapshot(list(model.parameters()) + master)})
    return truth


class Generator(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh())


class Discriminator(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))


def gan_run(steps):
    g, d = Generator(), Discriminator()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4)
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4)
    criterion = nn.BCEWithLogitsLoss()
    reals = [torch.randn(32, 784) for _ in range(steps)]
    truth = {"steps": []}
    for real in reals:
        noise = torch.randn(32, 16)
        fake = g(noise)
        ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
        # The discriminator's step: real images against the generator's, detached.
        loss_d = criterion(d(real), ones) + criterion(d(fake.detach()), zeros)
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        # The generator's step, through the discriminator (a functional loss this time).
        loss_g = F.binary_cross_entropy_with_logits(d(fake), ones)
        opt_g.zero_grad()
        loss_g.backward()
        targets = snapshot([ones, zeros])
        opt_g.step()
        truth["steps"].append({"loss_d": loss_d.item(), "loss_g": loss_g.item(),
                               "fake": snapshot([fake]), "real": snapshot([real, noise]),
                               "targets": targets})
    return truth


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pattern", choices=["ema", "gan", "autocast", "autocast_checkpoint", "zoo",
                                         "accumulate", "helper", "lbfgs", "autograd_grad",
                                         "forward_call", "master_weights"],
                   required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    truth = {"ema": ema_run, "gan": gan_run, "autocast": autocast_run,
             "autocast_checkpoint": autocast_checkpoint_run, "zoo": zoo_run,
             "accumulate": accumulate_run, "helper": helper_run,
             "lbfgs": lbfgs_run, "autograd_grad": autograd_grad_run,
             "forward_call": forward_call_run,
             "master_weights": master_weights_run}[args.pattern](args.steps)
    with open(args.out, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main()
