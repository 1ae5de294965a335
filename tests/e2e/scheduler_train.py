"""Trains a small model once per learning-rate scheduler of torch.optim.lr_scheduler (and with
GradScaler, swa_utils, an optimizer state_dict round trip, a subclassed optimizer), printing every
step's loss and learning rate, so that a run under tidemark can be compared with a plain one
digit for digit. Knows nothing of tidemark.

    python3 scheduler_train.py                     # every case, one after the other
    python3 scheduler_train.py --gate DIR          # schedulers created before an attach (and
                                                   # stepped across it), while attached and after
                                                   # the detach: prints "gate NAME" and waits for
                                                   # DIR/go.NAME (attached, then detached)

Every scheduler class torch has must have a case here: a class without one fails the run (so a
newer torch's scheduler is not silently left untested).
"""
import argparse
import copy
import io
import os
import sys
import time

import torch
from torch.optim import lr_scheduler as S


def scheduler_cases():
    """name -> (make_optimizer(params), make_scheduler(opt)), one per scheduler class of torch."""
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)
    adam = lambda p: torch.optim.Adam(p, lr=0.01)
    cases = {
        "LambdaLR": (sgd, lambda o: S.LambdaLR(o, lambda e: 0.9 ** e)),
        "MultiplicativeLR": (sgd, lambda o: S.MultiplicativeLR(o, lambda e: 0.95)),
        "StepLR": (sgd, lambda o: S.StepLR(o, step_size=2, gamma=0.5)),
        "MultiStepLR": (sgd, lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.3)),
        "ConstantLR": (sgd, lambda o: S.ConstantLR(o, factor=0.5, total_iters=2)),
        "LinearLR": (sgd, lambda o: S.LinearLR(o, start_factor=0.2, total_iters=3)),
        "ExponentialLR": (adam, lambda o: S.ExponentialLR(o, gamma=0.8)),
        "PolynomialLR": (sgd, lambda o: S.PolynomialLR(o, total_iters=4, power=2.0)),
        "CosineAnnealingLR": (adam, lambda o: S.CosineAnnealingLR(o, T_max=4)),
        "CosineAnnealingWarmRestarts": (sgd, lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2)),
        "CyclicLR": (sgd, lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=2)),
        "OneCycleLR": (sgd, lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=10)),
        "ReduceLROnPlateau": (sgd, lambda o: S.ReduceLROnPlateau(o, patience=0, factor=0.5)),
        "SequentialLR": (sgd, lambda o: S.SequentialLR(
            o, [S.ConstantLR(o, factor=0.5, total_iters=2), S.ExponentialLR(o, gamma=0.9)],
            milestones=[2])),
        "ChainedScheduler": (sgd, lambda o: S.ChainedScheduler(
            [S.ConstantLR(o, factor=0.5, total_iters=2), S.ExponentialLR(o, gamma=0.9)])),
    }
    base = getattr(S, "LRScheduler", None) or S._LRScheduler
    known = [n for n, c in vars(S).items() if isinstance(c, type) and not n.startswith("_") and
             (issubclass(c, base) or n == "ReduceLROnPlateau") and c is not base and
             n not in ("LRScheduler",)]
    missing = sorted(set(known) - set(cases))
    if missing:
        raise SystemExit("scheduler_train.py has no case for %s" % ", ".join(missing))
    return cases


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class ClippingSGD(torch.optim.SGD):
    """A user's optimizer that overrides step and calls the parent's."""

    def step(self, closure=None):
        for g in self.param_groups:
            torch.nn.utils.clip_grad_norm_(g["params"], 1.0)
        return super().step(closure)


def batches(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(n)]


def train(name, make_opt, make_sched, steps=6, seed=0, extra=None):
    """A generator: one training step per next(); prints the step's loss and learning rates."""
    torch.manual_seed(seed)
    model = Model()
    opt = make_opt(model.parameters())
    sched = make_sched(opt) if make_sched else None
    scaler = torch.cuda.amp.GradScaler(enabled=False) if extra == "scaler" else None
    swa = torch.optim.swa_utils.AveragedModel(model) if extra == "swa" else None
    swa_sched = torch.optim.swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=2) if swa else None
    for i, (x, y) in enumerate(batches(seed, steps)):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if isinstance(sched, S.ReduceLROnPlateau):
            sched.step(loss.item())
        elif sched is not None:
            sched.step()
        if swa is not None:
            swa.update_parameters(model)
            swa_sched.step()
        if extra == "state_dict" and i == 2:
            # Save and load the optimizer's state mid-run, as a checkpoint/resume would.
            buf = io.BytesIO()
            torch.save({"opt": opt.state_dict(), "model": model.state_dict()}, buf)
            buf.seek(0)
            saved = torch.load(buf)
            opt2 = make_opt(model.parameters())
            opt2.load_state_dict(saved["opt"])
            opt = opt2
            copy.deepcopy(opt.state_dict())
        lrs = ",".join("%.8g" % g["lr"] for g in opt.param_groups)
        print("%s step %d loss %.8f lr %s" % (name, i, loss.item(), lrs), flush=True)
        yield
    if swa is not None:
        with torch.no_grad():
            print("%s swa %.8f" % (name, swa.module.b.bias.item()), flush=True)


def all_cases(tag, only):
    """Fresh trainings (generators) of every case, named tag + case."""
    cases = scheduler_cases()
    out = []
    for n, (make_opt, make_sched) in cases.items():
        out.append((n, train(tag + n, make_opt, make_sched)))
    out.append(("subclass", train(tag + "subclass", lambda p: ClippingSGD(p, lr=0.1),
                                  lambda o: S.StepLR(o, step_size=2, gamma=0.5))))
    for e in ("scaler", "swa", "state_dict"):
        out.append((e, train(tag + e, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                             lambda o: S.StepLR(o, step_size=2, gamma=0.5), extra=e)))
    return [t for n, t in out if not only or n in only]


def run_out(trainings, steps=None):
    """Runs every training for `steps` more steps (None: to its end)."""
    for t in trainings:
        for _ in (range(steps) if steps is not None else iter(int, 1)):
            if next(t, "end") == "end":
                break


def gate(directory, name):
    print("gate %s" % name, flush=True)
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(directory, "go." + name)):
        if time.time() > deadline:
            raise SystemExit("no go.%s within 300 s" % name)
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gate", help="attach phases: wait for DIR/go.attached and DIR/go.detached")
    p.add_argument("--only", help="comma-separated case names")
    args = p.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if not args.gate:
        run_out(all_cases("", only))
    else:
        # Schedulers created before the attach, stepped before and after it; then fresh ones
        # created while attached, and fresh ones after the detach.
        before = all_cases("before:", only)
        run_out(before, 3)
        gate(args.gate, "attached")
        run_out(before)
        run_out(all_cases("attached:", only))
        gate(args.gate, "detached")
        run_out(all_cases("detached:", only))
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
