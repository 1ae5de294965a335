"""tidemarkd dies, hangs, is stopped or cannot write its store in the middle of a checkpointed
training and comes back on the same store: the job trains on unharmed, its agent keeps what was not acknowledged and resumes
the session, and the store ends up with the very recording an uninterrupted run gives — one
session, every event sent stored, nothing dropped, every step, the breakdown at the peak exact.

The moments are drawn at random (the seed is printed) over the whole run, so over runs they fall
mid-step, mid-forward, mid-backward and between batches."""
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import shutil
import time
import unittest

from tidemark_env import (BIN, PYTHON, SOURCE, STORE_BACKEND, CuttableProxy,
                          fresh_postgres_database, plan_doc, store_sql)

TRAIN = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[1])
from tiny_gpt import TinyGPT, make_batch
torch.manual_seed(0)
model = TinyGPT(vocab=128, d_model=64, n_heads=4, n_layers=4, seq_len=64, checkpointed=(1, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1)
for step in range(int(sys.argv[2])):
    x, y = make_batch(gen, 8, 64, 128)
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    time.sleep(0.04)
print("loss %.6f" % loss.item(), flush=True)
"""
STEPS = 40
EXACT = ("WEIGHT", "GRADIENT", "OPTIMIZER_STATE")


class Tidemarkd:
    """A daemon on one store that can be killed, stopped and started again on the same port."""

    def __init__(self, directory, env=None):
        self.dir = directory
        self.env = env
        # The store: a file of the test's own, or (TIDEMARK_TEST_STORE=postgresql) a fresh
        # database on the tests' PostgreSQL server, the same one at every start.
        self.db = (fresh_postgres_database() if STORE_BACKEND == "postgresql"
                   else os.path.join(directory, "store.db"))
        self.port = 0
        self.proc = None
        self.logs = 0

    def start(self):
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.logs += 1
        log = open(os.path.join(self.dir, "tidemarkd-%d.log" % self.logs), "w")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:%d" % self.port, "--no-unix",
             "--store", self.db, "--port-file", port_file], stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, **(self.env or {})))
        log.close()
        deadline = time.time() + 30
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError("tidemarkd did not start")
            time.sleep(0.02)
        with open(port_file) as f:
            self.port = int(f.read().strip())

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)

    def cli_json(self, *args):
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.address, *args,
                            "--json"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError("tidemark %s: %s" % (" ".join(args), r.stderr))
        return json.loads(r.stdout)

    def session_of(self, pid, job_err=""):
        found = [s for s in self.cli_json("sessions")["sessions"] if s["pid"] == pid]
        if len(found) != 1:
            raise AssertionError("%d sessions for pid %d; the job said:\n%s\nthe daemon's log:\n%s"
                                 % (len(found), pid, job_err, self.log_tail()))
        return found[0]

    def log_tail(self):
        """The last lines of each of this daemon's logs (one per start), for a failure's message."""
        out = []
        for n in range(1, self.logs + 1):
            path = os.path.join(self.dir, "tidemarkd-%d.log" % n)
            try:
                with open(path, errors="replace") as f:
                    out.append("-- start %d:\n%s" % (n, "".join(f.readlines()[-20:])))
            except OSError as e:
                out.append("-- start %d: %s" % (n, e))
        return "\n".join(out)

    def analyzed(self, pid, timeout=120, job_err=""):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.session_of(pid, job_err)
            if s["analyzed"]:
                return s
            time.sleep(0.1)
        raise AssertionError("the session of pid %d was not analyzed" % pid)


def await_taken_up(test, daemon, spool, err):
    """The job's spool is there; the hung daemon, continued, takes it up and removes it."""
    test.assertTrue(os.path.exists(spool), err)
    daemon.proc.send_signal(signal.SIGCONT)
    deadline = time.time() + 120
    while os.path.exists(spool) and time.time() < deadline:
        time.sleep(0.1)
    test.assertFalse(os.path.exists(spool), daemon.log_tail())


class DaemonRestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.seed = int(os.environ.get("TIDEMARK_TEST_SEED", time.time()))
        print("\nmoments drawn with TIDEMARK_TEST_SEED=%d" % cls.seed)
        cls.rng = random.Random(cls.seed)
        # The reference: the same training, nothing interrupted.
        cls.dir = tempfile.mkdtemp(prefix="tidemark-restart-")
        daemon = Tidemarkd(cls.dir)
        daemon.start()
        try:
            job = cls.start_job(daemon)
            out, err = job.communicate(timeout=300)
            assert job.returncode == 0, err
            cls.loss = out
            session = daemon.analyzed(job.pid)
            cls.reference = cls.peak(daemon, session["id"])
            cls.reference_steps = session["steps"]
        finally:
            daemon.stop()
        assert cls.reference_steps == STEPS, cls.reference_steps

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @staticmethod
    def start_job(daemon, env=None, run_args=()):
        return subprocess.Popen(
            [os.path.join(BIN, "tidemark"), "--server", daemon.address, "run", *run_args, "--",
             PYTHON, "-c", TRAIN, os.path.join(SOURCE, "examples"), str(STEPS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, **(env or {})))

    @staticmethod
    def peak(daemon, sid):
        b = daemon.cli_json("breakdown", str(sid))
        return {k: v["bytes"] for k, v in b["categories"].items()}

    def interrupted_run(self, interrupt, env=None, expect_stat=None, after_job=None,
                        latest=STEPS - 12, run_args=(), daemon_env=None):
        """Runs the training (under `tidemark run RUN_ARGS`) while `interrupt(daemon)` does its
        worst at a random moment, then checks the session against the reference."""
        directory = tempfile.mkdtemp(prefix="tidemark-restart-", dir=self.dir)
        daemon = Tidemarkd(directory, daemon_env)
        daemon.start()
        try:
            job = self.start_job(daemon, env, run_args)
            # A moment drawn over the run: after a random step has been stored, and a random part
            # of a step later (mid-forward, mid-backward, mid-optimizer or between steps).
            after = self.rng.randrange(2, latest)
            deadline = time.time() + 120
            while time.time() < deadline:
                sessions = daemon.cli_json("sessions")["sessions"]
                if sessions and sessions[0]["steps"] >= after:
                    break
                time.sleep(0.02)
            delay = self.rng.uniform(0, 0.08)
            time.sleep(delay)
            self.assertIsNone(job.poll(), "the job ended before the interruption")
            interrupt(daemon)
            out, err = job.communicate(timeout=300)
            self.assertEqual(job.returncode, 0, err)
            self.assertEqual(out, self.loss, "the job's losses changed")
            if after_job:
                err = after_job(daemon, err)
            session = daemon.analyzed(job.pid, job_err=err)
            with self.subTest(after_step=after, delay=delay):
                self.assertEqual(session["state"], "ended", err)
                self.assertEqual(session["events_dropped"], 0, err)
                self.assertEqual(session["events_sent"], session["events_received"], err)
                if not run_args:  # a capture schedule stores less than it sends (its ranges)
                    self.assertEqual(session["events_sent"], session["events_stored"], err)
                self.assertEqual(session["steps"], STEPS)
                lost = [name for name, st in session["stats"].items()
                        if st["severity"] == "data_loss"]
                self.assertEqual(lost, [], err)
                peak = self.peak(daemon, session["id"])
                for category in EXACT:
                    self.assertEqual(peak.get(category), self.reference.get(category), category)
                self.assertIn("session %d" % session["id"], err)
                if expect_stat:
                    self.assertIn(expect_stat, session["stats"])
                if run_args:
                    self.assertGreater(session["stats"]["events_summarized"]["value"], 0)
                    steps = daemon.cli_json("steps", str(session["id"]))["steps"]
                    self.assertEqual(len(steps), STEPS)
                    self.assertEqual(sum(1 for st in steps if st["summarized"]), STEPS * 3 // 5)
                    for st in steps:
                        self.assertGreater(st["peak"]["tracked_bytes"], 0, st["step"])
            return err
        finally:
            daemon.stop(signal.SIGKILL)

    def test_sigkill_and_restart_at_random_moments(self):
        def kill_and_restart(daemon):
            daemon.stop(signal.SIGKILL)
            time.sleep(self.rng.uniform(0.2, 1.5))
            daemon.start()
        for _ in range(3):
            err = self.interrupted_run(kill_and_restart)
            self.assertIn("resumed", err)

    def test_sigkill_and_restart_under_a_capture_schedule(self):
        # Summaries, ranges said summarized and blocks sent again when detail begins go through
        # a daemon killed and restarted like any event: nothing lost, every step there, the
        # summarized ones as summaries.
        def kill_and_restart(daemon):
            daemon.stop(signal.SIGKILL)
            time.sleep(self.rng.uniform(0.2, 1.5))
            daemon.start()
        err = self.interrupted_run(kill_and_restart, run_args=("--every", "5", "--window", "2"))
        self.assertIn("resumed", err)

    def test_sigstop_hung_daemon_then_sigcont(self):
        def hang(daemon):
            daemon.proc.send_signal(signal.SIGSTOP)
            time.sleep(2.5)
            daemon.proc.send_signal(signal.SIGCONT)
        # Acknowledgements stop for longer than the agent's bound: it says so and reconnects
        # (early enough in the run that the job still records when the bound passes).
        err = self.interrupted_run(hang, env={"TIDEMARK_ACK_TIMEOUT_MS": "500"},
                                   latest=STEPS - 20)
        self.assertIn("no acknowledgement", err)

    def test_sigterm_and_restart(self):
        def restart(daemon):
            daemon.stop(signal.SIGTERM)
            daemon.start()
        self.interrupted_run(restart)

    def test_daemon_down_longer_than_the_agent_memory_buffer(self):
        def outage(daemon):
            daemon.stop(signal.SIGKILL)
            time.sleep(2.0)
            daemon.start()
        # A 4 KiB buffer and a 64 KiB window (about 2,500 events): the outage's records go
        # through the buffer's file (the small window slows the catching up: the exit may take
        # longer).
        self.interrupted_run(outage, env={"TIDEMARK_BUFFER_MAX_BYTES": "4096",
                                          "TIDEMARK_WINDOW_MAX_BYTES": str(64 << 10),
                                          "TIDEMARK_EXIT_TIMEOUT_MS": "30000"},
                             expect_stat="agent_buffered_to_disk")

    def test_daemon_down_at_the_end_then_the_spool_is_uploaded(self):
        spool_dir = tempfile.mkdtemp(prefix="spool-", dir=self.dir)

        def upload(daemon, err):
            self.assertIn("complete the session with: tidemark upload", err)
            spool = err.split("tidemark upload ")[-1].strip()
            self.assertTrue(spool.startswith(spool_dir), err)
            self.assertEqual(os.stat(spool).st_mode & 0o777, 0o600)
            daemon.start()
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", daemon.address,
                                "upload", spool], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            return err + r.stdout
        # Killed at a random moment and started again only after the job ended: the agent
        # writes the rest to its spool, the upload completes the same session.
        self.interrupted_run(lambda daemon: daemon.stop(signal.SIGKILL),
                             env={"TIDEMARK_SPOOL_DIR": spool_dir}, after_job=upload)

    def test_a_hung_daemon_at_the_exit_gets_nothing_handed_and_the_spool_has_it_all(self):
        spool_dir = tempfile.mkdtemp(prefix="spool-", dir=self.dir)

        def upload(daemon, err):
            # The exit wrote the rest (the buffer's records raw) for a handoff that no one
            # answered, took it back, and spooled everything instead: nothing handed over.
            self.assertNotIn("handed to the daemon", err)
            self.assertEqual([f for f in os.listdir(spool_dir) if "handoff" in f], [])
            self.assertIn("complete the session with: tidemark upload", err)
            spool = err.split("tidemark upload ")[-1].strip()
            daemon.proc.send_signal(signal.SIGCONT)
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", daemon.address,
                                "upload", spool], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            return err + r.stdout
        # Hung at a random moment and never answering again while the job runs: every exit
        # offers a handoff (a minimum of one event), which goes unanswered.
        self.interrupted_run(lambda daemon: daemon.proc.send_signal(signal.SIGSTOP),
                             env={"TIDEMARK_SPOOL_DIR": spool_dir,
                                  "TIDEMARK_HANDOFF_DIR": spool_dir,
                                  "TIDEMARK_HANDOFF_MIN_EVENTS": "1",
                                  "TIDEMARK_ACK_TIMEOUT_MS": "500"},
                             after_job=upload)

    def test_a_hung_daemon_at_the_exit_completes_the_session_from_the_spool_itself(self):
        # The job and its daemon share the user's default spool directory (as a user's own daemon
        # does): once the daemon runs again and the job's process has gone, it finds the spool
        # and completes the session from it — no `tidemark upload` needed, and the file goes.
        state = tempfile.mkdtemp(prefix="state-", dir=self.dir)
        spool_dir = os.path.join(state, "tidemark", "spool")

        def resume(daemon, err):
            self.assertIn("tidemarkd takes it up once this process has exited", err)
            spool = err.split("tidemark upload ")[-1].strip()
            self.assertTrue(spool.startswith(spool_dir), err)
            await_taken_up(self, daemon, spool, err)
            self.assertIn("taking up the rest of its run", daemon.log_tail())
            return err
        self.interrupted_run(lambda daemon: daemon.proc.send_signal(signal.SIGSTOP),
                             env={"XDG_STATE_HOME": state, "TIDEMARK_ACK_TIMEOUT_MS": "500"},
                             daemon_env={"XDG_STATE_HOME": state}, after_job=resume)

    def test_a_plan_the_job_applies_while_no_daemon_runs_is_spooled_with_the_run(self):
        """The script applies a plan itself (tidemark.apply_plan) after the daemon was killed,
        and the job ends before a daemon is back: the plan's result goes to the spool with the
        recording, and once the spool is uploaded plan-check shows the plan applied from its
        step and measured (it was lost: a result lived only in the agent's memory)."""
        directory = tempfile.mkdtemp(prefix="tidemark-restart-", dir=self.dir)
        spool_dir = os.path.join(directory, "spool")
        os.mkdir(spool_dir, 0o700)
        code = r"""
import os, sys, time, torch, tidemark
sys.path.insert(0, sys.argv[1])
from tiny_gpt import TinyGPT, make_batch
torch.manual_seed(0)
model = TinyGPT(vocab=128, d_model=64, n_heads=4, n_layers=4, seq_len=64)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1)
for step in range(1, 9):
    if step == 5:
        open(os.path.join(sys.argv[2], "ready"), "w").close()
        while not os.path.exists(os.path.join(sys.argv[2], "go")):
            time.sleep(0.01)
        tidemark.apply_plan(model, sys.argv[3])
    x, y = make_batch(gen, 8, 64, 128)
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print("step %d loss %.6f" % (step, loss.item()), flush=True)
"""
        daemon = Tidemarkd(directory)
        daemon.start()
        try:
            job = subprocess.Popen(
                [os.path.join(BIN, "tidemark"), "--server", daemon.address, "run", "--", PYTHON,
                 "-c", code, os.path.join(SOURCE, "examples"), directory, json.dumps(plan_doc([
                     {"mode": "recompute", "modules": ["TinyGPT.blocks.1", "TinyGPT.blocks.2"]}]))],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=dict(os.environ, TIDEMARK_SPOOL_DIR=spool_dir))
            deadline = time.time() + 120
            while not os.path.exists(os.path.join(directory, "ready")):
                self.assertIsNone(job.poll(), "the job ended before step 5")
                self.assertLess(time.time(), deadline, "the job did not reach step 5")
                time.sleep(0.02)
            daemon.stop(signal.SIGKILL)
            open(os.path.join(directory, "go"), "w").close()
            out, err = job.communicate(timeout=300)
            self.assertEqual(job.returncode, 0, err)
            self.assertEqual(len(re.findall(r"^step \d+ loss", out, re.M)), 8, out)
            self.assertIn("complete the session with: tidemark upload", err)
            spool = err.split("tidemark upload ")[-1].strip()
            daemon.start()
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", daemon.address,
                                "upload", spool], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            session = daemon.analyzed(job.pid, job_err=err)
            self.assertEqual(session["state"], "ended", err)
            self.assertEqual(session["steps"], 8)
            check = daemon.cli_json("plan-check", str(session["id"]))["plans"]
            self.assertEqual([(p["state"], p["from_step"]) for p in check], [("applied", 5)],
                             err + daemon.log_tail())
            self.assertEqual(check[0]["steps_measured"], 4)
            self.assertGreater(check[0]["measured_peak_bytes"], 0)
        finally:
            daemon.stop(signal.SIGKILL)

    def test_store_that_cannot_be_written_for_a_while(self):
        import resource
        if STORE_BACKEND == "postgresql":
            # The daemon writes no file of a PostgreSQL store: the server stopped for a while is
            # test_postgres_store's case.
            self.skipTest("an SQLite store's case (PostgreSQL's: test_postgres_store)")

        def fill(daemon):
            # No write past the first 4 KiB of any file (a full disk for SQLite: its writes
            # fail; a limit at the files' sizes was not enough, as SQLite writes its journal from
            # the start again after a checkpoint); the daemon stays up, answers UNAVAILABLE, the
            # agent keeps its events and retries.
            hard = resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE)[1]
            resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (4096, hard))
            time.sleep(1.5)
            self.assertIsNone(daemon.proc.poll(), "the daemon died of a full store")
            resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
        err = self.interrupted_run(fill)
        self.assertIn("the store cannot be written", err)

    def test_a_daemon_back_on_another_store_gets_the_rest_as_a_new_session(self):
        # The session cannot be resumed there (unknown): the agent says so and records the rest
        # of the run as a new session, whole in itself, every name it uses defined in it.
        directory = tempfile.mkdtemp(prefix="tidemark-restart-", dir=self.dir)
        daemon = Tidemarkd(directory)
        daemon.start()
        try:
            job = self.start_job(daemon)
            deadline = time.time() + 120
            while time.time() < deadline:
                sessions = daemon.cli_json("sessions")["sessions"]
                if sessions and sessions[0]["steps"] >= 5:
                    break
                time.sleep(0.02)
            daemon.stop(signal.SIGKILL)
            daemon.db = (fresh_postgres_database() if STORE_BACKEND == "postgresql"
                         else os.path.join(directory, "other.db"))
            daemon.start()
            out, err = job.communicate(timeout=300)
            self.assertEqual(job.returncode, 0, err)
            self.assertEqual(out, self.loss)
            self.assertIn("could not be resumed", err)
            session = daemon.analyzed(job.pid)
            self.assertEqual(session["state"], "ended", err)
            self.assertEqual(session["events_dropped"], 0)
            # Frees and ends of what the first session opened do not pair here (counted).
            self.assertGreater(session["events_received"], 0)
            self.assertGreater(session["steps"], 0)
            self.assertNotIn("seq_gap", session["stats"])
            unnamed = store_sql(
                daemon.db,
                "SELECT (SELECT COUNT(*) FROM scope WHERE name_id NOT IN "
                "(SELECT iid FROM string)) + (SELECT COUNT(*) FROM tag WHERE name_id != 0 "
                "AND name_id NOT IN (SELECT iid FROM string))")[0][0]
            scopes = store_sql(daemon.db, "SELECT COUNT(*) FROM scope")[0][0]
            self.assertGreater(scopes, 0)
            self.assertEqual(unnamed, 0, "names used but not defined in the new session")
        finally:
            daemon.stop(signal.SIGKILL)


