"""A job that reaches its memory limit is not ended by the profiler, and loses nothing. A native
program under `tidemark run` sets an address-space limit (RLIMIT_AS, as `ulimit -v` does) a little
above what it maps, fills it with 1 MiB blocks until one is refused, keeps allocating and freeing
small blocks there, halves and refills, and exits. While it sits at the limit the agent finds no
memory either — for its buffer's chunks, its encoding, its threads, gRPC's. Before, that could end
the job: std::bad_alloc or std::system_error out of the agent's threads (SIGABRT, exit 134), e.g.
at a reconnection while the job was at its limit (its reader thread could not be made). Now the
records go to the buffer's file (opened at the start), the sender leaves the link alone until
memory is back, and the session is whole: every allocation and free of the program sent and
stored, none dropped. Also with its daemon killed while the job is at its limit: gRPC's threads
react to the broken connection themselves, and abseil's lock-order check inside gRPC ended the
process when its mmap failed (3 runs in 4); the agent turns that check off."""
import json
import os
import re
import signal
import subprocess
import threading
import time
import unittest

from tidemark_env import BIN, DaemonTestCase

PROGRAM = os.path.join(BIN, "tidemark_memory_limit_program")


class MemoryLimitTest(DaemonTestCase):
    def run_to_the_limit(self, pairs, daemon_stopped=False, hold_until_shortage=False,
                         at_the_limit=None):
        """The program under `tidemark run`, its limit set once its session is live (mid-run: a
        job reaches its limit after its start, with the agent connected). daemon_stopped: the
        daemon is stopped (SIGSTOP, a hung daemon) from the limit to the end of the job's work,
        so that the agent must keep what the daemon does not take. hold_until_shortage: the job
        stays at its limit until the agent has said it found no memory (at most 60 s; a stay of
        a few milliseconds can fall between two of the sender's passes on a busy machine).
        at_the_limit: called once the job holds all the memory there is. Returns the program's
        own counts, the session and the agent's stderr."""
        job = subprocess.Popen(
            [os.path.join(BIN, "tidemark"), "--server", self.daemon.address, "run", "--",
             PROGRAM, "256", str(pairs), "wait"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: job.poll() is None and job.kill())
        # The agent's stderr read as it comes (the shortage's line is waited for).
        err_lines = []
        said_shortage = threading.Event()

        def read_err():
            for err_line in job.stderr:
                err_lines.append(err_line)
                if "the agent could not get memory" in err_line:
                    said_shortage.set()

        reader = threading.Thread(target=read_err, daemon=True)
        reader.start()
        self.assertEqual(job.stdout.readline(), "ready\n")
        deadline = time.time() + 60
        while not any(s["pid"] == job.pid and s["state"] == "live"
                      for s in self.daemon.cli_json("sessions")["sessions"]):
            self.assertLess(time.time(), deadline, "the session never went live")
            time.sleep(0.05)
        if daemon_stopped:
            os.kill(self.daemon.proc.pid, signal.SIGSTOP)
            self.addCleanup(lambda: self.daemon.proc.poll() is None and
                            os.kill(self.daemon.proc.pid, signal.SIGCONT))

        def go():
            try:
                job.stdin.write("go\n")
                job.stdin.flush()
            except BrokenPipeError:  # the job died: its exit status says how, below
                pass

        go()
        job.stdout.readline()  # "full": the job holds all the memory there is
        if at_the_limit:
            at_the_limit()
        if hold_until_shortage:
            said_shortage.wait(60)
        go()
        line = job.stdout.readline()  # its work is done (or it died: no line)
        if daemon_stopped:
            os.kill(self.daemon.proc.pid, signal.SIGCONT)
        job.stdout.read()
        job.wait(timeout=300)
        reader.join(timeout=60)
        err = "".join(err_lines)
        self.assertEqual(job.returncode, 0, err)
        truth = json.loads(line)
        if self.daemon.session_for_pid(job.pid)["state"] != "ended":
            # Left for an upload where the agent says so (its daemon gone for good). (Not
            # checked here: a daemon taking the same spool up meanwhile makes the upload fail,
            # the session whole all the same — which is what is checked.)
            m = re.search(r"tidemark upload (\S+)$", err.strip())
            if m and os.path.exists(m.group(1)):
                self.daemon.cli("upload", m.group(1), check=False)
        return truth, self.daemon.wait_ended(self.daemon.session_for_pid(job.pid)["id"]), err

    def assert_whole(self, truth, s, err):
        # The job did reach its limit (its large blocks were refused in the end) and did its
        # whole work.
        self.assertGreater(truth["refused"], 0)
        self.assertEqual(truth["rounds"], 3)
        self.assertEqual(truth["allocs"], truth["frees"])
        # Whole: one session, every allocation and free of the program sent and stored, none
        # dropped, nothing left live.
        self.assertEqual(s["state"], "ended", (s, err))
        self.assertEqual(s["events_dropped"], 0, s["stats"])
        self.assertEqual(s["events_sent"], 2 * truth["allocs"])
        self.assertEqual(s["events_stored"], s["events_sent"])
        self.assertEqual(s["blocks"], truth["allocs"])
        self.assertEqual(s["live_blocks_at_end"], 0)
        self.assertRegex(err, r"(, |\()0 dropped")  # sent, or spooled
        self.assertEqual({k for k, v in s["stats"].items() if v["severity"] != "info"}, set(),
                         s["stats"])

    def test_a_job_at_its_memory_limit_runs_on_and_loses_nothing(self):
        # The sender's passes while the job is at its limit find no room for the stream (a
        # probe): said once, counted on the session.
        truth, s, err = self.run_to_the_limit(60000, hold_until_shortage=True)
        self.assert_whole(truth, s, err)
        self.assertGreater(s["stats"]["agent_memory_shortages"]["value"], 0, s["stats"])
        self.assertEqual(err.count("the agent could not get memory"), 1, err)

    def test_a_job_at_its_memory_limit_with_a_hung_daemon_loses_nothing(self):
        # The agent's buffer grows past its memory (2.8 million records, 130 MB) while the job
        # holds all the memory there is: the rest goes to the buffer's file.
        truth, s, err = self.run_to_the_limit(200000, daemon_stopped=True)
        self.assert_whole(truth, s, err)
        self.assertGreater(s["stats"]["agent_buffered_to_disk"]["value"], 0, s["stats"])

    def test_a_job_at_its_memory_limit_outlives_its_daemon(self):
        # The daemon killed while the job sits at its limit (started again, elsewhere): gRPC's
        # threads react to the connection's end and try to make another, in the job's process.
        # abseil's lock-order check (on in Debian's build) grows its graph by mmap and ended the
        # process when that failed — the job died of SIGABRT in 3 runs of 4 ("low_level_alloc.cc:
        # mmap error: 12"). The agent turns that check off: the job exits 0 and its run, spooled,
        # completes its session once uploaded. Three times (without the change one run in two
        # of this test, of two jobs each, failed).
        for attempt in range(3):
            truth, s, err = self.run_to_the_limit(200000, at_the_limit=self.daemon.kill_and_restart)
            self.assert_whole(truth, s, err)
            self.assertIn("spooled", err)


if __name__ == "__main__":
    unittest.main()
