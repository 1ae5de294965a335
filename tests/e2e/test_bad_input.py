"""The CLI's answers to bad input: clear messages and meaningful exit codes (0 ok, 1 the server
said no, 2 bad usage, 3 no server). gRPC-level bad input is in tests/server/ingest_rpc_test.cpp."""
import json
import os
import signal
import socket
import subprocess
import unittest

from tidemark_env import BIN, Daemon, DaemonTestCase


class CliBadInputTest(DaemonTestCase):
    def test_unknown_session(self):
        for args in (["breakdown", "999"], ["peak", "999"], ["timeline", "999"], ["steps", "999"],
                     ["ops", "999"], ["diff", "999", "998"], ["export", "999"]):
            with self.subTest(args=args):
                r = self.daemon.cli(*args, check=False)
                self.assertEqual(r.returncode, 1)
                self.assertIn("no session 999", r.stderr)

    def test_bad_usage(self):
        for args in (["breakdown"], ["breakdown", "abc"], ["breakdown", "1", "--at", "soon"],
                     ["breakdown", "1", "--step"], ["frobnicate"], ["run"], ["sessions", "x"],
                     ["peak"], ["peak", "1", "--top", "x"], ["peak", "1", "--top", "0"],
                     ["peak", "1", "--top", "1001"], ["timeline", "1", "--buckets", "0"],
                     ["timeline", "1", "--from", "1s"], ["steps"], ["ops", "x"], ["diff", "1"],
                     ["export"], ["run", "--bogus", "--", "true"]):
            with self.subTest(args=args):
                r = self.daemon.cli(*args, check=False)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertTrue(r.stderr.strip())

    def test_arguments_the_server_refuses_are_bad_usage(self):
        # A real (synthetic) session, so that what is refused is the argument, not the session
        # (a daemon of its own: the others expect an empty one).
        daemon = Daemon()
        self.addCleanup(daemon.cleanup)
        r = subprocess.run([os.path.join(BIN, "bench_scale"), "--server", daemon.address,
                            "--events", "2000", "--no-raw"], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        sid = daemon.newest_session()["id"]
        for args, says in ((["plan", str(sid), "--budget", "lots"], "budget"),
                           (["plan", str(sid), "--budget", "1GiB", "--strategy", "magic"],
                            "strategy"),
                           (["export", str(sid), "--format", "xml"], "unknown export format")):
            with self.subTest(args=args):
                r = daemon.cli(*args, check=False)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(says, r.stderr)
        # A moment past the recording: said in seconds from the session's start, as given.
        r = daemon.cli("breakdown", str(sid), "--at", "99999s", check=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertRegex(r.stderr, r"\+99999\.000 s is outside the recording \(\+[0-9.]+ s to "
                                   r"\+[0-9.]+ s from the session's start\)")
        r = daemon.cli("plan", "999", "--budget", "1GiB", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no session 999", r.stderr)

    def test_no_server(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", "127.0.0.1:%d" % port,
                            "sessions"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 3)
        self.assertIn("no tidemarkd reachable", r.stderr)

    def test_a_daemon_that_does_not_answer(self):
        # Stopped (as a hung daemon is): listening, never answering. Told apart from no daemon,
        # within the deadline asked for, and still exit 3.
        daemon = Daemon()
        self.addCleanup(daemon.cleanup)
        self.addCleanup(os.kill, daemon.proc.pid, signal.SIGCONT)
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        # A trace to import (an allocation and its free), streamed to the daemon: no limit of
        # its own, --deadline's when given.
        trace = os.path.join(daemon.dir, "trace.json")
        with open(trace, "w") as f:
            json.dump({"traceEvents": [
                {"name": "[memory]", "ph": "i", "ts": 1 + i, "pid": 1, "tid": 1, "args": {
                    "Device Type": 0, "Device Id": -1, "Addr": 4096, "Bytes": 1024 - 2048 * i,
                    "Total Allocated": 1024 - 1024 * i, "Total Reserved": 4096}}
                for i in (0, 1)]}, f)
        for args in (["--deadline", "2", "sessions"], ["--deadline=2", "steps", "1"],
                     ["--deadline", "2", "import", trace]):
            with self.subTest(args=args):
                r = daemon.cli(*args, check=False)
                self.assertEqual(r.returncode, 3, r.stderr)
                self.assertIn("no answer from %s within 2 s" % daemon.address, r.stderr)
                self.assertNotIn("no tidemarkd reachable", r.stderr)
        os.kill(daemon.proc.pid, signal.SIGCONT)
        self.assertEqual(daemon.cli("--deadline", "30", "sessions", "--json",
                                    check=False).returncode, 0)
        self.assertIn("imported kineto-trace as session",
                      daemon.cli("--deadline", "30", "import", trace).stdout)
        for bad in ("0", "x", "86401", ""):
            r = daemon.cli("--deadline", bad, "sessions", check=False)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("--deadline takes 1 to 86400 seconds", r.stderr)

    def test_help(self):
        for args in (["--help"], ["run", "--help"], ["breakdown", "--help"]):
            with self.subTest(args=args):
                r = self.daemon.cli(*args)
                self.assertIn("usage:", r.stdout)

    def test_upload_of_a_file_that_is_not_a_spool(self):
        path = os.path.join(self.daemon.dir, "junk.bin")
        with open(path, "wb") as f:
            f.write(b"\xff\xff\xff\x7fnot a spool")
        r = self.daemon.cli("upload", path, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a tidemark spool", r.stderr)
        self.assertEqual(self.daemon.cli_json("sessions")["sessions"], [])

    def test_daemon_refuses_a_store_that_is_not_sqlite(self):
        path = os.path.join(self.daemon.dir, "not-a-db")
        with open(path, "w") as f:
            f.write("hello, I am not a database" * 100)
        r = subprocess.run([os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix",
                            "--db", path], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn(path, r.stderr)


if __name__ == "__main__":
    unittest.main()
