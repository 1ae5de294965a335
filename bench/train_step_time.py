"""Training-step time of the example GPT, for bench/run.sh. With --profiler the steps run
under torch.profiler.profile(profile_memory=True, record_shapes=True), one of the tools tidemark
is compared with. --size dispatch makes the model so small (width 16, 8 tokens, batch 1) that a
step is the host's per-op and per-module work alone: what a GPU training's host side is when its
steps are launch-bound, where every microsecond tidemark adds per module call or saved tensor
shows. --size wide (width 1024, 256 tokens, batch 32) is the opposite on a GPU: the device's
work outweighs the host's, which runs ahead of it. --device cuda times each step to the device's
end (torch.cuda.synchronize)."""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from tiny_gpt import TinyGPT, make_batch  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--profiler", action="store_true")
    p.add_argument("--size", choices=("example", "dispatch", "wide"), default="example")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.size == "dispatch":
        model = TinyGPT(vocab=64, d_model=16, n_heads=2, seq_len=8)
        batch, seq_len, vocab = 1, 8, 64
    elif args.size == "wide":
        model = TinyGPT(vocab=256, d_model=1024, n_heads=8, seq_len=256)
        batch, seq_len, vocab = 32, 256, 256
    else:
        model = TinyGPT()
        batch, seq_len, vocab = 8, 128, 256
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batches = [tuple(t.to(device) for t in make_batch(gen, batch, seq_len, vocab))
               for _ in range(args.steps)]
    times = []
    cpu = []  # CPU time of the whole process (all its threads, the agent's included)

    def run():
        for idx, targets in batches:
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            model(idx, targets).backward()
            opt.step()
            sync()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)

    if args.profiler:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True, record_shapes=True):
            run()
    else:
        run()
    steady = times[2:]  # the first steps allocate the optimizer state and warm the caches
    steady_cpu = cpu[2:]
    # The minimum is the least disturbed by the rest of the machine (the work is CPU-bound);
    # CPU time does not count the time other virtual machines held the core.
    print(json.dumps({"min_step_s": min(steady), "median_step_s": statistics.median(steady),
                      "min_step_cpu_s": min(steady_cpu), "steps": len(steady)}))


if __name__ == "__main__":
    main()
