"""A live session answers from the ingest's live analysis (src/core/live_analysis.h): while the
examples' training runs, `steps`, `peak`, `breakdown --step` and `timeline` answer, and every step
they showed as ended equals, figure for figure, what the stored analysis says once the session has
ended. A session analysed as it came is stored analysed with its end (no pass at the end), and
what is stored equals, table for table and byte for byte, what the analysis pass stores for the
same session. (A long live session at a high rate: test_scale.LiveAtScaleTest.)"""
import json
import os
import sqlite3
import subprocess
import time
import unittest

from tidemark_env import BIN, PYTHON, SOURCE, Daemon


def categories(breakdown):
    return {k: v["bytes"] for k, v in breakdown["categories"].items()}


class LiveTrainingTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.addCleanup(self.daemon.cleanup)

    def test_live_answers_equal_the_stored_analysis(self):
        d = self.daemon
        job = subprocess.Popen(
            [os.path.join(BIN, "tidemark"), "--server", d.address, "run", "--", PYTHON,
             os.path.join(SOURCE, "examples", "train.py"), "--steps", "30"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(job.kill)
        seen = {}  # step -> its peak as a live query showed it once ended
        live_peaks, live_answers = [], 0
        sid = None
        deadline = time.time() + 600
        while job.poll() is None and time.time() < deadline:
            if sid is None:
                live = [s for s in d.cli_json("sessions")["sessions"] if s["state"] == "live"]
                sid = str(live[-1]["id"]) if live else None
                time.sleep(0.2)
                continue
            q = d.cli("steps", sid, "--json", check=False)
            info = [s for s in d.cli_json("sessions")["sessions"] if str(s["id"]) == sid][0]
            if q.returncode != 0 or info["state"] != "live":
                time.sleep(0.2)
                continue
            steps = json.loads(q.stdout)["steps"]
            ended = {s["step"]: s["peak"] for s in steps if s["end_ts_ns"]}
            peak = d.cli_json("peak", sid)
            tl = d.cli_json("timeline", sid, "--buckets", "50")
            self.assertEqual(len(tl["buckets"]), 50)
            # Once the live peak holds memory, so does the timeline asked after it (a session
            # seen at its very start may have received nothing yet: both are empty then).
            if peak["breakdown"]["tracked_bytes"] > 0:
                self.assertGreater(max(b["max"][0] for b in tl["buckets"]), 0)
            if len(steps) >= 2 and steps[-2]["end_ts_ns"]:
                b = d.cli_json("breakdown", sid, "--step", str(steps[-2]["step"]))
                self.assertEqual(b["tracked_bytes"], steps[-2]["peak"]["tracked_bytes"])
            # Answers that came as the stream ended count too: a query then waits for the end's
            # commit (it would otherwise read the recording without its open blocks).
            for step, p in ended.items():
                seen.setdefault(step, p)
            live_peaks.append(peak["breakdown"]["tracked_bytes"])
            info = [s for s in d.cli_json("sessions")["sessions"] if str(s["id"]) == sid][0]
            live_answers += info["state"] == "live"
            time.sleep(0.3)
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 0, err)
        self.assertGreaterEqual(live_answers, 3, "the job ended before it was queried live")
        self.assertGreaterEqual(len(seen), 3)
        # The whole peak only grows while the job runs, and ends at the stored one.
        self.assertEqual(live_peaks, sorted(live_peaks))
        print("\n%d live answers; %d ended steps seen live, compared with the stored analysis"
              % (live_answers, len(seen)))
        d.wait_analyzed(int(sid))
        stored = {s["step"]: s["peak"] for s in d.cli_json("steps", sid)["steps"]}
        self.assertLessEqual(live_peaks[-1], d.cli_json("peak", sid)["breakdown"]["tracked_bytes"])
        for step, live in sorted(seen.items()):
            with self.subTest(step=step):
                final = stored[step]
                self.assertEqual(live["tracked_bytes"], final["tracked_bytes"])
                self.assertEqual(live["offset_ns"], final["offset_ns"])
                self.assertEqual(categories(live), categories(final))
                self.assertEqual(live["phase"], final["phase"])


ANALYSIS_TABLES = {
    "peak": "step, seq, ts_ns, tracked_bytes, phase, scope",
    "peak_category": "step, category, bytes, blocks",
    "peak_item": "step, kind, rank, name, category, bytes, blocks, rule",
    "timeline_chunk": "level, chunk, first_ts_ns, last_ts_ns, sample_count, samples",
    "block_category": "chunk, codes",
}


def stored_analysis(db, sid):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        out = {t: con.execute("SELECT %s FROM %s WHERE session_id = ? ORDER BY %s"
                              % (cols, t, cols), (sid,)).fetchall()
               for t, cols in ANALYSIS_TABLES.items()}
        out["stat"] = con.execute("SELECT name, value FROM stat WHERE session_id = ? "
                                  "ORDER BY name", (sid,)).fetchall()
        return out
    finally:
        con.close()


class StoredFromLiveTest(unittest.TestCase):
    def test_the_live_analysis_stores_what_the_pass_stores(self):
        d = Daemon()
        self.addCleanup(d.cleanup)
        r = d.run(PYTHON, os.path.join(SOURCE, "examples", "train.py"), "--steps", "6")
        self.assertEqual(r.returncode, 0, r.stderr)
        sid = d.newest_session()["id"]
        self.assertIn("session %d analysed as its events came" % sid, d.read_log())
        info = d.wait_analyzed(sid)
        self.assertEqual(info["state"], "ended")
        live = stored_analysis(d.db, sid)
        self.assertGreater(len(live["peak"]), 6)  # the whole session's and each step's
        self.assertGreater(len(live["timeline_chunk"]), 1)
        self.assertGreater(len(live["block_category"]), 0)
        self.assertGreater(len(live["peak_item"]), 0)
        # The same session through the analysis pass: its results dropped, the daemon restarted
        # (it analyses what is not analysed at start).
        d.proc.terminate()
        d.proc.wait(timeout=30)
        con = sqlite3.connect(d.db)
        try:
            for t in ANALYSIS_TABLES:
                con.execute("DELETE FROM %s WHERE session_id = ?" % t, (sid,))
            con.execute("UPDATE session SET analyzed = 0 WHERE id = ?", (sid,))
            con.commit()
        finally:
            con.close()
        d.kill_and_restart()
        d.wait_analyzed(sid)
        passed = stored_analysis(d.db, sid)
        for table in live:
            with self.subTest(table=table):
                self.assertEqual(len(live[table]), len(passed[table]))
                self.assertEqual(live[table], passed[table])


if __name__ == "__main__":
    unittest.main()
