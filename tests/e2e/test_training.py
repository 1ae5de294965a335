"""End to end: a real checkpointed PyTorch training under `tidemark run`, stored by a real
tidemarkd, queried through the real CLI, checked against ground truth the run computed itself.
The GPT's blocks are checkpointed reentrantly, the convnet's stages by checkpoint_sequential
(under both torches; torch 2's other forms of training are test_torch2_forms')."""
import json
import os
import unittest

from tidemark_env import Daemon
from training_truth import StepPeakChecks, run_training


class TrainingBreakdownTest(StepPeakChecks, unittest.TestCase):
    daemon = None
    runs = {}

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.runs = {}
        try:
            for name in ("gpt", "convnet"):
                cls.runs[name] = run_training(cls.daemon, name, ["--model", name])
        except BaseException:
            cls.daemon.cleanup()
            cls.daemon = None
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.daemon:
            cls.daemon.cleanup()

    def test_gpt_step_peaks_match_ground_truth(self):
        self.check_step_peaks("gpt", self.runs["gpt"])

    def test_convnet_step_peaks_match_ground_truth(self):
        self.check_step_peaks("convnet", self.runs["convnet"])

    def test_checkpoint_rng_states_are_what_the_checkpoints_keep(self):
        """Each checkpointed region keeps the CPU generator's state (5,056 bytes) from its forward
        to its backward, to re-run alike: CHECKPOINT_INPUT, named so, never UNKNOWN."""
        for model, run in self.runs.items():
            p = self.daemon.cli_json("peak", str(run["session"]["id"]), "--top", "1000")
            states = [t for t in p["tensors"] if t["name"] == "checkpoint rng state"]
            with self.subTest(model=model):
                # The peak comes in a backward: the regions whose backward is yet to come, and
                # the one running, still hold theirs.
                self.assertGreater(len(states), 0, p["tensors"][-5:])
                for t in states:
                    self.assertEqual((t["category"], t["bytes"]), ("CHECKPOINT_INPUT", 5056))
                self.assertEqual([t for t in p["tensors"]
                                  if t["category"] == "UNKNOWN" and t["bytes"] == 5056], [])

    def test_categories_add_up_at_every_sample(self):
        for model, run in self.runs.items():
            s = run["session"]
            sid = s["id"]
            span = s["end_ts_ns"] - s["start_ts_ns"]
            first = self.daemon.sql("SELECT MIN(alloc_ts_ns), MAX(alloc_ts_ns) FROM allocation "
                                    "WHERE session_id = ?", sid)[0]
            self.assertGreater(span, 0)
            for i in range(40):
                ts = first[0] + (first[1] - first[0]) * i // 39
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(ts))
                cats = sum(v["bytes"] for v in b["categories"].values())
                live = self.daemon.sql(
                    "SELECT COALESCE(SUM(size_bytes), 0) FROM allocation WHERE session_id = ? AND "
                    "alloc_seq <= ? AND (free_seq IS NULL OR free_seq > ?)", sid, b["seq"], b["seq"])
                with self.subTest(model=model, sample=i):
                    self.assertEqual(cats, b["tracked_bytes"])
                    self.assertEqual(b["tracked_bytes"], live[0][0])

    def test_no_event_lost(self):
        for model, run in self.runs.items():
            s = run["session"]
            with self.subTest(model=model):
                self.assertEqual(s["state"], "ended")
                self.assertGreater(s["events_sent"], 1000)
                self.assertEqual(s["events_sent"], s["events_received"])
                self.assertEqual(s["events_sent"], s["events_stored"])
                self.assertEqual(s["events_dropped"], 0)
                self.assertNotIn("seq_gap", s["stats"])
                self.assertNotIn("free_of_untracked", s["stats"])
                # Every alloc has its free, or is counted live at the end.
                open_rows = self.daemon.sql("SELECT COUNT(*) FROM allocation WHERE session_id = ? "
                                            "AND free_seq IS NULL", s["id"])[0][0]
                self.assertEqual(open_rows, s["live_blocks_at_end"])
                # The agent said where the events went, once.
                lines = [l for l in run["stderr"].splitlines() if l.startswith("tidemark: session")]
                self.assertEqual(len(lines), 1, run["stderr"])
                self.assertIn("%d events sent" % s["events_sent"], lines[0])

    def test_stored_analysis_agrees(self):
        """Once the analysis pass has stored its results, the queries read them; the answers are
        the same ground-truth-checked ones, and the timeline and the peak agree with them."""
        for model, run in self.runs.items():
            sid = run["session"]["id"]
            self.daemon.wait_analyzed(sid)
            with self.subTest(model=model):
                self.check_step_peaks(model, run)
                whole = self.daemon.cli_json("breakdown", str(sid))
                t = self.daemon.cli_json("timeline", str(sid), "--buckets", "300")
                self.assertTrue(t["precomputed"])
                self.assertEqual(len(t["buckets"]), 300)
                self.assertEqual(t["series"][0], "TOTAL")
                self.assertEqual(max(b["max"][0] for b in t["buckets"]), whole["tracked_bytes"])
                for b in t["buckets"]:
                    self.assertEqual(sum(b["last"][1:]), b["last"][0])
                    self.assertLessEqual(b["min"][0], b["last"][0])
                    self.assertLessEqual(b["last"][0], b["max"][0])
                # The text: each bucket's last bytes and the category holding most of them.
                text = self.daemon.cli("timeline", str(sid), "--buckets", "6").stdout
                rows = [line.split() for line in text.splitlines()[2:]]
                self.assertEqual(len(rows), 6, text)
                small = self.daemon.cli_json("timeline", str(sid), "--buckets", "6")["buckets"]
                for row, b in zip(rows, small):
                    last = b["last"]
                    most = max(range(1, len(last)), key=lambda k: last[k])
                    self.assertEqual(row[7], t["series"][most] if last[most] > 0 else "-", text)
                # The peaks come early in backward: the module whose saved tensors are in use.
                self.assertEqual(whole["phase"], "backward")
                self.assertTrue(whole["scope"].endswith(" [backward]"), whole["scope"])
                p = self.daemon.cli_json("peak", str(sid))
                self.assertEqual(p["breakdown"]["seq"], whole["seq"])
                self.assertEqual(p["breakdown"]["tracked_bytes"], whole["tracked_bytes"])
                sizes = [m["bytes"] for m in p["modules"]]
                self.assertEqual(sizes, sorted(sizes, reverse=True))
                self.assertLessEqual(sum(sizes), whole["tracked_bytes"])
                self.assertTrue(p["tensors"])
                self.assertTrue(any(x["name"].endswith(":saved") for x in p["tensors"]))
                self.assertLessEqual(p["tensors"][0]["bytes"], whole["tracked_bytes"])

    def test_steps_compare_the_step_peaks(self):
        for model, run in self.runs.items():
            sid = run["session"]["id"]
            steps = self.daemon.cli_json("steps", str(sid))["steps"]
            self.assertEqual([s["step"] for s in steps], list(range(1, len(run["truth"]["steps"]) + 1)))
            for s in steps:
                b = self.daemon.cli_json("breakdown", str(sid), "--step", str(s["step"]))
                self.assertEqual(s["peak"]["tracked_bytes"], b["tracked_bytes"])
                self.assertEqual(s["peak"]["categories"], b["categories"])
                self.assertLess(s["begin_ts_ns"], s["end_ts_ns"])

    def test_export_chrome_trace(self):
        run = self.runs["gpt"]
        sid = run["session"]["id"]
        path = os.path.join(self.daemon.dir, "trace.json")
        self.daemon.cli("export", str(sid), "--format", "chrome", "-o", path)
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        counters = [e for e in events if e["ph"] == "C"]
        slices = [e for e in events if e["ph"] == "X"]
        self.assertTrue(counters)
        peak = self.daemon.cli_json("breakdown", str(sid))["tracked_bytes"]
        for c in counters:
            self.assertLessEqual(sum(c["args"].values()), peak)
        self.assertEqual(max(sum(c["args"].values()) for c in counters) > 0, True)
        scopes = self.daemon.sql("SELECT COUNT(*) FROM scope WHERE session_id = ? AND end_seq "
                                 "IS NOT NULL", sid)[0][0]
        self.assertEqual(len([e for e in slices if e["cat"] == "module"]), scopes)
        self.assertEqual(len([e for e in slices if e["cat"] == "step"]), len(run["truth"]["steps"]))
        bad = self.daemon.cli("export", str(sid), "--format", "nope", "-o", path + "2", check=False)
        self.assertEqual(bad.returncode, 2)  # bad usage: the server refused the argument
        self.assertFalse(os.path.exists(path + "2") or os.path.exists(path + "2.part"))

    def test_ops_and_diff(self):
        gpt, conv = self.runs["gpt"]["session"]["id"], self.runs["convnet"]["session"]["id"]
        ops = {o["name"]: o for o in self.daemon.cli_json("ops", str(gpt))["ops"]}
        steps = len(self.runs["gpt"]["truth"]["steps"])
        self.assertEqual(ops["CheckpointedGPT"]["calls"], steps)
        # A checkpointed block runs twice a step (forward and recompute), the others once.
        self.assertEqual(ops["CheckpointedGPT.blocks.1"]["calls"], 2 * steps)
        self.assertEqual(ops["CheckpointedGPT.blocks.0"]["calls"], steps)
        for o in ops.values():
            self.assertLessEqual(0, o["self_ns"])
            self.assertLessEqual(o["self_ns"], o["total_ns"])
        self.assertGreaterEqual(ops["CheckpointedGPT"]["total_ns"], ops["CheckpointedGPT.blocks.0"]["total_ns"])
        d = self.daemon.cli_json("diff", str(gpt), str(conv))
        self.assertEqual(d["a"]["tracked_bytes"], self.daemon.cli_json("breakdown", str(gpt))["tracked_bytes"])
        self.assertEqual(d["b"]["tracked_bytes"], self.daemon.cli_json("breakdown", str(conv))["tracked_bytes"])
        self.assertEqual(d["steps_a"], steps)

    def test_phases_and_scopes_recorded(self):
        sid = self.runs["gpt"]["session"]["id"]
        phases = dict(self.daemon.sql("SELECT phase, COUNT(*) FROM phase WHERE session_id = ? "
                                      "GROUP BY phase", sid))
        # forward, backward, optimizer once a step; recompute once per checkpointed block a step
        self.assertEqual(phases.get(1), 3)
        self.assertEqual(phases.get(4), 3)
        self.assertGreaterEqual(phases.get(2), 3)
        self.assertEqual(phases.get(3), 2 * 3)
        names = {r[0] for r in self.daemon.sql(
            "SELECT DISTINCT s.value FROM scope c JOIN string s ON s.session_id = c.session_id "
            "AND s.iid = c.name_id WHERE c.session_id = ?", sid)}
        self.assertIn("CheckpointedGPT", names)
        self.assertIn("CheckpointedGPT.blocks.1.attn.qkv", names)


if __name__ == "__main__":
    unittest.main()
