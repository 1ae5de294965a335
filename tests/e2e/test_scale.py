"""A long session at bounded cost: a 20M-event session streamed through the real Ingest API into a
tidemarkd run with --memory-budget 256MiB. The daemon's peak resident memory (VmHWM, from /proc,
after the queries too) stays under the budget plus a stated constant, and the stored analysis is
exact: bench_scale's generator knows its own peak and fails when the daemon's differs, and a small
real training recorded by the same daemon keeps its exact figures. Queries that would load the
whole session are refused, saying so."""
import json
import os
import subprocess
import unittest

from tidemark_env import BIN, PYTHON, Daemon

HERE = os.path.dirname(os.path.abspath(__file__))

EVENTS = int(os.environ.get("TIDEMARK_SCALE_EVENTS", "20000000"))
BUDGET = 256 << 20
# Beyond the budget: the process itself (code, gRPC's threads and buffers, the allocator's
# arenas) and a session's reorder buffer at rest.
CONSTANT = 64 << 20


def peak_rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM for %d" % pid)


class MemoryBudgetTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon("--memory-budget", "256MiB")
        self.addCleanup(self.daemon.cleanup)

    def test_a_long_session_fits_in_the_budget(self):
        # A small real training first: its figures, checked against its own ground truth after
        # the long session went through the same daemon, are those of a daemon without a budget.
        out = os.path.join(self.daemon.dir, "truth.json")
        t = self.daemon.run(PYTHON, os.path.join(HERE, "truth_train.py"), "--model", "gpt",
                            "--steps", "3", "--out", out)
        self.assertEqual(t.returncode, 0, t.stderr)
        small = self.daemon.wait_analyzed(self.daemon.newest_session()["id"])["id"]
        r = subprocess.run([os.path.join(BIN, "bench_scale"), "--server", self.daemon.address,
                            "--events", str(EVENTS), "--no-raw"],
                           capture_output=True, text=True, timeout=1200)
        self.assertEqual(r.returncode, 0, r.stderr + self.daemon.read_log())
        result = json.loads(r.stdout)
        self.assertEqual(result["events"], EVENTS)
        sid = str(result["session"])
        # The stored analysis answers; what would load the whole session into memory is
        # refused, saying so, instead of taking the daemon's memory.
        self.assertEqual(self.daemon.cli_json("peak", sid)["breakdown"]["tracked_bytes"],
                         result["peak_bytes"])
        self.assertEqual(len(self.daemon.cli_json("timeline", sid, "--buckets", "100")["buckets"]),
                         100)
        for args in (("breakdown", sid, "--at", "+0.5s"), ("plan", sid, "--budget", "1GiB")):
            q = self.daemon.cli(*args, check=False)
            self.assertEqual(q.returncode, 1, args)
            self.assertIn("more than this daemon loads whole", q.stderr, args)
        hwm = peak_rss_bytes(self.daemon.proc.pid)
        print("\n%d events: daemon peak RSS %.1f MiB (budget 256 MiB + %d MiB); ingest %.0f "
              "events/s, analysis %.1f s" % (EVENTS, hwm / 2**20, CONSTANT >> 20,
                                            result["ingest_events_per_s"], result["analysis_s"]))
        self.assertLess(hwm, BUDGET + CONSTANT)
        with open(out) as f:
            truth = json.load(f)
        weights = sum(truth["params"]["storages"].values())
        for step, st in enumerate(truth["steps"], start=1):
            b = self.daemon.cli_json("breakdown", str(small), "--step", str(step))
            cats = {k: v["bytes"] for k, v in b["categories"].items()}
            self.assertEqual(cats["WEIGHT"], weights)
            if step > 1:
                self.assertEqual(cats["OPTIMIZER_STATE"], sum(st["optimizer"]["storages"].values()))
            self.assertEqual(sum(cats.values()), b["tracked_bytes"])
        # Every event is stored (events_stored counts what became part of a row).
        info = [s for s in self.daemon.cli_json("sessions")["sessions"]
                if s["id"] == result["session"]][0]
        self.assertEqual(info["events_received"], EVENTS)
        self.assertTrue(info["analyzed"])
        self.assertGreater(result["peak_bytes"], 0)


if __name__ == "__main__":
    unittest.main()
