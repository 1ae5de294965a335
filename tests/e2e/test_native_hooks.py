"""The adapter's native hooks (agent/torch/python_hooks.cpp: the saved-tensor pack and unpack, a
tensor's storage, the agent's calls) record exactly what its Python hooks record: the trainings of
patterns_train.py — an autocast GPT (the weights' casts are named by the Python hook the native
one hands them to), a checkpointed GPT with an EMA copy, clipping and evaluation passes
(recomputed and checkpoint-input tensors), and a GAN (targets built in the step) — each run
twice under `tidemark run`, with the native hooks (the default) and with TIDEMARK_NATIVE_HOOKS=0,
give the same tags (category, name, bytes, in order) and the same category for every block."""
import os
import textwrap
import unittest

from tidemark_env import PYTHON, Daemon, block_categories

HERE = os.path.dirname(os.path.abspath(__file__))
# The categories the adapter's tags give (tidemark.v1.Category 1-7; the agent's own tags of
# native libraries' memory come and go with the libraries' own work); INPUT is the last.
ADAPTERS = ("WEIGHT", "GRADIENT", "OPTIMIZER_STATE", "ACTIVATION", "CHECKPOINT_INPUT",
            "RECOMPUTED", "INPUT")
INPUT = 7
# The training, then which hooks the adapter used (the training itself never imports tidemark).
WRAPPER = r"""
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
import tidemark.adapter as adapter
print("native hooks: %s" % adapter._instance.native_hooks_status, file=sys.stderr)
"""


class NativeHooksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def run_pattern(self, pattern, native):
        out = os.path.join(self.daemon.dir, "%s-%d.json" % (pattern, native))
        r = self.daemon.run(PYTHON, "-c", WRAPPER, os.path.join(HERE, "patterns_train.py"),
                            "--pattern", pattern, "--steps", "2", "--out", out,
                            env={"TIDEMARK_NATIVE_HOOKS": "1" if native else "0"})
        self.assertEqual(r.returncode, 0, r.stderr)
        status = [line for line in r.stderr.splitlines() if line.startswith("native hooks: ")]
        self.assertEqual(status, ["native hooks: on" if native else
                                  "native hooks: TIDEMARK_NATIVE_HOOKS=0"], r.stderr)
        sid = self.daemon.wait_analyzed(self.daemon.newest_session()["id"])["id"]
        tags = self.daemon.sql(
            "SELECT t.category, COALESCE(s.value, ''), t.size_bytes FROM tag t LEFT JOIN string s "
            "ON s.session_id = t.session_id AND s.iid = t.name_id WHERE t.session_id = ? AND "
            "t.category <= ? ORDER BY t.seq", sid, INPUT)
        categories = sorted(c for c in block_categories(self.daemon, sid).values()
                            if c in ADAPTERS)
        return [tuple(t) for t in tags], categories

    def check(self, pattern):
        native_tags, native_blocks = self.run_pattern(pattern, True)
        python_tags, python_blocks = self.run_pattern(pattern, False)
        self.assertGreater(len(python_tags), 50)
        self.assertEqual(len(native_tags), len(python_tags))
        self.assertEqual(native_tags, python_tags)
        self.assertEqual(native_blocks, python_blocks)
        return native_tags

    def test_autocast(self):
        tags = self.check("autocast")
        self.assertTrue(any("cast)" in name for _, name, _ in tags), "no weight cast named")

    def test_checkpointed_with_ema(self):
        tags = self.check("ema")
        self.assertTrue(any(category == 6 for category, _, _ in tags), "nothing recomputed")

    def test_gan(self):
        tags = self.check("gan")
        self.assertTrue(any(name == "target" for _, name, _ in tags), "no target")

    def test_an_output_where_a_saved_tensor_was_freed_is_tagged(self):
        """Micro-batches: each one's output is saved by its loss and freed by its backward, and
        the next one's output of the same size is allocated where it lay. Each is a forward's
        output (ACTIVATION, `<Model>:output`), with either hooks: the storages saved in the step
        are remembered by a weak reference to the tensor saved, and a freed one's address says
        nothing (it did, and the output went untagged where the allocator reused the address)."""
        script = textwrap.dedent("""
            import torch, torch.nn as nn, torch.nn.functional as F
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            batches = [torch.randn(8, 64) for _ in range(4)]
            target = torch.randn(8, 32)
            addresses = set()
            for step in range(3):
                for x in batches:
                    out = model(x)
                    addresses.add(out.data_ptr())
                    F.mse_loss(out, target).backward()
                    del out
                opt.step()
                opt.zero_grad()
            print("output addresses: %d" % len(addresses))
            """)
        for native in (True, False):
            r = self.daemon.run(PYTHON, "-c", script,
                                env={"TIDEMARK_NATIVE_HOOKS": "1" if native else "0"})
            self.assertEqual(r.returncode, 0, r.stderr)
            sid = self.daemon.wait_analyzed(self.daemon.newest_session()["id"])["id"]
            outputs = self.daemon.sql(
                "SELECT COUNT(*) FROM tag t JOIN string s ON s.session_id = t.session_id AND "
                "s.iid = t.name_id WHERE t.session_id = ? AND s.value = 'Sequential:output' AND "
                "t.category = 4", sid)[0][0]
            # The case the test is for: an output at an address an earlier one had.
            self.assertLess(int(r.stdout.split("output addresses: ")[1]), 12, r.stdout)
            self.assertEqual(outputs, 12, "native hooks" if native else "Python hooks")


if __name__ == "__main__":
    unittest.main()
