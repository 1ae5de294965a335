"""End to end on torch 2 only: the GPT of test_training under torch 2's other forms of training,
each under `tidemark run`, its stored step peaks checked against the ground truth the run
computed itself. CheckpointFormsTest: non-reentrant checkpoints, selective activation
checkpointing (a policy saving the matrix products), AdamW for-each (gradients kept, zeroed) and
fused, and a GPT-2 of the `transformers` library, called with keywords, trained with its own
activation-checkpointing switch. CompiledTest: the GPT (without checkpoints) under torch.compile
(inductor), whole and per block: the categories are as exact there (docs/architecture.md says what
a compiled region does not show). Each with op scopes (`tidemark run --ops`) beside some of them.
Two classes, two ctest entries (e2e_torch2_checkpoint_forms, e2e_torch2_compiled): on a loaded
machine each stays well inside its time limit."""
import re
import unittest

from tidemark_env import Daemon, torch_version
from training_truth import StepPeakChecks, run_training


class FormsTestBase(StepPeakChecks):
    JOBS = ()  # (name, truth_train.py arguments); a name ending "+ops" records op scopes

    @classmethod
    def setUpClass(cls):
        if torch_version() < (2, 0):
            raise unittest.SkipTest("torch 1.13: these forms are torch 2's (run under torch2)")
        cls.daemon = Daemon()
        cls.runs = {}
        try:
            for name, args in cls.JOBS:
                cls.runs[name] = run_training(cls.daemon, name, args, ops=name.endswith("+ops"))
        except BaseException:
            cls.daemon.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

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


if __name__ == "__main__":
    unittest.main()
