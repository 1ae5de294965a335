"""A job run while no tidemarkd listens: it completes with its own exit code, the agent says once on
stderr what it did with the events (a spool file), and `tidemark upload` stores them later."""
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from tidemark_env import BIN, PYTHON, Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = """
import sys, torch
x = torch.randn(256, 256, requires_grad=True)
(x @ x).sum().backward()
sys.exit(7)
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class NoServerTest(unittest.TestCase):
    def test_job_completes_and_events_are_spooled_then_uploaded(self):
        spool_dir = tempfile.mkdtemp(prefix="tidemark-spool-")
        env = dict(os.environ, TIDEMARK_SPOOL_DIR=spool_dir)
        nobody = "127.0.0.1:%d" % free_port()  # nothing listens there
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", nobody, "run", "--",
                            PYTHON, "-c", SCRIPT], capture_output=True, text=True, env=env,
                           timeout=300)
        self.assertEqual(r.returncode, 7, r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.startswith("tidemark:")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("no tidemarkd answered at " + nobody, lines[0])
        spools = [os.path.join(spool_dir, f) for f in os.listdir(spool_dir)]
        self.assertEqual(len(spools), 1)
        self.assertIn(spools[0], lines[0])

        daemon = Daemon()
        try:
            # A daemon that does not answer (stopped, as a hung one is): the upload gives up
            # within its --deadline, says so, and leaves the spool for a later one.
            os.kill(daemon.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                up = daemon.cli("--deadline", "2", "upload", spools[0], check=False)
                waited = time.monotonic() - t0
            finally:
                os.kill(daemon.proc.pid, signal.SIGCONT)
            self.assertEqual(up.returncode, 3, up.stderr)
            self.assertIn("no answer from %s within 2 s" % daemon.address, up.stderr)
            self.assertLess(waited, 30)
            self.assertTrue(os.path.exists(spools[0]))
            up = daemon.cli("upload", spools[0], "--json")
            self.assertEqual(up.returncode, 0, up.stderr)
            s = daemon.newest_session()
            self.assertEqual(s["state"], "ended")
            self.assertGreater(s["events_stored"], 0)
            self.assertEqual(s["events_sent"], s["events_stored"])
            self.assertEqual(s["events_dropped"], 0)
            self.assertGreater(s["blocks"], 0)
        finally:
            daemon.cleanup()

    def test_server_started_late_gets_the_whole_session(self):
        daemon = Daemon()
        try:
            # The job starts first; its agent keeps the events and connects on a retry.
            late_script = SCRIPT.replace("sys.exit(7)", "import time; time.sleep(2.5); sys.exit(0)")
            address = daemon.address
            daemon.stop()
            port = address.rsplit(":", 1)[1]
            spool_dir = tempfile.mkdtemp(prefix="tidemark-spool-")
            job = subprocess.Popen([os.path.join(BIN, "tidemark"), "--server", address, "run", "--",
                                    PYTHON, "-c", late_script], stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, TIDEMARK_SPOOL_DIR=spool_dir))
            # Start the server a second into the run (the agent has tried and failed by then).
            time.sleep(1.0)
            self.assertIsNone(job.poll(), "the job ended before the daemon started")
            restarted = subprocess.Popen(
                [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:" + port, "--no-unix",
                 "--db", daemon.db], stderr=subprocess.DEVNULL)
            try:
                _, err = job.communicate(timeout=300)
                self.assertEqual(job.returncode, 0, err)
                self.assertIn("tidemark: session", err)
                s = daemon.newest_session()
                self.assertEqual(s["events_sent"], s["events_stored"])
                self.assertGreater(s["blocks"], 0)
                self.assertEqual(os.listdir(spool_dir), [], "nothing is left in the spool directory")
            finally:
                restarted.terminate()
                restarted.wait(timeout=30)
        finally:
            daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
