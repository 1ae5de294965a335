"""The trainings of `truth_train.py` under `tidemark run`, and the checks of their stored step
peaks against the ground truth each training computed itself (shared by the suites that run
them: test_training, test_torch2_forms)."""
import json
import os

from tidemark_env import PYTHON, live_bytes_at

HERE = os.path.dirname(os.path.abspath(__file__))


def run_training(daemon, name, args, ops=False, steps=3):
    """Runs truth_train.py ARGS under `tidemark run` (with op scopes when OPS); returns its ground
    truth, its analysed session and its standard error."""
    out = os.path.join(daemon.dir, name + ".json")
    r = daemon.run(PYTHON, os.path.join(HERE, "truth_train.py"), *args, "--steps", str(steps),
                   "--out", out, env={"TIDEMARK_OPS": "1" if ops else "0"})
    if r.returncode != 0:
        raise AssertionError("training %s failed: %s\n%s" % (name, r.stdout, r.stderr))
    with open(out) as f:
        truth = json.load(f)
    session = daemon.wait_analyzed(daemon.newest_session()["id"])
    return {"truth": truth, "session": session, "stderr": r.stderr}


class StepPeakChecks:
    """A TestCase mixin: `check_step_peaks(name, run)` compares each step's stored peak with the
    training's own figures (self.daemon is the daemon that stored it)."""

    def check_step_peaks(self, model, run):
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
                    self.assertEqual(cats["OPTIMIZER_STATE"],
                                     sum(st["optimizer"]["storages"].values()))
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
