"""Two hosts, one shared store (docs/deployment.md: a daemon per node, one PostgreSQL): two network
namespaces joined by a veth link, made by the test; a real PostgreSQL server in the first,
listening on the link; a tidemarkd in each (its own name), both storing into that server; one
data-parallel job of 2 x 2 ranks across them (gloo over the link), each rank under `tidemark run`
with its own host's daemon. Both daemons answer for the whole job, every rank's figures exact.

Needs root (network namespaces): the test command runs as root; elsewhere this suite fails,
saying so."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from tidemark_env import BIN, PYTHON, SOURCE, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3
NET = "10.213.7."  # the link's /24: host a is .1, host b is .2


def sh(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("%s failed: %s" % (" ".join(cmd), r.stderr))
    return r.stdout


class TwoHostsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise AssertionError("the two-host test makes network namespaces: run it as root "
                                 "(scripts/test.sh does)")
        tag = str(os.getpid())
        cls.ns = {"a": "tm%sa" % tag, "b": "tm%sb" % tag}
        cls.link = {"a": "tmv%sa" % tag[-8:], "b": "tmv%sb" % tag[-8:]}
        cls.addr = {"a": NET + "1", "b": NET + "2"}
        cls.out = tempfile.mkdtemp(prefix="tidemark-two-hosts-")
        os.chmod(cls.out, 0o755)  # the server's user writes nothing here, reads nothing either
        cls.daemons = {}
        cls.uri_file = os.path.join(cls.out, "postgres.uri")
        try:
            for h in ("a", "b"):
                sh("ip", "netns", "add", cls.ns[h])
            sh("ip", "link", "add", cls.link["a"], "type", "veth", "peer", "name", cls.link["b"])
            for h in ("a", "b"):
                sh("ip", "link", "set", cls.link[h], "netns", cls.ns[h])
                sh("ip", "-n", cls.ns[h], "addr", "add", cls.addr[h] + "/24", "dev", cls.link[h])
                sh("ip", "-n", cls.ns[h], "link", "set", cls.link[h], "up")
                sh("ip", "-n", cls.ns[h], "link", "set", "lo", "up")
            # The store: a PostgreSQL server on host a, reached over the link by both daemons.
            sh("ip", "netns", "exec", cls.ns["a"], "bash",
               os.path.join(SOURCE, "scripts", "postgres-test-server.sh"), "start", cls.uri_file,
               cls.addr["a"])
            with open(cls.uri_file) as f:
                cls.store = f.read().strip()
            for h in ("a", "b"):
                cls.daemons[h] = cls.start_daemon(h)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start_daemon(cls, h):
        port_file = os.path.join(cls.out, "port-" + h)
        log = open(os.path.join(cls.out, "tidemarkd-%s.log" % h), "w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", cls.ns[h], os.path.join(BIN, "tidemarkd"), "--listen",
             "127.0.0.1:0", "--no-unix", "--store", cls.store, "--name", "host-" + h,
             "--port-file", port_file], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if proc.poll() is not None or time.time() > deadline:
                with open(log.name) as f:
                    raise AssertionError("tidemarkd on host %s did not start: %s" % (h, f.read()))
            time.sleep(0.05)
        with open(port_file) as f:
            return {"proc": proc, "log": log, "address": "127.0.0.1:" + f.read().strip()}

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons.values():
            if d["proc"].poll() is None:
                d["proc"].terminate()
                d["proc"].wait(timeout=30)
            d["log"].close()
        subprocess.run(["bash", os.path.join(SOURCE, "scripts", "postgres-test-server.sh"), "stop",
                        cls.uri_file], capture_output=True)
        for h in ("a", "b"):
            subprocess.run(["ip", "netns", "del", cls.ns[h]], capture_output=True)
        shutil.rmtree(cls.out, ignore_errors=True)

    def cli(self, h, *args, as_json=True):
        r = subprocess.run(["ip", "netns", "exec", self.ns[h], os.path.join(BIN, "tidemark"),
                            "--server", self.daemons[h]["address"], *args] +
                           (["--json"] if as_json else []),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout) if as_json else r

    def start_job(self, out, steps, model="mlp"):
        """The 2 x 2 ranks of one job, each under `tidemark run` with its own host's daemon.
        Returns the job's key and the ranks' processes."""
        master_port = free_port()
        procs = []
        for rank in range(4):
            h = "a" if rank < 2 else "b"
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % 2), WORLD_SIZE="4",
                       MASTER_ADDR=self.addr["a"], MASTER_PORT=str(master_port),
                       GLOO_SOCKET_IFNAME=self.link[h])
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", self.ns[h], os.path.join(BIN, "tidemark"), "--server",
                 self.daemons[h]["address"], "run", "--", PYTHON,
                 os.path.join(HERE, "ddp_train.py"), "--model", model, "--steps", str(steps),
                 "--out-dir", out], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        return "%s:%d" % (self.addr["a"], master_port), procs

    def finish_job(self, procs, out):
        try:
            for p in procs:
                _, err = p.communicate(timeout=600)
                self.assertEqual(p.returncode, 0, err)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        truths = {}
        for rank in range(4):
            with open(os.path.join(out, "rank%d.json" % rank)) as f:
                truths[rank] = json.load(f)
        return truths

    def test_a_job_across_two_hosts_is_one_job_on_both_daemons(self):
        key, procs = self.start_job(self.out, STEPS)
        truths = self.finish_job(procs, self.out)
        # Each daemon answers for the whole job: the ranks it took and the other host's.
        for h in ("a", "b"):
            with self.subTest(daemon=h):
                jobs = [j for j in self.cli(h, "jobs")["jobs"] if j["key"] == key]
                self.assertEqual(len(jobs), 1, "one job, not one per host")
                job = self.cli(h, "job", key)
                self.assertEqual([r["rank"] for r in job["ranks"]], [0, 1, 2, 3])
                self.assertEqual(job["job"]["world_size"], 4)
                self.assertEqual(job["missing_ranks"], [])
                for r in job["ranks"]:
                    s = r["session"]
                    self.assertEqual(s["daemon"], "host-a" if r["rank"] < 2 else "host-b")
                    self.assertEqual(s["local_rank"], r["rank"] % 2)
                    self.assertEqual(s["pid"], truths[r["rank"]]["pid"])
                    self.assertEqual(s["events_dropped"], 0)
        # Every rank's breakdown is exact whichever daemon is asked (each session analysed by
        # the daemon that took it, once).
        for rank in range(4):
            sid = str(self.cli("a", "job", key)["ranks"][rank]["session"]["id"])
            for h in ("a", "b"):
                deadline = time.time() + 120
                while not [s for s in self.cli(h, "sessions")["sessions"]
                           if s["id"] == int(sid) and s["analyzed"]]:
                    self.assertLess(time.time(), deadline, "session %s not analysed" % sid)
                    time.sleep(0.2)
                b = self.cli(h, "breakdown", sid, "--step", str(STEPS))
                cats = {k: v["bytes"] for k, v in b["categories"].items()}
                with self.subTest(rank=rank, daemon=h):
                    self.assertEqual(cats["WEIGHT"], truths[rank]["param_bytes"])
                    self.assertEqual(cats["OPTIMIZER_STATE"], truths[rank]["optimizer_bytes"])
        # The ranks trained together over the link: DDP all-reduced their gradients, so every
        # rank ends with the same parameters (each trained on batches of its own).
        sums = [truths[r]["param_sum"] for r in range(4)]
        for s in sums[1:]:
            self.assertAlmostEqual(s, sums[0], delta=1e-6 * max(1.0, abs(sums[0])))
        self.assertNotEqual(truths[0]["losses"], truths[2]["losses"])

    def test_a_plan_asked_of_one_daemon_reaches_every_rank_on_both_hosts(self):
        # `tidemark apply --job` asked of host a's daemon: the ranks on host b stream to the
        # other daemon, which sends them the plan from the shared store. All four switch at the
        # same step, train on together, and measure the predicted peak.
        out = os.path.join(self.out, "planned")
        os.makedirs(out)
        steps = 24
        key, procs = self.start_job(out, steps, model="gpt")
        try:
            deadline = time.time() + 300
            while time.time() < deadline:
                job = self.cli("a", "job", key) if [
                    j for j in self.cli("a", "jobs")["jobs"] if j["key"] == key] else None
                live = [r for r in (job or {}).get("ranks", [])
                        if r["session"]["state"] == "live" and r["session"]["steps"] >= 3]
                if len(live) == 4:
                    break
                time.sleep(0.3)
            self.assertEqual(len(live), 4, "the ranks did not run 3 steps each")
            plan = os.path.join(out, "plan.json")
            self.cli("a", "plan", "--job", key, "--budget", "50%", "--out", plan, as_json=False)
            applied = self.cli("a", "apply", "--job", key, plan)
            at = applied["at_step"]
            self.assertLess(at, steps - 2, "applied too late to measure")
            self.assertEqual(sorted(r["rank"] for r in applied["ranks"]), [0, 1, 2, 3])
            for r in applied["ranks"]:
                self.assertEqual((r["state"], r["from_step"]), ("applied", at), r)
        finally:
            truths = self.finish_job(procs, out)
        sums = [truths[r]["param_sum"] for r in range(4)]
        for s in sums[1:]:
            self.assertAlmostEqual(s, sums[0], delta=1e-6 * max(1.0, abs(sums[0])))
        for h in ("a", "b"):
            deadline = time.time() + 120
            while not all(r["session"]["analyzed"] for r in self.cli(h, "job", key)["ranks"]):
                self.assertLess(time.time(), deadline, "the job's sessions were not analysed")
                time.sleep(0.3)
        for h in ("a", "b"):
            check = self.cli(h, "plan-check", "--job", key)
            self.assertEqual(sorted(r["rank"] for r in check["ranks"]), [0, 1, 2, 3])
            for r in check["ranks"]:
                [p] = r["plans"]
                print("asked of host %s, rank %d (on host %s): applied from step %d, predicted %d, "
                      "measured %d (%+.2f %%)" % (h, r["rank"], "a" if r["rank"] < 2 else "b", at,
                                      p["predicted_peak_bytes"], p["measured_peak_bytes"],
                                      100 * p["peak_error"]), file=sys.stderr)
                with self.subTest(daemon=h, rank=r["rank"]):
                    self.assertEqual((p["state"], p["from_step"]), ("applied", at))
                    self.assertGreaterEqual(p["steps_measured"], 2)
                    self.assertLessEqual(abs(p["peak_error"]), 0.05, p)


if __name__ == "__main__":
    unittest.main()
