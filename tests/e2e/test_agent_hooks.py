"""The agent's allocator hooks in a plain C++ program (no Python, no adapter): every hooked
function is seen, untracked malloc/free is ignored, realloc of a tracked block is a free and a new
block, other threads are recorded, and the events reach the store when the program exits."""
import json
import os
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


if __name__ == "__main__":
    unittest.main()
