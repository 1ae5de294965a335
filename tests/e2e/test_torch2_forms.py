"""End to end on torch 2 only: the GPT of test_training under torch 2's other forms of training,
each under `tidemark run`, its stored step peaks checked against the ground truth the run
computed itself. CheckpointFormsTest: non-reentrant checkpoints, selective activation
checkpointing (a policy saving the matrix products), AdamW for-each (gradients kept, zeroed) and
fused, and a GPT-2 of the `transformers` library, called with keywords, trained with its own
activation-checkpointing switch. CompiledTest: the GPT (without checkpoints) under torch.compile
(inductor), whole and per block: the categories are as exact there (docs/architecture.md says what
a compiled region does not show). Each with op scopes (`tidemark run --ops`) beside some of them.
CompiledTest also applies a plan through the daemon to a compiled training in mid-run.
TrainerTest: a training run by the `transformers` Trainer. Three classes, three ctest entries
(e2e_torch2_checkpoint_forms, e2e_torch2_compiled, e2e_torch2_trainer): on a loaded machine each
stays well inside its time limit."""
import json
import os
import re
import subprocess
import sys
import unittest

from tidemark_env import BIN, Daemon, PYTHON, SOURCE, torch_version
from training_truth import StepPeakChecks, run_training

TRAIN = os.path.join(SOURCE, "examples", "train.py")
HERE = os.path.dirname(os.path.abspath(__file__))
FORWARD_PHASE, OPTIMIZER_PHASE, EVAL_PHASE = 1, 4, 5  # tidemark.v1.Phase


class Torch2Recordings:
    """A daemon of the class's own, and the trainings `record()` runs under it (torch 2 only)."""

    @classmethod
    def setUpClass(cls):
        if torch_version() < (2, 0):
            raise unittest.SkipTest("torch 1.13: these forms are torch 2's (run under torch2)")
        cls.daemon = Daemon()
        cls.runs = {}
        try:
            cls.record()
        except BaseException:
            cls.daemon.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()


class FormsTestBase(Torch2Recordings, StepPeakChecks):
    JOBS = ()  # (name, truth_train.py arguments); a name ending "+ops" records op scopes

    @classmethod
    def record(cls):
        for name, args in cls.JOBS:
            cls.runs[name] = run_training(cls.daemon, name, args, ops=name.endswith("+ops"))

    def test_step_peaks_match_ground_truth(self):
        for name, run in self.runs.items():
            self.check_step_peaks(name, run)
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

    def test_op_scopes_only_when_asked(self):
        recorded = [name for name in self.runs if name.endswith("+ops")]
        self.assertTrue(recorded)
        for name, run in self.runs.items():
            sid = run["session"]["id"]
            ops = {o["name"]: o for o in self.daemon.cli_json("ops", str(sid))["ops"]
                   if o["kind"] == "op"}
            with self.subTest(run=name):
                if not name.endswith("+ops"):
                    self.assertEqual(ops, {})  # without the op scopes: none
                    continue
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


class CheckpointFormsTest(FormsTestBase, unittest.TestCase):
    JOBS = (("gpt-nonreentrant", ["--model", "gpt", "--checkpoint", "nonreentrant"]),
            ("gpt-sac", ["--model", "gpt", "--checkpoint", "sac"]),
            ("gpt-foreach-keep-grads", ["--model", "gpt", "--optimizer", "foreach",
                                        "--keep-grads"]),
            ("gpt-fused", ["--model", "gpt", "--optimizer", "fused"]),
            ("gpt2", ["--model", "gpt2"]),
            ("gpt-nonreentrant+ops", ["--model", "gpt", "--checkpoint", "nonreentrant"]),
            ("gpt-sac+ops", ["--model", "gpt", "--checkpoint", "sac"]),
            ("gpt2+ops", ["--model", "gpt2"]),
            ("gpt+ops", ["--model", "gpt"]))


