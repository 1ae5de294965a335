"""The adapter is invisible to the job: its hooks failing, or a detach while they run, do not
reach it; every LR scheduler of torch.optim.lr_scheduler (and a
sequential and a chained one), GradScaler, swa_utils, an optimizer state_dict saved and loaded
mid-run and a subclassed optimizer train with the same losses and learning rates, digit for digit,
under `tidemark run` and under `tidemark attach` (schedulers created before the attach and stepped
across it, created while attached, created after the detach) as without tidemark."""
import os
import re
import subprocess
import tempfile
import unittest

from tidemark_env import DaemonTestCase, PYTHON
from test_attach import Job

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scheduler_train.py")


def training_lines(text):
    return [l for l in text.splitlines() if " step " in l or " swa " in l]


class AdapterInvisibleTest(DaemonTestCase):
    def plain(self, *args):
        r = subprocess.run([PYTHON, SCRIPT, *args], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_a_failing_hook_and_a_detach_inside_one_leave_the_job_alone(self):
        # The adapter's optimizer hook failing (at step 1), its module hooks (at step 2), every
        # call of it into the agent (steps 3 and 4: through a DataLoader, a checkpoint, a
        # backward, gradient clipping, a module and an optimizer made in the step), a detach
        # between two reads of the phase stack (at step 5: the job died of an IndexError there,
        # and then of a SIGSEGV as the agent's exit met the detach): the job trains the same
        # steps to the same losses and ends with 0; the first failure is said, once.
        script = os.path.join(HERE, "hook_race_train.py")
        r = subprocess.run([PYTHON, script], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("adapter off", r.stdout)
        r2 = self.daemon.run(PYTHON, script)
        self.assertEqual(r2.returncode, 0, r2.stderr)
        self.assertIn("adapter on", r2.stdout)
        self.assertEqual(training_lines(r2.stdout), training_lines(r.stdout))
        self.assertEqual(len(training_lines(r.stdout)), 7)
        self.assertNotIn("Traceback", r2.stderr)
        self.assertEqual(r2.stderr.count("tidemark: the adapter's optimizer hook failed "
                                         "(RuntimeError: broken on purpose)"), 1, r2.stderr)
        self.assertEqual(r2.stderr.count("hook failed"), 1, r2.stderr)
        # The session says so too: every failure counted while the agent was there to count it
        # (the optimizer hook at step 1, the module hooks at step 2; not those of the broken
        # agent).
        session = self.daemon.newest_session()
        failures = session["stats"]["adapter_failures"]
        self.assertEqual(failures["severity"], "error")
        self.assertGreaterEqual(failures["value"], 3, failures)
        # And so do the answers a person reads (not only sessions --json).
        self.daemon.wait_analyzed(session["id"])
        for command in ("breakdown", "peak", "steps"):
            out = self.daemon.cli(command, str(session["id"])).stdout
            self.assertIn("caution: adapter: times a hook or wrapper of the Python adapter failed",
                          out, command)
            self.assertIn(": %d (adapter_failures)" % failures["value"], out, command)

    def test_a_job_killed_after_its_hooks_failed_still_says_they_failed(self):
        # SIGKILLed after steps 1 and 2 (the optimizer hook's and the module hooks' failures):
        # no goodbye carries the agent's counts, yet the aborted session has them, as its agent
        # reported them with its batches, and a person reading its breakdown is told.
        script = os.path.join(HERE, "hook_race_train.py")
        r = self.daemon.run(PYTHON, script, env={"HOOK_RACE_KILL_AFTER": "2"})
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("train step 2 loss", r.stdout)
        self.assertNotIn("train step 3", r.stdout)
        session = self.daemon.newest_session()
        self.assertEqual(session["state"], "aborted", session)
        self.assertIn("stream_lost", session["stats"])
        failures = session["stats"]["adapter_failures"]
        self.assertEqual(failures["severity"], "error")
        self.assertGreaterEqual(failures["value"], 3, failures)
        self.assertEqual(session["stats"]["agent_counters_early"]["severity"], "info")
        self.daemon.wait_analyzed(session["id"])
        out = self.daemon.cli("breakdown", str(session["id"])).stdout
        self.assertIn(": %d (adapter_failures)" % failures["value"], out)

    def test_a_failure_after_the_last_record_reaches_a_killed_jobs_session(self):
        # After step 0 (no failure yet) the job records nothing more: an adapter hook fails, the
        # job is SIGKILLed 2 s later. No batch of events follows the failure to carry the
        # counters and no goodbye comes; the agent sends them alone.
        script = os.path.join(HERE, "hook_race_train.py")
        r = self.daemon.run(PYTHON, script,
                            env={"HOOK_RACE_KILL_AFTER": "0", "HOOK_RACE_FAIL_LAST": "1"})
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("train step 0 loss", r.stdout)
        self.assertNotIn("train step 1", r.stdout)
        self.assertIn("tidemark: the adapter's last hook failed", r.stderr)
        session = self.daemon.newest_session()
        self.assertEqual(session["state"], "aborted", session)
        failures = session["stats"].get("adapter_failures")
        self.assertIsNotNone(failures, session["stats"])
        self.assertEqual(failures["value"], 1, failures)
        self.assertEqual(failures["severity"], "error")

    def test_every_scheduler_under_tidemark_run(self):
        expected = self.plain()
        lines = training_lines(expected)
        self.assertGreater(len(lines), 100)
        r = self.daemon.run(PYTHON, SCRIPT)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(training_lines(r.stdout), lines)
        self.assertNotIn("Traceback", r.stderr)
        self.assertNotIn("overridden after learning rate scheduler", r.stderr)
        s = self.daemon.newest_session()
        self.assertEqual(s["state"], "ended")
        self.assertNotIn("adapter_failures", s["stats"])
        self.daemon.wait_analyzed(s["id"])
        self.assertNotIn("caution", self.daemon.cli("breakdown", str(s["id"])).stdout)
        # Every optimizer step of every case is one recorded step (6 per training).
        self.assertEqual(s["steps"], len([l for l in lines if " step " in l]))

    def test_every_scheduler_across_attach_and_detach(self):
        with tempfile.TemporaryDirectory() as gates:
            for g in ("attached", "detached"):
                open(os.path.join(gates, "go." + g), "w").close()
            expected = training_lines(self.plain("--gate", gates))
        with tempfile.TemporaryDirectory() as gates:
            job = Job(command=[PYTHON, "-u", SCRIPT, "--gate", gates])
            try:
                self.wait_line(job, "gate attached")
                self.daemon.cli("attach", str(job.pid))
                open(os.path.join(gates, "go.attached"), "w").close()
                self.wait_line(job, "gate detached")
                self.daemon.cli("detach", str(job.pid))
                open(os.path.join(gates, "go.detached"), "w").close()
                rc, out, err = job.finish()
            finally:
                job.kill()
        self.assertEqual(rc, 0, err)
        self.assertEqual(training_lines(out), expected)
        s = self.daemon.newest_session()
        # While attached: the rest of the "before" trainings (3 steps each) and whole "attached"
        # ones (6 steps each) were recorded steps; nothing after the detach.
        before = len([l for l in expected if l.startswith("before:") and " step " in l])
        attached = len([l for l in expected if l.startswith("attached:") and " step " in l])
        self.assertEqual(s["steps"], before // 2 + attached)

    def wait_line(self, job, text):
        job.wait_for(r"^%s$" % re.escape(text), "'%s'" % text)

if __name__ == "__main__":
    unittest.main()
