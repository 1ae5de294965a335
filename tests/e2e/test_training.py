"""End to end: a real checkpointed PyTorch training under `tidemark run`, stored by a real
tidemarkd, queried through the real CLI, checked against ground truth the run computed itself.
The GPT's blocks are checkpointed reentrantly, the convnet's stages by checkpoint_sequential; on
torch 2 the GPT runs twice more, with non-reentrant checkpoints and with selective activation
checkpointing (a policy saving the matrix products), with AdamW for-each (gradients kept, zeroed)
and fused, and a GPT-2 of the `transformers` library,
called with keywords, trains with its own activation-checkpointing switch, and the GPT (without
checkpoints) trains under torch.compile (inductor), whole and per block: the categories are as
exact there (docs/architecture.md says what a compiled region does not show)."""
import json
import os
import re
import unittest

from tidemark_env import PYTHON, Daemon, live_bytes_at, torch_version

HERE = os.path.dirname(os.path.abspath(__file__))


class TrainingBreakdownTest(unittest.TestCase):
    daemon = None
    runs = {}

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.runs = {}
        cls.forms = {}  # the GPT under torch 2's other checkpoint forms
        jobs = [("gpt", ["--model", "gpt"]), ("convnet", ["--model", "convnet"])]
        if torch_version() >= (2, 0):
            jobs += [("gpt-" + form, ["--model", "gpt", "--checkpoint", form])
                     for form in ("nonreentrant", "sac")]
            jobs += [("gpt-foreach-keep-grads", ["--model", "gpt", "--optimizer", "foreach",
                                                 "--keep-grads"]),
                     ("gpt-fused", ["--model", "gpt", "--optimizer", "fused"])]
            jobs.append(("gpt2", ["--model", "gpt2"]))
            jobs += [("gpt-compiled-" + how, ["--model", "gpt", "--compile", how])
                     for how in ("whole", "blocks")]
            # Op scopes (tidemark run --ops) beside each checkpoint form and a compiled model.
            jobs += [(name + "+ops", args) for name, args in list(jobs)
                     if name in ("gpt-nonreentrant", "gpt-sac", "gpt2", "gpt-compiled-whole")]
            jobs.append(("gpt+ops", ["--model", "gpt"]))
        for name, args in jobs:
            out = os.path.join(cls.daemon.dir, name + ".json")
            r = cls.daemon.run(PYTHON, os.path.join(HERE, "truth_train.py"), *args,
                               "--steps", "3", "--out", out,
                               env={"TIDEMARK_OPS": "1" if name.endswith("+ops") else "0"})
            if r.returncode != 0:
                raise AssertionError("training failed: %s\n%s" % (r.stdout, r.stderr))
            with open(out) as f:
                truth = json.load(f)
            session = cls.daemon.wait_analyzed(cls.daemon.newest_session()["id"])
            run = {"truth": truth, "session": session, "stderr": r.stderr}
            (cls.runs if name in ("gpt", "convnet") else cls.forms)[name] = run

    @classmethod
    def tearDownClass(cls):
        if cls.daemon:
            cls.daemon.cleanup()

    def check_step_peaks(self, model):
        run = self.runs.get(model) or self.forms[model]
        truth, sid = run["truth"], run["session"]["id"]
        batch_bytes = sum(sum(st["batch"].values()) for st in truth["steps"])
        self.assertEqual(run["session"]["steps"], len(truth["steps"]))
        weight_truth = sum(truth["params"]["storages"].values())
        for step, st in enumerate(truth["steps"], start=1):
            b = self.daemon.cli_json("breakdown", str(sid), "--step", str(step))
            cats = {k: v["bytes"] for k, v in b["categories"].items()}
            seq = b["seq"]
            with self.subTest(model=model, step=step):
                self.assertTrue(b["at_peak"])
                self.assertEqual(b["step"], step)
                # When: the peak's time from the session's start.
                s = run["session"]
                self.assertEqual(b["offset_ns"], b["ts_ns"] - s["start_ts_ns"])
                self.assertTrue(0 < b["offset_ns"] <= s["end_ts_ns"] - s["start_ts_ns"])
                self.assertEqual(cats["WEIGHT"], weight_truth)
                self.assertEqual(cats["OPTIMIZER_STATE"],
                                 live_bytes_at(self.daemon, sid, seq, st["optimizer"]))
                if step > 1:  # the state exists from the first step on
                    self.assertEqual(cats["OPTIMIZER_STATE"], sum(st["optimizer"]["storages"].values()))
                self.assertEqual(cats["GRADIENT"], live_bytes_at(self.daemon, sid, seq, st["grads"]))
                saved = live_bytes_at(self.daemon, sid, seq, st["saved"])
                self.assertGreater(saved, 0, "the peak should hold saved activations")
                self.assertLessEqual(abs(cats["ACTIVATION"] - saved), 0.02 * saved,
                                     "ACTIVATION %d vs saved-for-backward %d" %
                                     (cats["ACTIVATION"], saved))
                self.assertEqual(sum(cats.values()), b["tracked_bytes"])
                # The batches (all made before the first step), the inputs the model took
                # (the GPT-2 takes the same tensor as input_ids and labels).
                self.assertEqual(cats["INPUT"],
                                 batch_bytes // 2 if model.startswith("gpt2") else batch_bytes)

    def test_gpt_step_peaks_match_ground_truth(self):
        self.check_step_peaks("gpt")

    def test_convnet_step_peaks_match_ground_truth(self):
        self.check_step_peaks("convnet")

    def test_torch2_checkpoint_forms_match_ground_truth(self):
        if not self.forms:
            self.skipTest("torch 1.13: non-reentrant and selective checkpoints are torch 2's")
        for name, run in self.forms.items():
            self.check_step_peaks(name)
            s = run["session"]
            with self.subTest(form=name):
                self.assertEqual(s["events_sent"], s["events_stored"])
                self.assertEqual(s["events_dropped"], 0)
                # e.g. no scope ended that was not open. A thread that waited for room in its ring
                # (a loaded machine: op scopes are many events) lost nothing and is no anomaly.
                stats = {k: v for k, v in s["stats"].items() if k != "agent_ring_waits"}
                self.assertEqual(stats, {})
                # Nothing in the job's output but the agent's line: no warning the adapter caused
                # (SAC warns when saved-tensor hooks are in scope and it was not told what to do).
                # (torch's inductor says where it looked for CUDA, with tidemark or without.)
                lines = [l for l in run["stderr"].splitlines()
                         if l.strip() and "No CUDA runtime is found" not in l]
                self.assertEqual(len(lines), 1, run["stderr"])
                self.assertTrue(lines[0].startswith("tidemark: session"), run["stderr"])
        for name, run in self.forms.items():
            if not name.endswith("+ops"):
                continue
            with self.subTest(ops=name):
                sid = run["session"]["id"]
                ops = {o["name"]: o for o in self.daemon.cli_json("ops", str(sid))["ops"]
                       if o["kind"] == "op"}
                # The matrix products of the model (linear layers: addmm; GPT-2's Conv1D: addmm
                # too), in forward and backward, at least once a step each.
                self.assertGreaterEqual(ops["aten::addmm"]["calls"], 3)
                self.assertGreaterEqual(ops["aten::mm"]["calls"], 3)
                # The peak's memory by op: the activations (or their recomputations) counted to
                # the ops that made them (aten::addmm, aten::gelu, ...: never the allocation
                # helper aten::empty such an op calls); a compiled graph's to the graph, one op
                # (its kernels are inductor's, not the dispatcher's).
                peak_ops = self.daemon.cli_json("peak", str(sid))["ops"]
                made = {o["name"] for o in peak_ops
                        if o["category"] in ("ACTIVATION", "RECOMPUTED")}
                if "compiled" in name:
                    self.assertIn("CompiledFunction", made)
                else:
                    self.assertTrue({n for n in made if n.startswith("aten::")}, peak_ops)
                self.assertNotIn("aten::empty", made)
                # Without the op scopes: none.
                plain = self.forms.get(name[:-len("+ops")]) or self.runs[name[:-len("+ops")]]
                self.assertFalse([o for o in self.daemon.cli_json(
                    "ops", str(plain["session"]["id"]))["ops"] if o["kind"] == "op"])
        for how in ("whole", "blocks"):
            # Inside a compiled region there are no module scopes: the compiled model's (or
            # block's) own is the innermost, where its saved tensors are tagged.
            sid = self.forms["gpt-compiled-" + how]["session"]["id"]
            p = self.daemon.cli_json("peak", str(sid))
            names = {t["name"] for t in p["tensors"] if t["category"] == "ACTIVATION"}
            self.assertTrue(names)
            if how == "whole":
                self.assertEqual(names, {"CheckpointedGPT:saved"})
            else:
                self.assertFalse([n for n in names if re.search(r"blocks\.\d+\.", n)], names)
                self.assertTrue(names & {"CheckpointedGPT.blocks.%d:saved" % i for i in range(4)},
                                names)

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
                self.check_step_peaks(model)
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
