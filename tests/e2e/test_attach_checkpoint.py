"""`tidemark attach` in the middle of a training whose root modules each run under a
checkpoint — non-reentrant ones (saved-tensor hooks of their own) and a reentrant one — at random
moments: in a checkpointed forward, in its recomputation inside backward, in backward, between
steps. The adapter's saved-tensor hooks must never land inside a checkpoint's own (the next
backward failed with "IndexError: list index out of range"): the job exits 0 with the losses of a
run without tidemark, digit for digit, and the attached session records the steps after it."""
import os
import random
import subprocess
import time
import unittest

from tidemark_env import BIN, PYTHON, DaemonTestCase
from test_attach import Job

STEPS = 80
SCRIPT = r"""
import sys, time, torch
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)

class Slow(torch.nn.Module):  # holds each forward (and its recomputation) for a while
    def forward(self, x):
        time.sleep(0.015)
        return x

class Root(torch.nn.Module):  # owns parameters and runs at depth 0: a root model
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.slow = Slow()
    def forward(self, x):
        return torch.tanh(self.lin(self.slow(x)))

roots = [Root() for _ in range(3)]
opt = torch.optim.SGD([p for r in roots for p in r.parameters()], lr=0.05)
gen = torch.Generator().manual_seed(1)
print("ready", flush=True)
for step in range(int(sys.argv[1])):
    x = torch.randn(16, 32, generator=gen)
    for i, r in enumerate(roots):
        x = checkpoint(r, x, use_reentrant=(i == 1))
    loss = x.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step %d %.8f" % (step, loss.item()), flush=True)
    time.sleep(0.01)
"""


def losses(out):
    return [line for line in out.splitlines() if line.startswith("step ")]


class AttachCheckpointTest(DaemonTestCase):
    def test_attach_at_random_moments_of_checkpointed_roots(self):
        reference = subprocess.run([PYTHON, "-c", SCRIPT, str(STEPS)], capture_output=True,
                                   text=True, timeout=300)
        self.assertEqual(reference.returncode, 0, reference.stderr)
        expected = losses(reference.stdout)
        self.assertEqual(len(expected), STEPS)
        seed = int(os.environ.get("TIDEMARK_TEST_SEED", time.time()))
        print("\nmoments drawn with TIDEMARK_TEST_SEED=%d" % seed)
        rng = random.Random(seed)
        for _ in range(4):
            job = Job(command=[PYTHON, "-u", "-c", SCRIPT, str(STEPS)])
            try:
                job.wait_for(r"^ready$", "ready")
                delay = rng.uniform(0.05, 1.5)
                time.sleep(delay)
                r = subprocess.run([os.path.join(BIN, "tidemark"), "--server",
                                    self.daemon.address, "attach", str(job.pid), "--json"],
                                   capture_output=True, text=True, timeout=300)
                rc, out, err = job.finish()
                self.assertEqual(r.returncode, 0, "%s\njob: exit %s after %d steps; %s"
                                 % (r.stderr, rc, len(losses(out)), err))
            finally:
                job.kill()
            with self.subTest(delay=delay):
                self.assertEqual(rc, 0, err)
                self.assertEqual(losses(out), expected, err)
                s = self.daemon.session_for_pid(job.pid)
                self.assertGreater(s["steps"], 0, s)


if __name__ == "__main__":
    unittest.main()
