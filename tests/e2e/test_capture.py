"""Capture schedules on the examples' real training: `tidemark run --steps 3-4` records steps 3-4 in
full detail, with the same breakdown at their peaks as a full recording of the same training,
and every other step as the agent's summary, whose peak equals the full recording's step peak;
nothing is counted lost, and fewer events are sent. The options' mistakes are usage errors."""
import os
import subprocess
import unittest

from tidemark_env import BIN, PYTHON, Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train.py")
STEPS = 6
# One intra-op thread: the same allocations in the same order in every run, so that two runs of
# the training have the same peaks to the byte.
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def record(daemon, *schedule):
    env = dict(os.environ)
    env.update(ENV)
    r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", daemon.address, "run",
                        *schedule, "--", PYTHON, TRAIN, "--steps", str(STEPS), "--layers", "2"],
                       capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        raise AssertionError("training failed (%d): %s" % (r.returncode, r.stderr))
    return daemon.wait_analyzed(daemon.newest_session()["id"])


def stats(daemon, sid):
    return dict(daemon.sql("SELECT name, value FROM stat WHERE session_id = ?", sid))


class CaptureScheduleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.full = record(cls.daemon)
        cls.scheduled = record(cls.daemon, "--steps", "3-4")
        cls.every = record(cls.daemon, "--every", "3", "--window", "2")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def steps(self, session):
        out = self.daemon.cli_json("steps", str(session["id"]))
        return {s["step"]: s for s in out["steps"]}

    def test_the_chosen_steps_are_in_full_detail_with_the_full_recordings_breakdown(self):
        full, scheduled = self.steps(self.full), self.steps(self.scheduled)
        self.assertEqual(sorted(scheduled), list(range(1, STEPS + 1)))
        self.assertEqual([s for s in scheduled if not scheduled[s]["summarized"]], [3, 4])
        for step in (3, 4):
            with self.subTest(step=step):
                a = self.daemon.cli_json("breakdown", str(self.full["id"]), "--step", str(step))
                b = self.daemon.cli_json("breakdown", str(self.scheduled["id"]), "--step",
                                         str(step))
                self.assertEqual(b["tracked_bytes"], a["tracked_bytes"])
                self.assertEqual({k: v["bytes"] for k, v in b["categories"].items()},
                                 {k: v["bytes"] for k, v in a["categories"].items()})
                self.assertEqual(scheduled[step]["peak"]["tracked_bytes"],
                                 full[step]["peak"]["tracked_bytes"])
                self.assertGreater(a["categories"]["WEIGHT"]["bytes"], 0)

    def test_the_other_steps_summaries_equal_the_full_recordings_step_peaks(self):
        full, scheduled = self.steps(self.full), self.steps(self.scheduled)
        for step in (1, 2, 5, 6):
            with self.subTest(step=step):
                s, f = scheduled[step], full[step]
                self.assertTrue(s["summarized"])
                self.assertFalse(f["summarized"])
                self.assertGreater(s["events_summarized"], 100)
                self.assertEqual(s["peak"]["tracked_bytes"], f["peak"]["tracked_bytes"])
                # The tags' categories at the peak: the weights and optimizer state exactly.
                for cat in ("WEIGHT", "OPTIMIZER_STATE"):
                    self.assertEqual(s["peak"]["categories"][cat]["bytes"],
                                     f["peak"]["categories"][cat]["bytes"], cat)
                self.assertEqual(sum(c["bytes"] for c in s["peak"]["categories"].values()),
                                 s["peak"]["tracked_bytes"])
                # The step's time is the step's, as recorded.
                self.assertGreater(s["end_ts_ns"], s["begin_ts_ns"])
                # Asked for directly, the step's peak is its summary (not a replay of what was
                # sent), said to be one.
                b = self.daemon.cli_json("breakdown", str(self.scheduled["id"]), "--step",
                                         str(step))
                self.assertTrue(b["summarized"])
                self.assertEqual(b["tracked_bytes"], f["peak"]["tracked_bytes"])
                p = self.daemon.cli_json("peak", str(self.scheduled["id"]), "--step", str(step))
                self.assertEqual(p["breakdown"]["tracked_bytes"], f["peak"]["tracked_bytes"])
                text = self.daemon.cli("breakdown", str(self.scheduled["id"]), "--step",
                                       str(step)).stdout
                self.assertIn("a summarized step", text)

    def test_the_advisor_plans_from_the_last_step_recorded_in_detail(self):
        sid = str(self.scheduled["id"])
        chain = self.daemon.cli("chain", sid).stdout
        self.assertIn("from step 4 ", chain)
        plan = self.daemon.cli("plan", sid, "--budget", "70%", check=False)
        self.assertEqual(plan.returncode, 0, plan.stderr)

    def test_every_window_details_the_windows_and_summarizes_between(self):
        every = self.steps(self.every)
        full = self.steps(self.full)
        self.assertEqual([s for s in sorted(every) if not every[s]["summarized"]], [1, 2, 4, 5])
        for step in every:
            self.assertEqual(every[step]["peak"]["tracked_bytes"],
                             full[step]["peak"]["tracked_bytes"], step)

    def test_nothing_is_lost_and_less_is_sent(self):
        for session in (self.scheduled, self.every):
            st = stats(self.daemon, session["id"])
            with self.subTest(session=session["id"]):
                for lost in ("seq_gap", "reorder_overflow", "free_of_untracked",
                             "summarized_overlap", "alloc_over_live"):
                    self.assertEqual(st.get(lost, 0), 0, lost)
                self.assertGreater(st["events_summarized"], 1000)
                self.assertGreater(st["blocks_restated"], 0)
                self.assertEqual(session["events_dropped"], 0)
        # Fewer are sent in the steps (4 of 6 summarized); what comes before the first step
        # (torch's import, the model's making: the same in both runs) always goes in detail.
        def in_steps(session):
            (first,), = self.daemon.sql("SELECT MIN(begin_seq) FROM step WHERE session_id = ?",
                                        session["id"])
            return session["events_stored"] - (first - 1)
        self.assertLess(in_steps(self.scheduled), in_steps(self.full) * 0.6)
        # The text view marks the summarized steps.
        text = self.daemon.cli("steps", str(self.scheduled["id"])).stdout
        self.assertIn("DETAIL", text)
        self.assertEqual(text.count("summary"), 4)

    def test_a_device_the_session_has_no_memory_of_is_said(self):
        # A CPU training asked for its GPU memory: an error naming what it has, not an empty
        # answer at no moment.
        for command in ("breakdown", "peak", "steps"):
            r = self.daemon.cli(command, str(self.full["id"]), "--device", "cuda", check=False)
            self.assertEqual(r.returncode, 1, command)
            self.assertIn("recorded no cuda memory (it has cpu)", r.stderr, command)

    def test_a_bad_schedule_is_a_usage_error_and_runs_nothing(self):
        for args in (["--steps", "0-2"], ["--steps", "4-3"], ["--steps", "x"],
                     ["--steps", "3-4", "--every", "2"], ["--window", "2"],
                     ["--every", "2", "--window", "3"]):
            with self.subTest(args=args):
                r = self.daemon.cli("run", *args, "--", "true", check=False)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("tidemark run:", r.stderr)
        r = self.daemon.cli("attach", "1", "--steps", "0", check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        # A bad schedule in the agent's environment (no CLI to check it) leaves the job running,
        # recorded in full detail, and says so.
        env = dict(os.environ, TIDEMARK_CAPTURE_STEPS="soon", TIDEMARK_SERVER=self.daemon.address,
                   LD_PRELOAD=os.path.join(BIN, "..", "lib", "libtidemark_agent.so"))
        r = subprocess.run([PYTHON, "-c", "print('trained')"], capture_output=True, text=True,
                           env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "trained")
        self.assertIn("capture schedule ignored", r.stderr)

if __name__ == "__main__":
    unittest.main()
