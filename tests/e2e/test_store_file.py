"""`tidemark --db FILE` and `tidemark-gui --db FILE`: a store file a tidemarkd wrote, read with no
daemon running, answers every reading command as the daemon did; what needs a daemon is refused
(exit 2), a missing file or one that is no store says so (exit 3), and another user who may not
read the file reads nothing."""
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import unittest

from tidemark_env import BIN, SOURCE, Daemon
from test_gui import CATEGORY_RGB, png_pixels, screenshot

TRACE = os.path.join(SOURCE, "tests", "fuzz", "corpus", "kineto", "training_step.json")


def tidemark(*args, user=None):
    cmd = [os.path.join(BIN, "tidemark"), *args]
    if user is not None:
        cmd = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class StoreFileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A store written by a daemon, which then stops: what it answered is what the file holds.
        daemon = Daemon()
        cls.dir = tempfile.mkdtemp(prefix="tidemark-storefile-")
        info = json.loads(daemon.cli("import", TRACE, "--name", "a step", "--json").stdout)
        cls.sid = str(info["session"])
        daemon.wait_analyzed(info["session"])
        cls.answers = {what: daemon.cli_json(*args) for what, args in (
            ("sessions", ("sessions",)), ("breakdown", ("breakdown", cls.sid)),
            ("steps", ("steps", cls.sid)), ("peak", ("peak", cls.sid)),
            ("ops", ("ops", cls.sid)), ("block", ("block", cls.sid, "102")))}
        daemon.stop()
        cls.db = os.path.join(cls.dir, "store.db")
        shutil.copy(daemon.db, cls.db)  # the daemon's WAL is checkpointed into it at its stop
        os.chmod(cls.db, 0o600)
        shutil.rmtree(daemon.dir, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_reads_answer_as_the_daemon_did(self):
        for what, args in (("sessions", ("sessions",)), ("breakdown", ("breakdown", self.sid)),
                           ("steps", ("steps", self.sid)), ("peak", ("peak", self.sid)),
                           ("ops", ("ops", self.sid)), ("block", ("block", self.sid, "102"))):
            with self.subTest(command=what):
                r = tidemark("--db", self.db, *args, "--json")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(json.loads(r.stdout), self.answers[what])
        # Plain text too, and the file is left as it was.
        before = os.path.getmtime(self.db), os.path.getsize(self.db)
        r = tidemark("--db", self.db, "breakdown", self.sid)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("GRADIENT", r.stdout)
        self.assertEqual((os.path.getmtime(self.db), os.path.getsize(self.db)), before)

    def test_what_needs_a_daemon_is_refused(self):
        for args in (("delete", self.sid), ("import", TRACE), ("apply", self.sid, "plan.json"),
                     ("run", "--", "true"), ("token", "list")):
            with self.subTest(command=args[0]):
                r = tidemark("--db", self.db, *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("needs a running tidemarkd", r.stderr)

    def test_files_that_are_no_store(self):
        r = tidemark("--db", os.path.join(self.dir, "missing.db"), "sessions")
        self.assertEqual(r.returncode, 3)
        self.assertIn("no such store file", r.stderr)
        r = tidemark("--db", TRACE, "sessions")  # not SQLite at all
        self.assertEqual(r.returncode, 3)
        self.assertIn("not a tidemark store", r.stderr)
        empty = os.path.join(self.dir, "empty.db")  # SQLite, but no store
        with sqlite3.connect(empty) as db:
            db.execute("CREATE TABLE t (x)")
        r = tidemark("--db", empty, "sessions")
        self.assertEqual(r.returncode, 3)
        self.assertIn("not a tidemark store", r.stderr)
        # A PostgreSQL store is its daemons' to show (they decide who sees what).
        r = tidemark("--db", "postgresql://tidemark@db.example/tidemark", "sessions")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("a PostgreSQL store is read through any daemon", r.stderr)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to act as a second user")
    def test_another_user_reads_nothing(self):
        os.chmod(self.dir, 0o755)  # the directory open, the owner-only file not
        r = tidemark("--db", self.db, "sessions", "--json", user=65534)
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("not readable", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_gui_opens_the_file(self):
        out = os.path.join(self.dir, "gui.png")
        r = screenshot(["--db", self.db, "--open", self.sid], out)
        self.assertEqual(r.returncode, 0, r.stderr)
        _, _, pixels = png_pixels(out)
        present = {c for c, rgb in CATEGORY_RGB.items() if bytes(rgb) in {p[:3] for p in pixels}}
        # The step's gradient and optimizer state, and what came before the trace, drawn.
        self.assertTrue({"GRADIENT", "OPTIMIZER_STATE", "UNKNOWN"} <= present, present)


if __name__ == "__main__":
    unittest.main()
