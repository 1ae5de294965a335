"""A daemon whose PostgreSQL store goes away mid-run (the server stopped for seconds, then started
again, as a database restart does): the job trains on, nothing is lost, the session is whole and
analysed once the server is back. The server is the test's own (scripts/postgres-test-server.sh
halt / resume), not the suites' shared one."""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from tidemark_env import BIN, PYTHON, SOURCE

SERVER = os.path.join(SOURCE, "scripts", "postgres-test-server.sh")


class StoreServerDownTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tidemark-pg-down-")
        self.uri_file = os.path.join(self.dir, "postgres.uri")
        subprocess.run(["bash", SERVER, "start", self.uri_file], check=True,
                       stdout=subprocess.DEVNULL)
        with open(self.uri_file) as f:
            store = f.read().strip()
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "tidemarkd.log"), "w")
        self.daemon = subprocess.Popen(
            [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix", "--store",
             store, "--port-file", port_file], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            self.assertLess(time.time(), deadline, "tidemarkd did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()

    def tearDown(self):
        self.daemon.terminate()
        self.daemon.wait(timeout=60)
        self.log.close()
        subprocess.run(["bash", SERVER, "stop", self.uri_file], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def cli_json(self, *args):
        import json
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.address, *args,
                            "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_the_store_server_down_mid_run_loses_nothing(self):
        train = [PYTHON, os.path.join(SOURCE, "examples", "train.py"), "--steps", "12"]
        plain = subprocess.run(train, capture_output=True, text=True, timeout=600)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        job = subprocess.Popen([os.path.join(BIN, "tidemark"), "--server", self.address, "run",
                                "--", *train], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        # The server goes down once the job is into its steps, for 4 s.
        deadline = time.time() + 120
        while not self.cli_json("sessions")["sessions"] or \
                self.cli_json("sessions")["sessions"][0]["steps"] < 2:
            self.assertLess(time.time(), deadline, "the job did not start its steps")
            self.assertIsNone(job.poll(), "the job ended before the server went down")
            time.sleep(0.1)
        subprocess.run(["bash", SERVER, "halt", self.uri_file], check=True)
        time.sleep(4)
        subprocess.run(["bash", SERVER, "resume", self.uri_file], check=True)
        out, err = job.communicate(timeout=600)
        self.assertEqual(job.returncode, 0, err)
        # The job trained as without tidemark (examples/train.py prints its losses).
        losses = [l.split(" (")[0] for l in out.splitlines() if l.startswith("step ")]
        self.assertEqual(losses, [l.split(" (")[0] for l in plain.stdout.splitlines()
                                  if l.startswith("step ")])
        self.assertEqual(len(losses), 12)
        self.assertIn(" 0 dropped", err)
        deadline = time.time() + 120
        while True:
            s = self.cli_json("sessions")["sessions"][0]
            if s["state"] != "live" and s["analyzed"]:
                break
            self.assertLess(time.time(), deadline, "the session was not stored and analysed")
            time.sleep(0.2)
        self.assertEqual(s["events_stored"], s["events_sent"])
        self.assertEqual(s["events_received"], s["events_sent"])
        self.assertEqual(s["events_dropped"], 0)
        self.assertEqual(s["steps"], 12)
        b = self.cli_json("breakdown", str(s["id"]), "--step", "12")
        self.assertGreater(b["categories"]["OPTIMIZER_STATE"]["bytes"], 0)
        with open(self.log.name) as f:
            log = f.read()
        # The outage was seen and said, and its end.
        self.assertIn("tidemarkd: the store cannot be written", log)
        self.assertIn("tidemarkd: the store can be written again", log)


if __name__ == "__main__":
    unittest.main()
