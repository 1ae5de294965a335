"""The agent's allocator hooks in a plain C++ program (no Python, no adapter): every hooked
function is seen, untracked malloc/free is ignored, realloc of a tracked block is a free and a new
block, other threads are recorded, and the events reach the store when the program exits."""
import json
import os
import shutil
import sys
import tempfile
import unittest

from tidemark_env import BIN, Daemon


class AgentHooksTest(unittest.TestCase):
    def test_known_allocation_history(self):
        daemon = Daemon()
        try:
            r = daemon.run(os.path.join(BIN, "tidemark_alloc_program"))
            self.assertEqual(r.returncode, 0, r.stderr)
            expected = json.loads(r.stdout)
            s = daemon.newest_session()
            self.assertEqual(s["state"], "ended")
            self.assertEqual(s["blocks"], expected["blocks"])
            self.assertEqual(s["live_blocks_at_end"], expected["live"])
            self.assertEqual(s["events_sent"], s["events_stored"])
            self.assertEqual(s["stats"], {})
            live = daemon.sql("SELECT SUM(size_bytes) FROM allocation WHERE session_id = ? AND "
                              "free_seq IS NULL", s["id"])[0][0]
            self.assertEqual(live, expected["live_bytes"])
            threads = daemon.sql("SELECT COUNT(DISTINCT thread_id) FROM allocation "
                                 "WHERE session_id = ?", s["id"])[0][0]
            self.assertEqual(threads, 2)
            realloced = daemon.sql("SELECT COUNT(*) FROM allocation WHERE session_id = ? AND "
                                   "size_bytes = 100000", s["id"])[0][0]
            self.assertEqual(realloced, 1)
        finally:
            daemon.cleanup()

    def test_an_agent_under_another_name_records(self):
        # TIDEMARK_AGENT naming a copy or a link called otherwise (an installation's own layout):
        # the agent knows itself by its file, not its name. It used to record nothing, silently.
        lib = os.path.join(os.path.dirname(BIN), "lib", "libtidemark_agent.so")
        work = tempfile.mkdtemp(prefix="tidemark-agent-name-")
        daemon = Daemon()
        try:
            copy = os.path.join(work, "libprofiler.so")
            shutil.copy(lib, copy)
            link = os.path.join(work, "agent-link.so")
            os.symlink(lib, link)
            for agent in (copy, link):
                # A job that prints the environment its own children would get: the agent has
                # taken itself out of LD_PRELOAD (children are not profiled), keeping the others.
                r = daemon.run(sys.executable, "-c",
                               "import os, sys; sys.stdout.write(os.environ.get('LD_PRELOAD',"
                               " '<none>'))", env={"TIDEMARK_AGENT": agent})
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout, "<none>", agent)
                self.assertIn("events sent", r.stderr, agent)
                r = daemon.run(os.path.join(BIN, "tidemark_alloc_program"),
                               env={"TIDEMARK_AGENT": agent})
                self.assertEqual(r.returncode, 0, r.stderr)
                expected = json.loads(r.stdout)
                s = daemon.newest_session()
                self.assertEqual(s["state"], "ended", agent)
                self.assertEqual(s["blocks"], expected["blocks"], agent)
                self.assertEqual(s["events_sent"], s["events_stored"], agent)
                self.assertGreater(s["events_stored"], 0, agent)
        finally:
            daemon.cleanup()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
