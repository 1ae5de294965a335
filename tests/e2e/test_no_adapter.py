"""A training profiled without the Python adapter (`tidemark run --no-adapter`): only allocations
are recorded; the analysis finds the steps from the recording's periodicity and categorizes by
lifetime rules. The same training with the adapter marks its steps: the two must agree."""
import os
import unittest

from tidemark_env import PYTHON, SOURCE, Daemon

STEPS = 5


class NoAdapterTest(unittest.TestCase):
    def test_steps_inferred_from_periodicity(self):
        daemon = Daemon()
        try:
            script = os.path.join(SOURCE, "examples", "train.py")
            args = [PYTHON, script, "--steps", str(STEPS)]
            r = daemon.run(*args)  # with the adapter: marked steps
            self.assertEqual(r.returncode, 0, r.stderr)
            marked = daemon.newest_session()
            r = daemon.cli("run", "--no-adapter", "--", *args)
            self.assertEqual(r.returncode, 0, r.stderr)
            bare = daemon.newest_session()
            self.assertNotEqual(bare["id"], marked["id"])
            self.assertEqual(bare["events_dropped"], 0)
            daemon.wait_analyzed(bare["id"])
            daemon.wait_analyzed(marked["id"])
            inferred = daemon.cli_json("steps", str(bare["id"]))["steps"]
            expected = daemon.cli_json("steps", str(marked["id"]))["steps"]
            self.assertEqual(len(inferred), STEPS)
            # Said so, to scripts and people: a guess is not a mark.
            self.assertEqual([s["inferred"] for s in inferred], [True] * STEPS)
            self.assertEqual([s["inferred"] for s in expected], [False] * STEPS)
            self.assertIn("steps inferred from the memory's repetition",
                          daemon.cli("steps", str(bare["id"])).stdout)
            self.assertNotIn("inferred", daemon.cli("steps", str(marked["id"])).stdout)
            for a, b in zip(inferred, expected):
                with self.subTest(step=a["step"]):
                    got, want = a["peak"]["tracked_bytes"], b["peak"]["tracked_bytes"]
                    self.assertLessEqual(abs(got - want), 0.01 * want)
            stored = daemon.sql("SELECT COUNT(*) FROM step WHERE session_id = ? AND inferred = 1",
                                bare["id"])[0][0]
            self.assertEqual(stored, STEPS)
            # Nothing told the agent what tensors are for, nor marked phases: no WEIGHT.
            peak = daemon.cli_json("breakdown", str(bare["id"]))["categories"]
            self.assertEqual(peak["WEIGHT"]["bytes"], 0)
            phases = daemon.sql("SELECT COUNT(*) FROM phase WHERE session_id = ?", bare["id"])[0][0]
            self.assertEqual(phases, 0)
        finally:
            daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