class CompiledTest(FormsTestBase, unittest.TestCase):
    JOBS = (("gpt-compiled-whole", ["--model", "gpt", "--compile", "whole"]),
            ("gpt-compiled-blocks", ["--model", "gpt", "--compile", "blocks"]),
            ("gpt-compiled-whole+ops", ["--model", "gpt", "--compile", "whole"]))

    def test_saved_tensors_are_tagged_to_the_compiled_region(self):
        for how in ("whole", "blocks"):
            # Inside a compiled region there are no module scopes: the compiled model's (or
            # block's) own is the innermost, where its saved tensors are tagged.
            sid = self.runs["gpt-compiled-" + how]["session"]["id"]
            p = self.daemon.cli_json("peak", str(sid))
            names = {t["name"] for t in p["tensors"] if t["category"] == "ACTIVATION"}
            with self.subTest(how=how):
                self.assertTrue(names)
                if how == "whole":
                    self.assertEqual(names, {"CheckpointedGPT:saved"})
                else:
                    self.assertFalse([n for n in names if re.search(r"blocks\.\d+\.", n)], names)
                    self.assertTrue(
                        names & {"CheckpointedGPT.blocks.%d:saved" % i for i in range(4)}, names)

    def test_apply_to_running_compiled_job(self):
        """A job trained under torch.compile (the whole model): a plan made from an eager
        recording of the same model, applied through the daemon in mid-run, is compiled into the
        model (torch recompiles at the next step): the peak falls, the losses are the eager
        ones, plan-check shows it applied with no note (the compiled forward calls no block
        hooks: not taken for a forward that left the plan's path)."""
        steps = 16
        daemon = self.daemon
        r = daemon.run(PYTHON, TRAIN, "--steps", str(steps), "--checkpoint", "")
        self.assertEqual(r.returncode, 0, r.stderr)
        base_losses = losses(r.stdout)
        eager = max(s["id"] for s in daemon.cli_json("sessions")["sessions"])
        daemon.wait_analyzed(eager)
        plan = os.path.join(daemon.dir, "eager.json")
        daemon.cli("plan", str(eager), "--budget", "50%", "--out", plan)
        job = subprocess.Popen(
            [os.path.join(BIN, "tidemark"), "--server", daemon.address, "run", "--", PYTHON,
             TRAIN, "--steps", str(steps), "--checkpoint", "", "--compile"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            sid = daemon.wait_live_steps(3, timeout=600)
            r = daemon.cli("apply", str(sid), plan, "--wait", "300")
            self.assertIn("applied to session %d from step" % sid, r.stdout)
            out, err = job.communicate(timeout=900)
        finally:
            if job.poll() is None:
                job.kill()
        self.assertEqual(job.returncode, 0, err)
        got = losses(out)
        self.assertEqual(len(got), steps)
        for a, b in zip(got, base_losses):
            self.assertAlmostEqual(a, b, delta=1e-4 * max(1.0, abs(b)))
        daemon.wait_analyzed(sid)
        check = daemon.cli_json("plan-check", str(sid))["plans"]
        self.assertEqual([p["state"] for p in check], ["applied"], check)
        good = check[0]
        self.assertNotIn("another path", good.get("message", ""), good)
        self.assertGreaterEqual(good["steps_measured"], 2)
        # The compiled model saves other tensors than the eager one the plan was predicted
        # for: the peak falls, by about the plan's saving (printed, compared loosely).
        self.assertLess(good["measured_peak_bytes"], 0.8 * good["before_peak_bytes"], good)
        # The recomputation runs inside the compiled backward: no recompute phase to measure,
        # which plan-check says rather than showing a free recomputation.
        self.assertEqual(good["measured_extra_ns"], 0, good)
        text = daemon.cli("plan-check", str(sid)).stdout
        self.assertRegex(text, r"recompute +[0-9.]+ ms +not seen")
        self.assertIn("no recomputation recorded: under torch.compile", text)
        print("compiled live apply: before %d, predicted %d (eager), measured %d (%+.2f %%)"
              % (good["before_peak_bytes"], good["predicted_peak_bytes"],
                 good["measured_peak_bytes"], 100 * good["peak_error"]), file=sys.stderr)


class TrainerTest(Torch2Recordings, unittest.TestCase):
    """A training run by the `transformers` Trainer (trainer_train.py: a GPT-2 with its own
    non-reentrant checkpointing, gradient accumulation, a warm-up schedule, clipping, evaluation
    passes, checkpoints saved), in float32 and in bfloat16 (autocast around the forward): the
    steps are its optimizer steps, its evaluations their own phase, and weights, gradients and
    optimizer state exact at every step's peak, nothing there unknown."""
    STEPS = 8

    @classmethod
    def record(cls):
        for form in ("float32", "bfloat16"):
            out = os.path.join(cls.daemon.dir, form + ".json")
            saved = os.path.join(cls.daemon.dir, form)
            r = cls.daemon.run(PYTHON, os.path.join(HERE, "trainer_train.py"), "--steps",
                               str(cls.STEPS), "--dir", saved, "--out", out,
                               *(["--bf16"] if form == "bfloat16" else []))
            if r.returncode != 0:
                raise AssertionError("training failed: %s\n%s" % (r.stdout, r.stderr))
            with open(out) as f:
                truth = json.load(f)
            session = cls.daemon.wait_analyzed(cls.daemon.newest_session()["id"])
            cls.runs[form] = {"truth": truth, "session": session}

    def test_steps_are_optimizer_steps_and_evaluations_their_own_phase(self):
        for form, run in self.runs.items():
            truth, sid = run["truth"], run["session"]["id"]
            with self.subTest(form=form):
                self.assertEqual(truth["checkpoints"], ["checkpoint-4", "checkpoint-8"])
                self.assertEqual(len(truth["losses"]), self.STEPS)
                self.assertEqual(run["session"]["steps"], self.STEPS)
                self.assertEqual(run["session"]["events_dropped"], 0)
                phases = dict(self.daemon.sql(
                    "SELECT phase, COUNT(*) FROM phase WHERE session_id = ? GROUP BY phase", sid))
                self.assertEqual(phases.get(FORWARD_PHASE), truth["forwards"]["train"])
                self.assertEqual(phases.get(EVAL_PHASE), truth["forwards"]["eval"])
                self.assertEqual(phases.get(OPTIMIZER_PHASE), self.STEPS)

    def test_weights_gradients_and_optimizer_state_exact_at_every_peak(self):
        for form, run in self.runs.items():
            truth, sid = run["truth"], run["session"]["id"]
            steps = self.daemon.cli_json("steps", str(sid))["steps"]
            self.assertEqual(len(steps), self.STEPS)
            for st in steps[1:]:  # from the second: the optimizer's state is made at the first
                cats = {k: v["bytes"] for k, v in st["peak"]["categories"].items()}
                with self.subTest(form=form, step=st["step"]):
                    self.assertEqual(cats["WEIGHT"], truth["weight_bytes"])
                    # The peak is in the second micro-batch's backward: every gradient is there.
                    self.assertEqual(cats["GRADIENT"], truth["gradient_bytes"])
                    self.assertEqual(cats["OPTIMIZER_STATE"], truth["optimizer_bytes"])
                    self.assertLess(cats["UNKNOWN"], 1024, cats)

    def test_autocast_cache_inside_the_models_checkpoints_is_named(self):
        sid = self.runs["bfloat16"]["session"]["id"]
        names = [n for (n,) in self.daemon.sql(
            "SELECT DISTINCT s.value FROM tag t JOIN string s ON s.session_id = t.session_id "
            "AND s.iid = t.name_id WHERE t.session_id = ? AND t.category = 8", sid)]
        # Every layer's four matrices (attention in and out, MLP in and out).
        self.assertEqual(len([n for n in names if n.endswith(
            ".weight (bfloat16 cast, autocast cache)")]), 4 * 4, names)


def losses(stdout):
    return [float(m.group(1)) for m in re.finditer(r"^step \d+ loss ([0-9.]+)", stdout, re.M)]


if __name__ == "__main__":
    unittest.main()