# A job whose blocks (aligned, as torch's allocator makes them) stay live; it exits once told.
HOLDING_JOB = r"""
import ctypes, sys
libc = ctypes.CDLL(None)
blocks = [ctypes.c_void_p() for _ in range(200)]
for b in blocks:
    assert libc.posix_memalign(ctypes.byref(b), 64, 4096) == 0
print("ready", flush=True)
sys.stdin.readline()
"""


class LostConfirmationTest(unittest.TestCase):
    def test_a_run_stored_whole_whose_confirmation_was_lost_is_delivered_not_spooled(self):
        """The daemon stores a job's whole run at its exit — the goodbye too — and its answer is
        lost on the way (the network holds it, then the connection breaks). The agent, still
        within its exit's time, reconnects and asks to continue the session; the daemon answers
        that the session ended whole (ALREADY_EXISTS), and the agent counts the run delivered:
        it says so, spools nothing and makes no second session (before the daemon said so, such
        an exit spooled its whole rest, and `tidemark upload` of that spool made the run a
        second session)."""
        directory = tempfile.mkdtemp(prefix="tidemark-lost-answer-")
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        daemon = Tidemarkd(directory)
        daemon.start()
        self.addCleanup(daemon.stop, signal.SIGKILL)
        proxy = CuttableProxy(daemon.port)
        self.addCleanup(proxy.close)
        state = os.path.join(directory, "job-state")  # the job's spool directory: not the daemon's
        job = subprocess.Popen(
            [os.path.join(BIN, "tidemark"), "--server", proxy.address, "run", "--no-adapter",
             "--", "/usr/bin/python3", "-c", HOLDING_JOB], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, XDG_STATE_HOME=state, TIDEMARK_EXIT_TIMEOUT_MS="60000"))
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.assertEqual(job.stdout.readline().strip(), "ready")
        deadline = time.time() + 60
        while True:  # the blocks received: the stream has nothing else to carry
            found = [s for s in daemon.cli_json("sessions")["sessions"] if s["pid"] == job.pid]
            if found and found[0]["events_received"] >= 200:
                break
            self.assertLess(time.time(), deadline, found)
            time.sleep(0.05)
        sid = found[0]["id"]
        time.sleep(0.5)  # and acknowledged
        proxy.hold_replies()
        job.stdin.write("\n")
        job.stdin.flush()
        while daemon.session_of(job.pid)["state"] == "live":  # the goodbye stored, unanswered
            self.assertLess(time.time(), deadline, daemon.log_tail())
            time.sleep(0.05)
        accepted = proxy.accepted
        proxy.cut()
        _, err = job.communicate(timeout=120)
        self.assertEqual(job.returncode, 0, err)
        self.assertGreater(proxy.accepted, accepted, "the agent did not connect again: " + err)
        self.assertIn("session %d: 200 events sent to %s, 0 dropped (the daemon's answer to the "
                      "run's end was lost; asked again, it said the session had ended whole)"
                      % (sid, proxy.address), err)
        self.assertNotIn("spool", err)
        spools = os.path.join(state, "tidemark", "spool")
        self.assertEqual(os.listdir(spools) if os.path.isdir(spools) else [], [], err)
        sessions = [s for s in daemon.cli_json("sessions")["sessions"] if s["pid"] == job.pid]
        self.assertEqual(len(sessions), 1, sessions)
        session = sessions[0]
        self.assertEqual(session["state"], "ended", session)
        self.assertEqual(session["events_dropped"], 0, session)
        self.assertEqual(session["events_stored"], session["events_sent"], session)
        self.assertGreaterEqual(session["blocks"], 200, session)


