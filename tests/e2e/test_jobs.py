"""Training jobs (docs/jobs.md): the ranks of a data-parallel training (torch.distributed, gloo,
CPU; tests/e2e/ddp_train.py) recorded as one job, each rank a session. Under torch 2 the job runs
under `tidemark run -- torchrun`; under both torches its ranks are also started by the test itself
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, each under `tidemark run`, as cluster launch
scripts start them. (Debian's torch 1.13 torchrun fails on Python 3.11 before it starts a worker:
there the torchrun case is skipped, saying so.) One rank trains on larger batches: the job names
it as the rank that sets the memory need, and its imbalance is the test's own count of the
ranks' peaks."""
import json
import os
import statistics
import time
import subprocess
import sys
import tempfile
import shutil
import unittest

from tidemark_env import BIN, PYTHON, DaemonTestCase, start_ranks, torch_version

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "ddp_train.py")
TIDEMARK = os.path.join(BIN, "tidemark")
STEPS = 4


class JobsTest(DaemonTestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="tidemark-jobs-")

    def tearDown(self):
        shutil.rmtree(self.out, ignore_errors=True)

    def truths(self, world, out=None):
        found = {}
        for r in range(world):
            with open(os.path.join(out or self.out, "rank%d.json" % r)) as f:
                found[r] = json.load(f)
        return found

    def check_job(self, job, world, big_rank, truths):
        ranks = job["ranks"]
        self.assertEqual([r["rank"] for r in ranks], list(range(world)))
        self.assertEqual(job["job"]["ranks_recorded"], world)
        self.assertEqual(job["job"]["world_size"], world)
        self.assertEqual(job["missing_ranks"], [])
        # One session per rank, its own process; the launcher (if any) is none of them.
        sessions = self.daemon.cli_json("sessions")["sessions"]
        in_job = [s for s in sessions if s["job_id"] == job["job"]["id"]]
        self.assertEqual(sorted(s["pid"] for s in in_job),
                         sorted(t["pid"] for t in truths.values()))
        peaks, medians = {}, {}
        for r in ranks:
            truth, sid = truths[r["rank"]], r["session"]["id"]
            self.daemon.wait_ended(sid)
            self.assertEqual(r["session"]["world_size"], world)
            self.assertEqual(r["session"]["local_rank"], r["rank"])
            self.assertEqual(r["steps"], STEPS)
            self.assertFalse(r["failed"] or r["ended_early"])
            # None under torch 1.13, which cannot tell.
            self.assertIn(truth["hooks_between_steps"], (False, None),
                          "the adapter's saved-tensor hooks are off between steps")
            with self.subTest(rank=r["rank"]):
                cats = {k: v["bytes"] for k, v in r["peak"]["categories"].items()}
                self.assertEqual(cats["WEIGHT"], truth["param_bytes"])
                # At the last step's peak the optimizer state exists whole.
                last = self.daemon.cli_json("breakdown", str(sid), "--step", str(STEPS))
                last = {k: v["bytes"] for k, v in last["categories"].items()}
                self.assertEqual(last["WEIGHT"], truth["param_bytes"])
                self.assertEqual(last["OPTIMIZER_STATE"], truth["optimizer_bytes"])
            # The test's own count, from each session's own answers (not the job's).
            peaks[r["rank"]] = self.daemon.cli_json("peak", str(sid))["breakdown"]["tracked_bytes"]
            self.assertEqual(r["peak"]["tracked_bytes"], peaks[r["rank"]])
            steps = self.daemon.cli_json("steps", str(sid))["steps"]
            medians[r["rank"]] = statistics.median_low(
                [s["end_ts_ns"] - s["begin_ts_ns"] for s in steps])
            self.assertEqual(r["median_step_ns"], medians[r["rank"]])
        self.assertEqual(job["memory_rank"], big_rank)
        self.assertEqual(max(peaks, key=peaks.get), big_rank)
        self.assertGreater(peaks[big_rank], 1.2 * min(peaks.values()), "the batch is 32x larger")
        self.assertAlmostEqual(job["peak_imbalance"], max(peaks.values()) / min(peaks.values()),
                               places=5)
        self.assertAlmostEqual(job["step_time_imbalance"],
                               max(medians.values()) / min(medians.values()), places=5)

    def test_ranks_started_by_a_launch_script_are_one_job(self):
        world, big = 2, 1
        port, _ = start_ranks(self.daemon, self.out, world, big, steps=STEPS)
        truths = self.truths(world)
        jobs = self.daemon.cli_json("jobs")["jobs"]
        key = "127.0.0.1:%d" % port
        mine = [j for j in jobs if j["key"] == key]
        self.assertEqual(len(mine), 1, jobs)
        job = self.daemon.cli_json("job", key)  # by its key
        self.assertEqual(job["job"]["id"], mine[0]["id"])
        self.check_job(job, world, big, truths)
        # The table names the rank that sets the memory need.
        text = self.daemon.cli("job", str(mine[0]["id"])).stdout
        self.assertIn("the job's memory need is set by rank %d" % big, text)
        # The job trained as it does without tidemark.
        plain = tempfile.mkdtemp(prefix="tidemark-jobs-plain-")
        try:
            start_ranks(self.daemon, plain, world, big, steps=STEPS, under_tidemark=False)
            for r in range(world):
                with open(os.path.join(plain, "rank%d.json" % r)) as f:
                    self.assertEqual(json.load(f)["losses"], truths[r]["losses"])
        finally:
            shutil.rmtree(plain, ignore_errors=True)

    def test_torchrun_ranks_are_one_job_and_the_launcher_none(self):
        if torch_version() < (2, 0):
            self.skipTest("Debian's torch 1.13 torchrun fails on Python 3.11 before it starts a "
                          "worker; the ranks are started by the test instead (the test above)")
        torchrun = os.path.join(os.path.dirname(PYTHON), "torchrun")
        before = {s["id"] for s in self.daemon.cli_json("sessions")["sessions"]}
        r = subprocess.run([TIDEMARK, "--server", self.daemon.address, "run", "--", torchrun,
                            "--standalone", "--nproc_per_node=4", TRAIN, "--steps", str(STEPS),
                            "--out-dir", self.out, "--big-rank", "3", "--big-batch", "1024"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("events sent to"), 4, r.stderr)  # a line per rank
        truths = self.truths(4)
        new = [s for s in self.daemon.cli_json("sessions")["sessions"] if s["id"] not in before]
        self.assertEqual(len(new), 4, "the ranks, not torchrun: %s" % [s["pid"] for s in new])
        self.assertEqual(len({s["job_id"] for s in new}), 1)
        job = self.daemon.cli_json("job", str(new[0]["job_id"]))
        self.assertNotEqual(job["job"]["key"], "none")  # torchrun's run id
        self.check_job(job, 4, 3, truths)

    def test_one_plan_on_every_rank_from_one_step(self):
        # A data-parallel job (DistributedDataParallel, the examples' GPT, 4 ranks started by the
        # test): a plan made from the running job (its memory need's rank) goes to every rank and
        # all switch at the same step, training on with the losses of the job without tidemark
        # (the gradients all-reduced under recomputed blocks); each rank measures the predicted
        # peak.
        # On a loaded 2-core machine (the test command runs two suites at once) the ranks ran
        # ~25 steps while the plan was made and sent (with 30 it came at step 28), and the step
        # chosen is 5 s and twice the time reading the ranks took further, at the fastest rank's
        # pace: ~200 ms a step under torch 2 (step 30 unloaded here), so 100 steps; torch 1.13's
        # steps are several times slower (step 12), and 60 leave room.
        steps, world = (100 if torch_version() >= (2, 0) else 60), 4
        plain = tempfile.mkdtemp(prefix="tidemark-jobs-plain-")
        try:
            start_ranks(self.daemon, plain, world, steps=steps, model="gpt",
                        under_tidemark=False)
            base = self.truths(world, plain)
        finally:
            shutil.rmtree(plain, ignore_errors=True)
        port, ranks = start_ranks(self.daemon, self.out, world, steps=steps, model="gpt",
                                  wait=False)
        name = "127.0.0.1:%d" % port
        try:
            deadline = time.time() + 300
            while time.time() < deadline:
                live = [s for s in self.daemon.cli_json("sessions")["sessions"]
                        if s["state"] == "live" and s["job_id"] != 0 and s["steps"] >= 3]
                if len(live) == world:
                    break
                time.sleep(0.2)
            self.assertEqual(len(live), world, "the ranks did not run 3 steps each")
            plan = os.path.join(self.out, "plan.json")
            # (At 70 % the optimal plan mixes selective and whole-block recomputation, one of
            # near-equal shapes; some of them are predicted ~10 % high: an advisor matter, not
            # the job's. At 50 % the plan is one: blocks 0-2 recomputed.)
            # A daemon busy with four ranks on a small machine may not hand a live rank's rows
            # to the store within the loader's wait: it says "ask again" (exit 3), and so does this.
            for _ in range(3):
                r = self.daemon.cli("plan", "--job", name, "--budget", "50%", "--out", plan,
                                    check=False)
                if not (r.returncode == 3 and "ask again" in r.stderr):
                    break
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("the rank that sets the job's memory need", r.stderr)
            r = self.daemon.cli("apply", "--job", name, plan, "--json")
            applied = json.loads(r.stdout)
            at = applied["at_step"]
            self.assertLess(at, steps - 2, "applied too late to measure")
            self.assertEqual(len(applied["ranks"]), world)
            for rank in applied["ranks"]:
                self.assertEqual((rank["state"], rank["from_step"]), ("applied", at), rank)
            for p in ranks:
                _, err = p.communicate(timeout=600)
                self.assertEqual(p.returncode, 0, err)
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
        got = self.truths(world)
        for r in range(world):
            self.assertEqual(len(got[r]["losses"]), steps)
            for a, b in zip(got[r]["losses"], base[r]["losses"]):
                self.assertAlmostEqual(a, b, delta=1e-5 * max(1.0, abs(b)))
        for s in live:
            self.daemon.wait_analyzed(s["id"])
        check = self.daemon.cli_json("plan-check", "--job", name)
        self.assertEqual(len(check["ranks"]), world)
        with open(plan) as f:
            made = json.load(f)
        for rank in check["ranks"]:
            [p] = rank["plans"]
            print("job plan from step %d of session %s (%s), rank %d, applied from step %d of %d: "
                  "predicted %d, measured %d (%+.2f %%)"
                  % (made["source"]["step"], made["source"]["session"],
                     "; ".join(",".join(g["modules"]) for g in made["segments"]
                               if g["mode"] != "store"),
                     rank["rank"], at, steps, p["predicted_peak_bytes"],
                     p["measured_peak_bytes"], 100 * p["peak_error"]), file=sys.stderr)
            self.assertEqual((p["state"], p["from_step"]), ("applied", at))
            self.assertGreaterEqual(p["steps_measured"], 2)
            self.assertLessEqual(abs(p["peak_error"]), 0.05, p)
        # Bad input: a job without running ranks, an unknown one.
        r = self.daemon.cli("apply", "--job", name, plan, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("has no running rank", r.stderr)
        r = self.daemon.cli("plan", "--job", "no-such-job", "--budget", "70%", check=False)
        self.assertEqual(r.returncode, 1)

    def test_processes_named_into_one_job(self):
        before = {s["id"] for s in self.daemon.cli_json("sessions")["sessions"]}
        code = "import torch; x = torch.ones(1000)"
        for _ in range(2):
            r = subprocess.run([TIDEMARK, "--server", self.daemon.address, "run", "--job",
                                "sweep-7", "--", PYTHON, "-c", code], capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
        r = self.daemon.run(PYTHON, "-c", code)  # no job
        self.assertEqual(r.returncode, 0, r.stderr)
        job = self.daemon.cli_json("job", "sweep-7")
        self.assertEqual(job["job"]["ranks_recorded"], 2)
        self.assertEqual([x["rank"] for x in job["ranks"]], [-1, -1])
        self.assertEqual(job["job"]["world_size"], 0)
        new = [s for s in self.daemon.cli_json("sessions")["sessions"] if s["id"] not in before]
        self.assertEqual(sorted(s["job_id"] for s in new),
                         [0, job["job"]["id"], job["job"]["id"]])
        # Bad input: an unknown job, a name too long.
        r = self.daemon.cli("job", "no-such-job", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job with the key 'no-such-job'", r.stderr)
        r = self.daemon.cli("run", "--job", "x" * 300, "--", PYTHON, "-c", "pass", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--job needs a name of 1 to 256 bytes", r.stderr)


if __name__ == "__main__":
    unittest.main()
