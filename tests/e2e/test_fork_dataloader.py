"""A training script with a DataLoader(num_workers=2) (forked workers) completes under the agent,
and the parent's session is complete: the children neither record nor touch the parent's stream.
The dataset the parent holds in memory is INPUT, named so."""
import json
import unittest

from tidemark_env import PYTHON, Daemon, block_categories, blocks_of

SCRIPT = r"""
import json, time
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

class Held(Dataset):  # a dataset of the user's own, its data a tensor attribute
    def __init__(self):
        self.images = torch.randn(64, 3, 8, 8)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return self.images[i].flatten()[:16], i % 4

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
held = DataLoader(Held(), batch_size=32)
for x, y in held:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
storages = {}
for t in list(data.tensors) + [held.dataset.images]:
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    storages[s.data_ptr()] = s.nbytes()
print(json.dumps({"ts": time.monotonic_ns(), "storages": storages}))
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
            self.assertEqual(s["steps"], 18)
            self.assertEqual(s["events_sent"], s["events_stored"])
            self.assertEqual(s["events_dropped"], 0)
            # The datasets' tensors, made before the first step: INPUT, named "dataset".
            snap = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][0])
            daemon.wait_analyzed(s["id"])
            blocks = blocks_of(daemon, s["id"], snap)
            self.assertEqual(len(blocks), 3)
            categories = block_categories(daemon, s["id"])
            self.assertEqual({categories[i] for i, _ in blocks}, {"INPUT"})
            for addr in snap["storages"]:
                names = [n for (n,) in daemon.sql(
                    "SELECT s.value FROM tag t JOIN string s ON s.session_id = t.session_id AND "
                    "s.iid = t.name_id WHERE t.session_id = ? AND t.address = ?", s["id"],
                    int(addr))]
                self.assertIn("dataset", names)
        finally:
            daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
