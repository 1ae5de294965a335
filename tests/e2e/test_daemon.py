"""tidemarkd itself: its niceness, the Unix socket, a clean stop on SIGTERM in the middle of a
run with everything it received committed and the session left resumable, while the job goes on
unharmed (its rest spooled); a session nobody resumes closed as aborted; one daemon per store, and a
daemon that cannot start touches nothing of another's."""
import os
import signal
import subprocess
import tempfile
import time
import unittest

from tidemark_env import BIN, PYTHON

LONG_JOB = r"""
import sys, time, torch
for i in range(60):
    x = torch.randn(128, 128, requires_grad=True)
    (x @ x).sum().backward()
    time.sleep(0.05)
print("done", flush=True)
sys.exit(4)
"""


class DaemonTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tidemark-daemon-")
        self.db = os.path.join(self.dir, "store.db")
        self.sock = os.path.join(self.dir, "run", "tidemarkd.sock")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--unix", self.sock,
             "--db", self.db], stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while not os.path.exists(self.sock) and time.time() < deadline:
            time.sleep(0.02)
        self.assertTrue(os.path.exists(self.sock), "no Unix socket")
        self.server = "unix:" + self.sock

    def tearDown(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tidemark(self, *args, **kw):
        return subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.server, *args],
                              capture_output=True, text=True, timeout=300, **kw)

    def test_sigterm_mid_run_commits_what_was_received_and_waits_for_the_agent(self):
        job = subprocess.Popen([os.path.join(BIN, "tidemark"), "--server", self.server, "run",
                                "--", PYTHON, "-c", LONG_JOB], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        # Wait until the session has stored events, then stop the daemon under the job.
        deadline = time.time() + 60
        stored = 0
        while time.time() < deadline and stored == 0:
            r = self.tidemark("sessions", "--json")
            if r.returncode == 0 and '"events_stored": 0' not in r.stdout and '"id"' in r.stdout:
                stored = 1
            time.sleep(0.1)
        self.assertTrue(stored, "no events reached the store")
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        self.assertEqual(self.proc.returncode, 0, err)
        self.assertIn("everything received is committed", err)

        out, jerr = job.communicate(timeout=300)
        self.assertEqual(job.returncode, 4, jerr)  # the job's own exit code
        self.assertIn("done", out)
        self.assertIn("connection to %s lost" % self.server, jerr)
        self.assertIn("complete the session with: tidemark upload", jerr)

        import sqlite3
        con = sqlite3.connect(self.db)
        state, received, stored = con.execute(
            "SELECT state, events_received, events_stored FROM session").fetchone()
        blocks = con.execute("SELECT COUNT(*) FROM allocation").fetchone()[0]
        checkpoints = con.execute("SELECT COUNT(*) FROM ingest_checkpoint").fetchone()[0]
        con.close()
        # Still live: the session waits for its agent (or the spool's upload) to resume it; what
        # was received is committed with the state to continue from.
        self.assertEqual(state, 1)
        self.assertGreater(received, 0)
        self.assertGreater(blocks, 0)
        self.assertEqual(checkpoints, 1)

        # A daemon started with no grace closes it as aborted, its open blocks stored as live.
        restarted = subprocess.Popen(
            [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix", "--db",
             self.db, "--resume-grace", "0"], stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                con = sqlite3.connect(self.db)
                state, live = con.execute(
                    "SELECT state, live_blocks_at_end FROM session").fetchone()
                lost = con.execute("SELECT COUNT(*) FROM stat WHERE name = 'stream_lost'").fetchone()[0]
                left = con.execute("SELECT COUNT(*) FROM ingest_checkpoint").fetchone()[0]
                con.close()
                if state != 1:
                    break
                time.sleep(0.1)
            self.assertEqual(state, 3)  # aborted
            self.assertEqual(lost, 1)
            self.assertEqual(left, 0)
            self.assertGreater(live, 0)
        finally:
            restarted.terminate()
            restarted.wait(timeout=30)

    def second_daemon(self, *args):
        return subprocess.run([os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", *args],
                              capture_output=True, text=True, timeout=60)

    def test_one_daemon_per_store_and_sockets_left_alone(self):
        self.assertEqual(self.tidemark("sessions").returncode, 0)
        # The same store: refused, naming the running daemon; its socket stays and serves.
        other_sock = os.path.join(self.dir, "other.sock")
        r = self.second_daemon("--db", self.db, "--unix", other_sock)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("is in use by another tidemarkd (pid %d)" % self.proc.pid, r.stderr)
        self.assertFalse(os.path.exists(other_sock))
        # Another store, the running daemon's socket: refused; the socket is not removed.
        r = self.second_daemon("--db", os.path.join(self.dir, "b.db"), "--unix", self.sock)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("another tidemarkd is listening there", r.stderr)
        self.assertTrue(os.path.exists(self.sock))
        # A regular file where the socket should go: refused, the file kept as it was.
        plain = os.path.join(self.dir, "notes.txt")
        with open(plain, "w") as f:
            f.write("mine")
        r = self.second_daemon("--db", os.path.join(self.dir, "c.db"), "--unix", plain)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("exists and is not a socket", r.stderr)
        with open(plain) as f:
            self.assertEqual(f.read(), "mine")
        # The first daemon never noticed: it still answers on its socket, its sessions intact.
        self.assertIsNone(self.proc.poll())
        self.assertEqual(self.tidemark("sessions").returncode, 0)
        # Killed (no cleanup), its lock goes with it and its socket is stale: a new daemon on the
        # same store and socket starts.
        self.proc.kill()
        self.proc.wait()
        again = subprocess.Popen([os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0",
                                  "--unix", self.sock, "--db", self.db], stderr=subprocess.PIPE,
                                 text=True)
        try:
            deadline = time.time() + 30
            while self.tidemark("sessions").returncode != 0:
                self.assertIsNone(again.poll(), again.stderr.read() if again.poll() else "")
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
        finally:
            again.kill()
            again.wait()


class NicenessTest(unittest.TestCase):
    """--nice: the daemon's own niceness. Its session's scheduling group (the kernel's autogroup)
    is left as it was, in a session of its own (setsid, as `tidemark` starts one) or in the
    caller's: a daemon whose own group was niced 10 (or 5) got too little of a saturated machine
    to take its jobs' streams (bench/run.sh section 6: 8 of 20 sessions whole, the rest spooled;
    24 of 24 with the group as it was), and the caller's group is the caller's."""

    def start(self, *args, new_session):
        d = tempfile.mkdtemp(prefix="tidemark-nice-")
        port_file = os.path.join(d, "port")
        proc = subprocess.Popen(
            [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix", "--db",
             os.path.join(d, "store.db"), "--port-file", port_file, *args],
            stderr=subprocess.DEVNULL, start_new_session=new_session)
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        deadline = time.time() + 30
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.02)
        self.assertTrue(os.path.exists(port_file), "the daemon did not start")
        return proc.pid

    @staticmethod
    def niceness(pid):
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])

    @staticmethod
    def group_niceness(pid):
        """The niceness of PID's autogroup; None where it has none (no autogroups in the kernel,
        or a process in the root group or another cgroup, whose file reads empty)."""
        try:
            with open("/proc/%s/autogroup" % pid) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text.split("nice")[1]) if "nice" in text else None

    def test_the_daemon_runs_niced_and_leaves_the_callers_group_alone(self):
        before = self.group_niceness("self")
        pid = self.start(new_session=False)
        self.assertEqual(self.niceness(pid), max(os.nice(0), 10))
        self.assertEqual(self.group_niceness("self"), before)

    def test_in_a_session_of_its_own_its_group_keeps_an_equal_share(self):
        pid = self.start(new_session=True)
        self.assertEqual(self.niceness(pid), max(os.nice(0), 10))
        group = self.group_niceness(pid)  # a new session's group of its own, where there are
        if group is not None:
            self.assertEqual(group, 0)

    def test_nice_0_keeps_the_niceness_it_was_started_with(self):
        pid = self.start("--nice", "0", new_session=True)
        self.assertEqual(self.niceness(pid), os.nice(0))


if __name__ == "__main__":
    unittest.main()
