"""A long session at bounded cost: a 20M-event session streamed through the real Ingest API into a
tidemarkd run with --memory-budget 256MiB. The daemon's peak resident memory (VmHWM, from /proc,
after the queries too) stays under the budget plus a stated constant, and the stored analysis is
exact: bench_scale's generator knows its own peak and fails when the daemon's differs, and a small
real training recorded by the same daemon keeps its exact figures. Queries that would load the
whole session are refused, saying so. A session killed mid-analysis, or analysed on a full disk,
is analysed again later. A long session queried while live answers at its start and its end (its
live whole peak the generator's each time); a live session of 300,000 steps stays within the
budget too."""
import json
import os
import subprocess
import time
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


    def test_a_live_session_of_many_steps_holds_only_its_last_ones(self):
        # 300,000 steps (one every 10 events) queried while live: each ended step's peak goes to
        # the store with the next commit and is let go of then, so the daemon holds the steps of
        # its last commits only (before, every step: 607 MiB at this size).
        events, every = 3000000, 10
        r = subprocess.run([os.path.join(BIN, "bench_scale"), "--server", self.daemon.address,
                            "--events", str(events), "--no-raw", "--step-events", str(every),
                            "--live-queries"],
                           capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr + self.daemon.read_log())
        sid = str(json.loads(r.stdout)["session"])
        hwm = peak_rss_bytes(self.daemon.proc.pid)
        print("\n%d steps live: daemon peak RSS %.1f MiB" % (events // every, hwm / 2**20))
        self.assertLess(hwm, BUDGET + CONSTANT)
        self.daemon.wait_analyzed(int(sid))
        last = self.daemon.cli_json("steps", sid, "--last", "1")
        self.assertEqual(last["total_steps"], events // every)
        self.assertEqual([s["step"] for s in last["steps"]], [events // every - 1])


def bench_scale(daemon, events, wait=True):
    cmd = [os.path.join(BIN, "bench_scale"), "--server", daemon.address, "--events", str(events),
           "--no-raw"]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise AssertionError(r.stderr + daemon.read_log())
    return json.loads(r.stdout)


class AnalysisKilledTest(unittest.TestCase):
    """A daemon killed (SIGKILL) in the middle of a session's analysis: the next one on the same
    store does the analysis again from the start, and its figures are those of an analysis that
    was never interrupted (the same session, analysed whole by another daemon)."""

    EVENTS = 3000000

    def setUp(self):
        self.reference = Daemon()
        self.addCleanup(self.reference.cleanup)
        self.daemon = Daemon()
        self.addCleanup(self.daemon.cleanup)

    def figures(self, daemon, sid):
        peak = daemon.cli_json("peak", str(sid))
        timeline = daemon.cli_json("timeline", str(sid), "--buckets", "64")
        return peak["breakdown"], timeline["buckets"]

    def test_the_analysis_is_redone_after_a_kill(self):
        expected = bench_scale(self.reference, self.EVENTS)
        ref_peak, ref_timeline = self.figures(self.reference, expected["session"])
        self.assertEqual(ref_peak["tracked_bytes"], expected["peak_bytes"])

        client = bench_scale(self.daemon, self.EVENTS, wait=False)
        self.addCleanup(client.kill)
        # Killed once the analysis has written part of its results and not finished.
        deadline = time.time() + 600
        while True:
            self.assertLess(time.time(), deadline, "the analysis never started")
            rows = self.daemon.sql("SELECT id, analyzed FROM session")
            if rows:
                sid, analyzed = rows[0]
                self.assertEqual(analyzed, 0, "the analysis ended before the kill: raise EVENTS")
                (written,), = self.daemon.sql(
                    "SELECT COUNT(*) FROM block_category WHERE session_id = ?", sid)
                if written > 0:
                    break
            time.sleep(0.02)
        self.daemon.kill_and_restart()
        (analyzed,), = self.daemon.sql("SELECT analyzed FROM session WHERE id = ?", sid)
        self.assertEqual(analyzed, 0)
        self.daemon.wait_analyzed(sid, timeout=600)
        peak, timeline = self.figures(self.daemon, sid)
        self.assertEqual(peak["tracked_bytes"], expected["peak_bytes"])
        for key in ("categories", "ts_ns", "seq", "tracked_bytes"):
            self.assertEqual(peak[key], ref_peak[key], key)
        self.assertEqual(timeline, ref_timeline)



class AnalysisOnAFullDiskTest(unittest.TestCase):
    """The disk fills while a session is analysed (its sorts spill beside the store under a small
    budget): the pass fails, says so and is tried again; once there is room again the session is
    analysed, exactly. Nothing is lost meanwhile and the daemon stays up."""

    def test_a_failed_pass_is_tried_again(self):
        import resource
        daemon = Daemon("--memory-budget", "64MiB")
        self.addCleanup(daemon.cleanup)
        client = bench_scale(daemon, AnalysisKilledTest.EVENTS, wait=False)
        self.addCleanup(client.kill)
        deadline = time.time() + 600
        while True:
            self.assertLess(time.time(), deadline, "the session never ended")
            rows = daemon.sql("SELECT id FROM session WHERE state != 1 AND analyzed = 0")
            if rows:
                sid = rows[0][0]
                break
            time.sleep(0.01)
        # No write past the first 4 KiB of any file: the sorts' runs and the store fail.
        hard = resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (4096, hard))
        deadline = time.time() + 120
        while "trying again in 5 s" not in daemon.read_log():
            self.assertLess(time.time(), deadline, "the pass did not fail: " + daemon.read_log())
            time.sleep(0.1)
        self.assertIsNone(daemon.proc.poll(), "the daemon died of a full disk")
        (analyzed,), = daemon.sql("SELECT analyzed FROM session WHERE id = ?", sid)
        self.assertEqual(analyzed, 0)
        resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
        # bench_scale waits for the analysis, then checks the stored peak against its generator.
        out, _ = client.communicate(timeout=300)
        self.assertEqual(client.returncode, 0, daemon.read_log())
        self.assertEqual(daemon.sql("SELECT analyzed FROM session WHERE id = ?", sid)[0][0], 1)


class LiveAtScaleTest(unittest.TestCase):
    def test_a_long_live_session_answers_at_its_start_and_end(self):
        # A session 2 hours long by its timestamps (360 us between events), a step mark every
        # 20,000 events; bench_scale checks the live whole peak against its generator's.
        d = Daemon()
        self.addCleanup(d.cleanup)
        events = int(os.environ.get("TIDEMARK_LIVE_EVENTS", "4000000"))
        r = subprocess.run([os.path.join(BIN, "bench_scale"), "--server", d.address, "--events",
                            str(events), "--no-raw", "--ns-per-event", str(7200 * 10**9 // events),
                            "--step-events", "20000", "--live-queries"],
                           capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr + d.read_log())
        result = json.loads(r.stdout)
        print("\nlive queries, ms at the start (%d events) / at the end (%d events):"
              % (result["live_start_events"], result["live_end_events"]))
        for q in ("cold", "peak", "steps", "timeline", "zoom", "breakdown"):
            start, end = result["live_start_%s_ms" % q], result["live_end_%s_ms" % q]
            print("  %-10s %7.2f %7.2f" % (q, start, end))
            self.assertGreater(start, 0)
            self.assertGreater(end, 0)  # -1: the query did not run
        self.assertGreater(result["live_end_events"], result["live_start_events"] * 5)


if __name__ == "__main__":
    unittest.main()
