"""On a machine with a CUDA device (ctest label `gpu`; skipped elsewhere, exit code 77): the
example's checkpointed GPT trains on the GPU under `tidemark run`, and the agent's figures are
checked against torch's own, printed by the same process — the peak of torch's tensors (its memory
reports) against torch.cuda.max_memory_allocated, torch's reserved count against
max_memory_reserved, the device memory CUPTI saw, the model's and optimizer's bytes, kernels.

The training runs under $TIDEMARK_GPU_PYTHON (default: python3 on PATH), whose torch must be the
one a libtidemark_torch-<version>.so was built for (cmake -DTIDEMARK_TORCH_PYTHON=... or
-DTIDEMARK_TORCH2_PYTHON=...)."""
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import unittest

from tidemark_env import SOURCE, DaemonTestCase

sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import gpu_check_table as table  # noqa: E402  (the GPU check's readers of the store)

PYTHON = os.environ.get("TIDEMARK_GPU_PYTHON") or shutil.which("python3") or "/usr/bin/python3"
SKIP = 77  # ctest's SKIP_RETURN_CODE for this test


def has_cuda():
    r = subprocess.run([PYTHON, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() "
                        "else 1)"], capture_output=True)
    return r.returncode == 0


class GpuTrainingTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        r = cls.daemon.run(PYTHON, os.path.join(SOURCE, "examples", "train.py"), "--device",
                           "cuda", "--steps", "4", "--seed", "1", "--checkpoint", "1,3,5")
        if r.returncode != 0:
            raise AssertionError(r.stderr)
        cls.out, cls.err = r.stdout, r.stderr
        cls.sid = cls.daemon.newest_session()["id"]
        cls.daemon.wait_analyzed(cls.sid)
        cls.db = sqlite3.connect("file:%s?mode=ro" % cls.daemon.db, uri=True)

    @classmethod
    def tearDownClass(cls):
        cls.db.close()
        super().tearDownClass()

    def figure(self, pattern):
        m = re.search(pattern, self.out)
        self.assertIsNotNone(m, pattern)
        return [int(g) for g in m.groups()]

    def replayed_peak(self, memory_kind):
        return table.replayed_peak(self.db, self.sid, memory_kind)

    def test_tensors_match_torchs_allocated_peak(self):
        self.assertNotIn("tensor view is off", self.err)
        allocated, _ = table.torch_peaks(self.out)
        self.assertIsNotNone(allocated, "train.py printed no max_memory_allocated")
        self.assertAlmostEqual(self.replayed_peak(3), allocated, delta=allocated * 0.01)

    def test_reserved_matches_torchs(self):
        _, reserved = table.torch_peaks(self.out)
        self.assertIsNotNone(reserved, "train.py printed no max_memory_reserved")
        counted = table.counter_values(self.db, self.sid, "reserved_bytes")
        self.assertAlmostEqual(max(counted), reserved, delta=reserved * 0.01)
        # CUPTI's device memory holds torch's segments and whatever else the job reserved.
        self.assertGreaterEqual(self.replayed_peak(2), reserved * 0.99)

    def test_breakdown_names_the_models_bytes(self):
        weights = self.figure(r"parameters, (\d+) bytes")[0]
        optimizer = self.figure(r"optimizer state: (\d+) bytes")[0]
        peak = self.daemon.cli_json("peak", str(self.sid))["breakdown"]
        cats = {c: v["bytes"] for c, v in peak["categories"].items()}
        self.assertEqual(cats["WEIGHT"], weights)
        self.assertEqual(cats["OPTIMIZER_STATE"], optimizer)
        self.assertEqual(sum(cats.values()), peak["tracked_bytes"])
        self.assertGreater(cats["ALLOCATOR_SLACK"] + cats["ACTIVATION"], 0)

    def test_kernels_are_recorded_and_attributed(self):
        ops = self.daemon.cli_json("ops", str(self.sid))["ops"]
        kernels = [o for o in ops if o["kind"] == "kernel"]
        self.assertGreater(sum(o["calls"] for o in kernels), 100)
        self.assertTrue(any(o["launched_by"].startswith("TinyGPT") for o in kernels))


if __name__ == "__main__":
    if not has_cuda():
        print("no CUDA device for %s: skipped" % PYTHON)
        sys.exit(SKIP)
    unittest.main()
