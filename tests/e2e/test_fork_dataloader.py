"""A training script with a DataLoader(num_workers=2) (forked workers) completes under the agent,
and the parent's session is complete: the children neither record nor touch the parent's stream."""
import unittest

from tidemark_env import PYTHON, Daemon

SCRIPT = r"""
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
loader = DataLoader(data, batch_size=32, num_workers=2, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
print("trained", flush=True)
"""


class ForkDataLoaderTest(unittest.TestCase):
    def test_forked_workers(self):
        daemon = Daemon()
        try:
            r = daemon.run(PYTHON, "-c", SCRIPT, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("trained", r.stdout)
            sessions = daemon.cli_json("sessions")["sessions"]
            self.assertEqual(len(sessions), 1, "forked workers must not open sessions")
            s = sessions[0]
            self.assertEqual(s["state"], "ended")
            self.assertEqual(s["steps"], 16)
            self.assertEqual(s["events_sent"], s["events_stored"])
            self.assertEqual(s["events_dropped"], 0)
        finally:
            daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
