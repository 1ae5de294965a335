"""A data-parallel training (torch.distributed, gloo, CPU) for the job tests: one process per
rank, started by torchrun or by the test itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as
cluster launch scripts do). Never imports tidemark. Each rank writes what the test checks the
job's figures against, counted here: its parameters' and its optimizer state's bytes, its batch,
its losses.

--big-rank R --big-batch B: rank R trains on batches of B rows instead of --batch (an uneven job:
its activations, so its peak, are the largest). --model gpt: the examples' GPT (blocks a recompute
plan can checkpoint) instead of the MLP, each step printed as `step N loss L`.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import sys

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from tiny_gpt import TinyGPT, make_batch  # noqa: E402


def storage_bytes(t):
    try:
        s = t.untyped_storage()
    except AttributeError:
        s = t.storage()
    try:
        return s.data_ptr(), s.nbytes()
    except AttributeError:
        return s.data_ptr(), s.size() * s.element_size()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--big-rank", type=int, default=-1)
    p.add_argument("--big-batch", type=int, default=0)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    if args.model == "gpt":
        model = TinyGPT(n_layers=4)
    else:
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    batch = args.big_batch if rank == args.big_rank else args.batch
    gen = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        if args.model == "gpt":
            idx, targets = make_batch(gen, batch // 8 or 1, 128, 256)
            loss = ddp(idx, targets)
        else:
            x = torch.randn(batch, 256, generator=gen)
            y = torch.randint(0, 10, (batch,), generator=gen)
            loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if args.model == "gpt":
            print("step %d loss %.6f" % (step, loss.item()), flush=True)
    # Saved-tensor hooks still on between steps would be copied into the barrier's work below,
    # which gloo's thread may drop during the interpreter's exit: the process then aborts
    # (torch 2 can say whether any are on; torch 1.13 cannot: None).
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks_between_steps = None if top is None else top(False) is not None
    params = {storage_bytes(p)[0]: storage_bytes(p)[1] for p in model.parameters()}
    state = {}
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                address, nbytes = storage_bytes(v)
                state[address] = nbytes
    with open(os.path.join(args.out_dir, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "world_size": world, "pid": os.getpid(), "batch": batch,
                   "param_bytes": sum(params.values()), "optimizer_bytes": sum(state.values()),
                   "losses": losses, "hooks_between_steps": hooks_between_steps,
                   # Equal on every rank when the gradients were all-reduced (DDP).
                   "param_sum": float(sum(p.detach().double().sum() for p in model.parameters()))},
                  f)
    dist.barrier()
    dist.destroy_process_group()
    # torch 2 keeps the last backward's context variables in the thread's state
    # (`_engine_run_backward` stashes them), which gloo's works copy: a work that gloo's thread
    # drops once the interpreter has begun its exit needs the interpreter to let it go, and the
    # process aborts ("terminate called without an active exception", in
    # ProcessGroupGloo::runLoop) — without tidemark as well: 1 run in 8 and 2 in 12 of this script
    # under torchrun on a busy 2-core machine. The interpreter waits a moment for gloo's threads
    # before its exit (not the recording's business).
    time.sleep(0.5)


if __name__ == "__main__":
    main()
