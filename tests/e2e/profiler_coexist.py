"""Trains a small model for three steps, the second under torch's own profiler with
profile_memory=True, and prints the profiler's memory figure and the CLOCK_MONOTONIC times the
profiler ran between. Run under `tidemark run` by test_torch_tensor_view.py: both tools must work,
one after the other, on the same thread."""
import time

import torch
import torch.nn as nn


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def step():
    loss = model(torch.randn(64, 256)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


step()
began = now()
with torch.autograd.profiler.profile(profile_memory=True) as prof:
    step()
ended = now()
allocated = sum(e.cpu_memory_usage for e in prof.key_averages() if e.cpu_memory_usage > 0)
step()
print("profiler: %d %d %d" % (began, ended, allocated))