class NeverAnsweredJobTest(unittest.TestCase):
    def test_a_job_whose_handshake_never_reached_the_hung_daemon_becomes_a_session_by_itself(self):
        """A daemon hung (SIGSTOP) from before a job starts until after it exits, as one loaded
        by many jobs at once can be: the job's first handshake is never answered, the job trains
        on, and its exit spools the whole run (no session to continue) into the user's spool
        directory, which it shares with its daemon. Once the daemon runs again it finds that
        spool — aimed at it, from a job that started after it and has exited — and makes the
        job's session from it: whole, without `tidemark upload`, and the file goes."""
        directory = tempfile.mkdtemp(prefix="tidemark-unanswered-")
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        state = os.path.join(directory, "state")
        daemon = Tidemarkd(directory, env={"XDG_STATE_HOME": state})
        daemon.start()
        self.addCleanup(daemon.stop, signal.SIGKILL)
        daemon.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: daemon.proc.poll() is None and
                        daemon.proc.send_signal(signal.SIGCONT))
        job = subprocess.Popen(
            [os.path.join(BIN, "tidemark"), "--server", daemon.address, "run", "--",
             os.path.join(BIN, "tidemark_alloc_program")], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, XDG_STATE_HOME=state, TIDEMARK_ACK_TIMEOUT_MS="500"))
        _, err = job.communicate(timeout=300)
        self.assertEqual(job.returncode, 0, err)
        self.assertIn("no tidemarkd answered at " + daemon.address, err)
        self.assertIn("a tidemarkd of this user listening there since before this job began "
                      "takes it up once this process has exited", err)
        spool = err.strip().split("tidemark upload ")[-1].strip()
        self.assertTrue(spool.startswith(os.path.join(state, "tidemark", "spool")), err)
        await_taken_up(self, daemon, spool, err)
        session = daemon.analyzed(job.pid, job_err=err)
        self.assertEqual(session["state"], "ended", session)
        self.assertEqual(session["events_dropped"], 0, session)
        self.assertGreater(session["events_sent"], 0, session)
        self.assertEqual(session["events_stored"], session["events_sent"], session)
        # Which of the daemon's two ways took it: the handshake it found waiting on the
        # connection when it ran again (a session made for the job, whose spool completes it),
        # or none at all (the spool makes the session). Either leaves one whole session.
        log = daemon.log_tail()
        self.assertTrue("that exited before its first handshake reached this daemon" in log or
                        "taking up the rest of its run" in log, log)
        print("\n" + [line for line in log.splitlines() if "taking up" in line][0])

if __name__ == "__main__":
    unittest.main()
