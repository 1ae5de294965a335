"""torch's tensor-level memory (libtidemark_torch-<version>.so, python/tidemark/torch_memory.py), on the CPU.

On a GPU the reporter sees the blocks torch's CUDA caching allocator hands out inside the segments
the CUPTI callbacks see (test_gpu_capture.py plays that part). Here, with
TIDEMARK_TORCH_MEMORY=all, it reports torch's CPU allocator through the same torch mechanism: every
tensor block lies in a host block the allocator hooks saw, so the two views of one real training
must reconcile — the same categories and totals as a run without the tensor view, no byte counted
twice, no negative slack."""
import os
import unittest

from tidemark_env import BIN, PYTHON, SOURCE, DaemonTestCase, torch_version_string

TRAIN = [os.path.join(SOURCE, "examples", "train.py"), "--steps", "3", "--seed", "5", "--layers",
         "4"]
# The reporter built for the jobs' torch (one per torch: agent/CMakeLists.txt).
REPORTER = os.path.abspath(os.path.join(BIN, "..", "lib",
                                        "libtidemark_torch-%s.so" % torch_version_string()))


class TorchTensorViewTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.path.exists(REPORTER):
            raise AssertionError("%s was not built: install libtorch-dev, or make the torch 2 "
                                 "environment (scripts/install-deps.sh)" % REPORTER)
        cls.plain = cls.train(TIDEMARK_TORCH_MEMORY="off")
        cls.viewed = cls.train(TIDEMARK_TORCH_MEMORY="all")

    @classmethod
    def train(cls, **env):
        r = cls.daemon.run(PYTHON, *TRAIN, env=env)
        if r.returncode != 0:
            raise AssertionError(r.stderr)
        sid = cls.daemon.newest_session()["id"]
        cls.daemon.wait_analyzed(sid)
        return sid, r.stderr

    def blocks(self, sid, kind):
        return self.daemon.sql(
            "SELECT address, size_bytes, alloc_seq, IFNULL(free_seq, 1 << 62) FROM allocation "
            "WHERE session_id = ? AND memory_kind = ? ORDER BY alloc_seq", sid, kind)

    def test_every_tensor_lies_in_a_host_block(self):
        sid, stderr = self.viewed
        self.assertNotIn("tensor view is off", stderr)
        tensors = self.blocks(sid, 3)
        hosts = self.blocks(sid, 1)
        self.assertGreater(len(tensors), 1000)
        # The host block holding each tensor: at an address at or below it, live around it.
        by_address = {}
        for h in hosts:
            by_address.setdefault(h[0], []).append(h)
        outside = []
        for address, size, alloc, free in tensors:
            holders = [h for h in by_address.get(address, [])
                       if h[2] < alloc and free <= h[3] and address + size <= h[0] + h[1]]
            if not holders:
                outside.append((hex(address), size, alloc))
        self.assertEqual(outside, [])

    def test_the_breakdown_is_that_of_the_run_without_the_view(self):
        plain = self.daemon.cli_json("peak", str(self.plain[0]))["breakdown"]
        viewed = self.daemon.cli_json("peak", str(self.viewed[0]))["breakdown"]
        cats = {c: v["bytes"] for c, v in viewed["categories"].items()}
        # The model's state, exactly; every byte once.
        for c in ("WEIGHT", "GRADIENT", "OPTIMIZER_STATE", "INPUT"):
            self.assertEqual(cats[c], plain["categories"][c]["bytes"], c)
        self.assertEqual(viewed["tracked_bytes"], plain["tracked_bytes"])
        self.assertEqual(sum(cats.values()), viewed["tracked_bytes"])
        # The host blocks that hold tensors keep only what the tensors leave: a few bytes here.
        self.assertLess(cats["ALLOCATOR_SLACK"], 64 * 1024)

    def test_the_advisor_plans_the_tensors(self):
        # With the tensor view the advisor models the tensors alone (a GPU job's, here the CPU
        # allocator's): the same chain as from the hooks' blocks, less the host blocks that are
        # no tensor (the interpreter's and torch's own: ~30 KiB under torch 1.13, ~380 KiB
        # under torch 2), which the view leaves UNKNOWN, or WORKSPACE where a native library
        # (oneDNN) made them.
        plain = self.daemon.cli_json("chain", str(self.plain[0]))
        viewed = self.daemon.cli_json("chain", str(self.viewed[0]))
        tl = self.daemon.cli_json("timeline", str(self.viewed[0]), "--buckets", "400")
        no_tensor = sum(max(b["max"][tl["series"].index(c)] for b in tl["buckets"]
                            if not b["empty"]) for c in ("UNKNOWN", "WORKSPACE"))
        self.assertLess(no_tensor, 1 << 20)
        # Each view sets static at its own least moment (a block the recording checkpointed is
        # compared with what its forward held, the host blocks that are no tensor among it in
        # the hooks' view): what lies above static at the end of the forward differs by them.
        self.assertLessEqual(abs(viewed["end_outside_bytes"] - plain["end_outside_bytes"]),
                             no_tensor)
        for key in ("static_bytes", "floor_bytes"):
            self.assertLess(viewed[key], plain[key], key)
            self.assertLessEqual(plain[key] - viewed[key], no_tensor, key)
        stages = [(s["saved_bytes"], s["output_bytes"]) for s in viewed["stages"]]
        self.assertEqual(stages, [(s["saved_bytes"], s["output_bytes"]) for s in plain["stages"]])
        base = [self.daemon.cli_json("plan", str(sid), "--budget", "70%")["baseline"]["peak_bytes"]
                for sid in (self.plain[0], self.viewed[0])]
        self.assertLessEqual(abs(base[0] - base[1]), no_tensor, base)

    def test_slack_is_never_negative(self):
        tl = self.daemon.cli_json("timeline", str(self.viewed[0]), "--buckets", "400")
        slack = tl["series"].index("ALLOCATOR_SLACK")
        lows = [b["min"][slack] for b in tl["buckets"] if not b["empty"]]
        self.assertGreater(len(lows), 10)
        self.assertGreaterEqual(min(lows), 0)

    def test_default_leaves_a_cpu_job_alone(self):
        # TIDEMARK_TORCH_MEMORY=auto (the default) turns the view on only where CUDA is.
        sid, stderr = self.train()
        self.assertEqual(self.blocks(sid, 3), [])
        self.assertNotIn("tensor view is off", stderr)

    def test_a_missing_library_is_said_and_changes_nothing_else(self):
        sid, stderr = self.train(TIDEMARK_TORCH_MEMORY="all",
                                 TIDEMARK_TORCH_REPORTER="/nonexistent/libtidemark_torch.so")
        self.assertIn("tidemark: torch's tensor view is off: cannot load", stderr)
        self.assertEqual(self.blocks(sid, 3), [])
        plain = self.daemon.cli_json("peak", str(self.plain[0]))["breakdown"]
        here = self.daemon.cli_json("peak", str(sid))["breakdown"]
        self.assertEqual(here["categories"]["WEIGHT"], plain["categories"]["WEIGHT"])

    def test_torch_profiler_runs_beside_it(self):
        # The reporter sits where torch.profiler keeps its state; the profiler must start (it
        # refuses when it thinks a profiler runs), get its memory reports, and hand the thread
        # back: tensors are seen before and after it (not while it runs).
        r = self.daemon.run(PYTHON, os.path.join(SOURCE, "tests", "e2e", "profiler_coexist.py"),
                            env={"TIDEMARK_TORCH_MEMORY": "all"})
        self.assertEqual(r.returncode, 0, r.stderr)
        line = [l for l in r.stdout.splitlines() if l.startswith("profiler:")][0]
        began, ended, allocated = (int(x) for x in line.split()[1:])
        self.assertGreater(allocated, 256 * 512 * 4)  # the profiler saw the step's memory
        sid = self.daemon.newest_session()["id"]
        self.daemon.wait_analyzed(sid)
        times = [t for (t,) in self.daemon.sql(
            "SELECT alloc_ts_ns FROM allocation WHERE session_id = ? AND memory_kind = 3", sid)]
        self.assertGreater(len([t for t in times if t < began]), 5)
        self.assertGreater(len([t for t in times if t > ended]), 5)
        self.assertEqual([t for t in times if began < t < ended], [])


if __name__ == "__main__":
    unittest.main()
