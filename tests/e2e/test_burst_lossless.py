"""Lossless capture through bursts: a native program (8 threads, bursts of up to 40k aligned
allocations and frees each, faster than any drain) under `tidemark run` with no environment
variable: every event sent is stored, none dropped, the peak equals the program's own count and
no block is left live that the program freed. The end of the run, far more than the daemon takes
at once, is handed to it in a file at exit (the job does not wait for the daemon's pace); the
daemon stores it and removes the file, also when it is killed meanwhile and restarted. The file
goes to a memory file system (/dev/shm) first, to the spool directory when it has no room there,
when the daemon cannot open it there, or when TIDEMARK_HANDOFF_DIR is set empty;
a file size limit on the job caps the agent's files and never ends the job. The same
under --lossy drops, and says how many."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import unittest.mock

from tidemark_env import BIN, DaemonTestCase

PROGRAM = os.path.join(BIN, "tidemark_burst_program")


def memory_file_system(path):
    """Whether `path` is a mount point of a tmpfs (/proc/mounts)."""
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path and line.split()[2] == "tmpfs" for line in f)


class BurstLosslessTest(DaemonTestCase):
    def run_burst(self, *run_args):
        r = self.daemon.cli("run", *run_args, "--", PROGRAM, "40000")
        self.assertEqual(r.returncode, 0, r.stderr)
        truth = json.loads(r.stdout)
        return truth, self.daemon.newest_session(), r.stderr

    def handed_off(self, err):
        """The file the agent says it handed to the daemon, and how many events it holds."""
        m = re.search(r"the last (\d+) handed to the daemon in (\S+),", err)
        self.assertIsNotNone(m, err)
        return int(m.group(1)), m.group(2)

    def complete_spool(self, err):
        """A job that spooled the rest of its run: its daemon (of this user, the spool in the
        user's spool directory) takes it up itself once the job has exited, which the job's line
        says; else the upload here completes the session (or makes it one)."""
        m = re.search(r"tidemark upload (\S+)$", err.strip())
        if m and "tidemarkd takes it up once this process has exited" not in err:
            self.daemon.cli("upload", m.group(1))

    def assert_removed(self, path):
        """The daemon removes a handed-over file right after the session it completes ends."""
        deadline = time.time() + 30
        while os.path.exists(path) and time.time() < deadline:
            time.sleep(0.05)
        self.assertFalse(os.path.exists(path), path)

    def scratch(self, prefix):
        """A directory of the test's own, removed after it."""
        d = tempfile.mkdtemp(prefix=prefix)
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        return d

    def handed_off_from(self, directory, env):
        """Runs the burst program under env, every exit handing off (a minimum of one event):
        the session whole, from a file in `directory` that the daemon stored and removed.
        Returns how many events the file held."""
        with unittest.mock.patch.dict(os.environ, dict(env, TIDEMARK_HANDOFF_MIN_EVENTS="1")):
            truth, s, err = self.run_burst()
        self.assert_whole(truth, s)
        handed, path = self.handed_off(err)
        self.assertEqual(os.path.dirname(path), directory)
        self.assert_removed(path)
        return handed

    def assert_whole(self, truth, s):
        self.assertEqual(s["state"], "ended")
        self.assertEqual(s["events_dropped"], 0, s["stats"])
        frees = truth["allocs"] - truth["live_blocks"]
        self.assertEqual(s["events_sent"], truth["allocs"] + frees)
        self.assertEqual(s["events_stored"], s["events_sent"])
        self.assertEqual(s["blocks"], truth["allocs"])
        self.assertEqual(s["live_blocks_at_end"], truth["live_blocks"])  # no phantom live block

    def test_bursts_lose_nothing_by_default(self):
        env_vars = [k for k in os.environ if k.startswith("TIDEMARK_") and k not in
                    ("TIDEMARK_BIN", "TIDEMARK_SOURCE")]
        self.assertEqual(env_vars, [])
        # Whether a burst outruns the drain depends on the machine's scheduling: a run whose rings
        # never filled did not test the waits. Up to three runs, each one whole, until one did.
        for attempt in range(3):
            truth, s, err = self.run_burst()
            self.assert_whole(truth, s)
            # The end of the run went in a file, which the daemon stored and removed: in memory
            # where /dev/shm is a memory file system (a private directory of this user's).
            handed, path = self.handed_off(err)
            self.assertGreater(handed, 0)
            if memory_file_system("/dev/shm"):
                handoff_dir = "/dev/shm/tidemark-%d" % os.geteuid()
                self.assertEqual(os.path.dirname(path), handoff_dir)
                self.assertEqual(os.stat(handoff_dir).st_mode & 0o777, 0o700)
            self.assertEqual(s["stats"]["agent_handed_off"]["value"], handed)
            self.assert_removed(path)
            # Nothing was wrong (waits, hand-offs and buffering are "info").
            self.assertEqual({k for k, v in s["stats"].items() if v["severity"] != "info"}, set())
            self.assertIn(", 0 dropped", err)
            if "agent_ring_waits" in s["stats"]:
                break
        # The bursts did outrun the rings: threads waited, and lost nothing.
        self.assertGreater(s["stats"]["agent_ring_waits"]["value"], 0, s["stats"])
        live = self.daemon.sql("SELECT SUM(size_bytes) FROM allocation WHERE session_id = ? AND "
                               "free_seq IS NULL", s["id"])[0][0]
        self.assertEqual(live, truth["live_bytes"])
        self.daemon.wait_analyzed(s["id"])
        peak = self.daemon.cli_json("peak", str(s["id"]))
        self.assertEqual(peak["breakdown"]["tracked_bytes"], truth["peak_bytes"])

    def test_a_handoff_larger_than_the_spool_cap_goes_whole(self):
        # The handed-off file holds whatever the agent holds (its window, its buffer and the
        # buffer's file): a 1 MiB spool cap, far below what is left at the exit, does not cut it
        # (with the spool's cap the file failed, and the exit went at the daemon's pace — past
        # the exit's time, into a spool as capped). Every exit hands off here (a minimum of one
        # event), whatever the daemon's pace: the end of the run is never acknowledged yet. (The
        # spool's cap is also the cap of the buffer's file: the buffer's memory is made large
        # enough for the whole run, so that the small cap cuts nothing before the exit.)
        cap = 1 << 20
        with unittest.mock.patch.dict(os.environ, {"TIDEMARK_SPOOL_MAX_BYTES": str(cap),
                                                   "TIDEMARK_BUFFER_MAX_BYTES": str(512 << 20),
                                                   "TIDEMARK_HANDOFF_MIN_EVENTS": "1"}):
            truth, s, err = self.run_burst()
        self.assert_whole(truth, s)
        handed, path = self.handed_off(err)
        self.assertGreater(handed, cap // 40, "the file (about 40 bytes an event) passed the cap")
        self.assert_removed(path)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to mount a small memory file system")
    def test_a_small_memory_file_system_is_left_alone_and_the_spool_directory_takes_the_file(self):
        # A container's small /dev/shm (here 8 MiB; the file is tens of MiB), which DataLoader
        # workers share: nothing is written there (the file would take more than a quarter of
        # what is free), the file goes to the spool directory and is handed over from there.
        scratch = self.scratch("tidemark-handoff-")
        mnt, spool = os.path.join(scratch, "mnt"), os.path.join(scratch, "spool")
        os.mkdir(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt],
                           capture_output=True, text=True)
        if r.returncode != 0:  # root without CAP_SYS_ADMIN (a container)
            self.skipTest("cannot mount a memory file system here: " + r.stderr.strip())
        self.addCleanup(subprocess.run, ["umount", mnt], check=True)
        handed = self.handed_off_from(spool, {"TIDEMARK_HANDOFF_DIR": mnt + "/handoff",
                                              "TIDEMARK_SPOOL_DIR": spool})
        self.assertGreater(handed, (8 << 20) // 48, "more than the memory file system holds")
        self.assertEqual(os.listdir(mnt), [], "nothing was written in memory")

    @unittest.skipUnless(os.geteuid() == 0, "needs root to give a daemon a /dev/shm of its own")
    def test_a_daemon_that_cannot_open_the_memory_file_is_offered_it_from_the_spool(self):
        # A daemon of this user that does not see this /dev/shm (a container of its own; here a
        # mount namespace with a tmpfs of its own on /dev/shm): it cannot open the file written
        # there and says so; the agent writes it again in the spool directory and offers that.
        scratch = self.scratch("tidemark-own-shm-")
        port_file, spool = os.path.join(scratch, "port"), os.path.join(scratch, "spool")
        log = open(os.path.join(scratch, "tidemarkd.log"), "w")
        self.addCleanup(log.close)
        daemon = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"',
             "sh", os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix",
             "--db", os.path.join(scratch, "store.db"), "--port-file", port_file],
            stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(daemon.wait)
        self.addCleanup(daemon.terminate)
        deadline = time.time() + 30
        while not os.path.exists(port_file) and daemon.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if daemon.poll() is not None:  # root without CAP_SYS_ADMIN (a container)
            with open(os.path.join(scratch, "tidemarkd.log")) as f:
                self.skipTest("cannot give a daemon a /dev/shm of its own here: " + f.read())
        with open(port_file) as f:
            address = "127.0.0.1:" + f.read().strip()
        with unittest.mock.patch.dict(os.environ, {"TIDEMARK_SPOOL_DIR": spool,
                                                   "TIDEMARK_HANDOFF_MIN_EVENTS": "1"}):
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", address, "run",
                                "--", PROGRAM, "5000"], capture_output=True, text=True,
                               timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        handed, path = self.handed_off(r.stderr)
        self.assertEqual(os.path.dirname(path), spool)
        self.assert_removed(path)
        with open(os.path.join(scratch, "tidemarkd.log")) as f:
            self.assertIn("cannot open /dev/shm/tidemark-%d/" % os.geteuid(), f.read())
        truth = json.loads(r.stdout)
        for _ in range(600):  # live until the daemon has stored the file
            sessions = json.loads(subprocess.run(
                [os.path.join(BIN, "tidemark"), "--server", address, "sessions", "--json"],
                capture_output=True, text=True, check=True).stdout)["sessions"]
            if sessions[-1]["state"] != "live":
                break
            time.sleep(0.1)
        self.assertEqual(len(sessions), 1)
        s = sessions[0]
        self.assert_whole(truth, s)

    def test_an_empty_handoff_dir_keeps_the_file_out_of_memory(self):
        spool = self.scratch("tidemark-spool-")
        self.handed_off_from(spool, {"TIDEMARK_HANDOFF_DIR": "", "TIDEMARK_SPOOL_DIR": spool})

    def test_a_file_size_limit_never_ends_the_job(self):
        # A job run under `ulimit -f` (1 MiB, far below the exit's file): a write past it raises
        # SIGXFSZ, whose default ends the process; the agent's files stay under it (and its
        # threads block signals). No file can hold the rest, so the exit sends it at the daemon's
        # pace (the exit's time is raised for it): the job exits 0, and the session is whole.
        with unittest.mock.patch.dict(os.environ, {"TIDEMARK_EXIT_TIMEOUT_MS": "120000"}):
            r = subprocess.run(["prlimit", "--fsize=%d" % (1 << 20), "--",
                                os.path.join(BIN, "tidemark"), "--server", self.daemon.address,
                                "run", "--", PROGRAM, "40000"],
                               capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        truth = json.loads(r.stdout)
        self.assertNotIn("handed to the daemon", r.stderr)
        self.assert_whole(truth, self.daemon.newest_session())

    @contextlib.contextmanager
    def starving(self, stopped_s, running_s):
        """A context in which the daemon runs `running_s` of every `stopped_s + running_s` (as
        on a machine saturated by other jobs); it runs freely again after."""
        pid = self.daemon.proc.pid
        done = threading.Event()

        def starve():
            while not done.is_set():
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stopped_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(running_s)

        starver = threading.Thread(target=starve)
        starver.start()
        try:
            yield
        finally:
            done.set()
            starver.join()
            os.kill(pid, signal.SIGCONT)

    def test_a_full_buffer_holds_the_job_back_instead_of_dropping(self):
        # A daemon too slow for the job (running 20 ms of every 100) and an agent that holds
        # little (1 MiB of buffer in memory, a 1 MiB file — the caps a `ulimit -f` or a small
        # TIDEMARK_SPOOL_MAX_BYTES leave — and a 4 MiB window): once the window and the buffer
        # are full, the drain leaves the rings full and the job's threads wait for room. The job
        # runs at the daemon's pace, exits 0, and nothing is dropped (this lost 262k events of a
        # run on a loaded machine, counted as agent_dropped_buffer_full; 1.7 million here). The
        # waits last until the daemon commits, every few seconds when it is starved like this:
        # the deadline is raised (at the default 2 s a wait switches to the degraded mode, as
        # the next test shows).
        env = {"TIDEMARK_BUFFER_MAX_BYTES": str(1 << 20), "TIDEMARK_SPOOL_MAX_BYTES": str(1 << 20),
               "TIDEMARK_WINDOW_MAX_BYTES": str(4 << 20), "TIDEMARK_RING_WAIT_MS": "60000",
               "TIDEMARK_EXIT_TIMEOUT_MS": "120000"}
        with unittest.mock.patch.dict(os.environ, env), self.starving(0.08, 0.02):
            truth, s, err = self.run_burst()
        self.assertNotIn("degraded", err)
        self.assert_whole(truth, s)
        self.assertGreater(s["stats"]["agent_ring_waits"]["value"], 0, s["stats"])

    def test_a_daemon_that_stops_reading_loses_nothing_at_the_exit(self):
        # The daemon stopped (hung) as soon as the job's session exists, the job's 4 threads
        # allocating and freeing for 0.3 s more, then its exit: the stream is cancelled and the
        # rest spooled. gRPC's synchronous write to a peer that reads nothing did not always
        # return once cancelled (about every other run here): the exit then gave up on the sender
        # and the rest was lost ("did not answer at exit; … are lost"). The exit now takes a
        # sender still inside a call on the stream half a second after the cancel over and
        # spools the rest itself. Each run, whichever way it went: exit 0, nothing dropped, and
        # the uploaded spool completes the session — every pair of the program's, no block left
        # live. (The spool's cap raised to 1 GiB: a loaded machine's 0.3 s can pass the default's
        # 6 million events, and those past it are dropped, counted.)
        churn = os.path.join(BIN, "tidemark_churn_program")
        taken_over = 0
        for attempt in range(4):
            spool_dir = tempfile.mkdtemp(prefix="spool-", dir=self.daemon.dir)
            known = {s["id"] for s in self.daemon.cli_json("sessions")["sessions"]}
            job = subprocess.Popen(
                [os.path.join(BIN, "tidemark"), "--server", self.daemon.address, "run", "--",
                 churn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=dict(os.environ, TIDEMARK_SPOOL_DIR=spool_dir,
                                    TIDEMARK_SPOOL_MAX_BYTES=str(1 << 30)))
            try:
                deadline = time.time() + 60
                while not ({s["id"] for s in self.daemon.cli_json("sessions")["sessions"]} -
                           known) and time.time() < deadline:
                    time.sleep(0.02)
                os.kill(self.daemon.proc.pid, signal.SIGSTOP)
                time.sleep(0.3)
                out, err = job.communicate("", timeout=120)
            finally:
                os.kill(self.daemon.proc.pid, signal.SIGCONT)
                if job.poll() is None:
                    job.kill()
                    job.communicate()
            self.assertEqual(job.returncode, 0, err)
            self.assertNotIn("lost", err)
            m = re.search(r"(\d+) events spooled to (\S+) \(0 dropped\); complete the session "
                          r"with: tidemark upload", err)
            self.assertIsNotNone(m, err)
            taken_over += "its stream did not end once cancelled" in err
            self.daemon.cli("upload", m.group(2))
            s = self.daemon.newest_session()
            pairs = int(re.search(r"(\d+) pairs", out).group(1))
            self.assertEqual((s["state"], s["events_dropped"]), ("ended", 0), err)
            self.assertEqual(s["events_stored"], s["events_sent"])
            self.assertEqual(s["events_sent"], 2 * pairs)
            self.assertEqual((s["blocks"], s["live_blocks_at_end"]), (pairs, 0))
            self.assertEqual({k for k, v in s["stats"].items() if v["severity"] != "info"}, set())
        print("(%d of 4 runs' exits took a stuck sender over)" % taken_over)

    def test_a_hung_daemon_past_the_deadline_degrades_the_recording_not_the_job(self):
        # The daemon stopped (hung) from before the job until 3 s into it, a small buffer, and a
        # 300 ms deadline: a thread waits that long for room, and the whole process records on
        # in the degraded mode — full rings drop, counted, said — while the job goes on at its
        # own pace and exits 0. None is lost without being counted.
        env = {"TIDEMARK_BUFFER_MAX_BYTES": str(1 << 20), "TIDEMARK_SPOOL_MAX_BYTES": str(1 << 20),
               "TIDEMARK_WINDOW_MAX_BYTES": str(1 << 20), "TIDEMARK_RING_WAIT_MS": "300"}
        pid = self.daemon.proc.pid
        os.kill(pid, signal.SIGSTOP)
        timer = threading.Timer(3, os.kill, (pid, signal.SIGCONT))
        timer.start()
        try:
            with unittest.mock.patch.dict(os.environ, env):
                r = self.daemon.cli("run", "--", PROGRAM, "40000")
        finally:
            timer.cancel()
            os.kill(pid, signal.SIGCONT)
        self.assertEqual(r.returncode, 0, r.stderr)
        # (Why, where the buffer had filled; a collector that a loaded machine did not run for
        # 300 ms is the other way there.)
        self.assertRegex(r.stderr, r"a thread waited 300 ms for the agent to make room( \(its "
                         r"buffer had filled: the daemon took less than the job made\))?; "
                         r"recording goes on in degraded mode")
        truth = json.loads(r.stdout)
        self.complete_spool(r.stderr)  # the exit outran the daemon: spooled
        s = self.daemon.newest_session()
        self.assertEqual(s["state"], "ended")
        self.assertEqual(s["stats"]["agent_degraded"]["value"], 1)
        self.assertGreater(s["events_dropped"], 0)
        self.assertIn("%d dropped" % s["events_dropped"], r.stderr)
        # Every event sent was received; what was not stored is the frees of blocks whose
        # allocation was dropped (from the buffer, after the agent had tracked them).
        self.assertEqual(s["events_received"], s["events_sent"])
        untracked = s["stats"].get("free_of_untracked", {}).get("value", 0)
        self.assertEqual(s["events_stored"] + untracked, s["events_sent"])
        frees = truth["allocs"] - truth["live_blocks"]
        self.assertLessEqual(s["events_sent"] + s["events_dropped"], truth["allocs"] + frees)

    def test_a_starved_daemon_at_the_exit_loses_nothing(self):
        # The daemon runs 3 ms of every 300 from before the job starts until it has exited (as
        # on 2 cores among ~150 threads of other jobs): the job exits 0, in seconds, and nothing
        # is lost — handed off, or spooled whole for an upload. (What lost 224k events in
        # section 6 of bench/run.sh — a handshake answered after the exit's time, then the rest
        # written at the daemon's pace past the spool's grace — needed the agent starved too;
        # this does not reproduce it, it holds the property.)
        with self.starving(0.297, 0.003):
            started = time.monotonic()
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.daemon.address,
                                "run", "--", PROGRAM, "5000"],
                               capture_output=True, text=True, timeout=300)
            took = time.monotonic() - started
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("lost", r.stderr)
        self.assertIn(", 0 dropped", r.stderr)
        self.assertLess(took, 20, "the exit waited %.1f s" % took)
        truth = json.loads(r.stdout)
        self.complete_spool(r.stderr)  # spooled
        self.assert_whole(truth, self.daemon.newest_session())

    def test_a_daemon_killed_while_it_stores_a_handed_over_file_finishes_it_after_a_restart(self):
        r = self.daemon.cli("run", "--", PROGRAM, "40000")
        self.assertEqual(r.returncode, 0, r.stderr)
        truth = json.loads(r.stdout)
        handed, path = self.handed_off(r.stderr)
        # At once, while it is storing the file (the session still live): nothing it can do.
        session = self.daemon.newest_session(wait_ended=False)
        self.assertEqual(session["state"], "live")
        self.daemon.kill_and_restart()
        s = self.daemon.wait_ended(session["id"])
        self.assertIn("taking up the file its agent handed over", self.daemon.read_log())
        self.assert_whole(truth, s)
        self.assertNotIn("stream_lost", s["stats"])
        self.assertEqual(s["stats"]["agent_handed_off"]["value"], handed)
        self.assert_removed(path)

    def test_lossy_mode_drops_and_counts(self):
        truth, s, err = self.run_burst("--lossy")
        self.assertEqual(s["state"], "ended")
        self.assertGreater(s["events_dropped"], 0)
        self.assertEqual(s["stats"]["agent_dropped_ring_full"]["value"], s["events_dropped"])
        self.assertEqual(s["stats"]["agent_lossy"]["value"], 1)
        self.assertNotIn("agent_ring_waits", s["stats"])
        # What was sent was stored; less than the program did (an alloc dropped is a block not
        # tracked, whose free is then no event either).
        self.assertEqual(s["events_stored"], s["events_sent"])
        frees = truth["allocs"] - truth["live_blocks"]
        self.assertLess(s["events_sent"], truth["allocs"] + frees)
        self.assertLessEqual(s["events_sent"] + s["events_dropped"], truth["allocs"] + frees)
        self.assertIn("%d dropped" % s["events_dropped"], err)


if __name__ == "__main__":
    unittest.main()
