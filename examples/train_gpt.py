"""Trains the small GPT of tiny_gpt.py for a few steps on the CPU with AdamW, some blocks under
activation checkpointing. Nothing here knows about tidemark: run it under `tidemark run` to
profile it.

    tidemark run -- python3 examples/train_gpt.py --steps 4
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_gpt import TinyGPT, make_batch  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--checkpoint", default="1,3,5",
                   help="comma-separated block indices to checkpoint ('' for none)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    ckpt = tuple(int(i) for i in args.checkpoint.split(",") if i != "")
    model = TinyGPT(d_model=args.d_model, n_layers=args.layers, seq_len=args.seq_len,
                    checkpointed=ckpt)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    n_params = sum(p.numel() for p in model.parameters())
    print("model: %d parameters, %d bytes; checkpointed blocks: %s"
          % (n_params, sum(p.numel() * p.element_size() for p in model.parameters()),
             ",".join(map(str, ckpt)) or "none"), flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        idx, targets = make_batch(gen, args.batch, args.seq_len, 256)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        print("step %d loss %.4f (%.0f ms)" % (step, loss.item(), 1e3 * (time.perf_counter() - t0)),
              flush=True)


if __name__ == "__main__":
    main()
