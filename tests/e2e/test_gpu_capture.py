"""The agent's GPU path without a GPU: a program plays the CUDA driver (it calls the agent's
InitializeInjection, as the driver does for CUDA_INJECTION64_PATH, which `tidemark run` sets) and
a fake libcupti (tests/cupti/fake_cupti.cpp) reports one step of GPU activity through CUPTI's
buffer callbacks. Everything after the records is real: the agent's decoding, its rings and
stream, tidemarkd's ingest and SQLite store, the queries. The test compares the stored tables
with what the fake reported."""
import os
import subprocess
import unittest

from tidemark_env import BIN, DaemonTestCase

PROGRAM = os.path.join(BIN, "tidemark_fake_cuda_program")
FAKE_CUPTI = os.path.abspath(os.path.join(BIN, "..", "lib", "libtidemark_fake_cupti.so"))
FAKE_DRIVER = os.path.abspath(os.path.join(BIN, "..", "lib", "libtidemark_fake_cuda_driver.so"))
MIB = 1 << 20


class GpuCaptureTest(DaemonTestCase):
    def run_program(self, *args, **env):
        r = self.daemon.run(PROGRAM, *args, env=dict(TIDEMARK_CUPTI_LIBRARY=FAKE_CUPTI, **env),
                            timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("done", r.stdout)
        sid = self.daemon.newest_session()["id"]
        self.daemon.wait_analyzed(sid)
        return sid, r.stderr

    def counters(self, sid, name):
        return [v for (v,) in self.daemon.sql(
            "SELECT c.value FROM counter c JOIN string s ON s.session_id = c.session_id AND "
            "s.iid = c.name_id WHERE c.session_id = ? AND s.value = ? ORDER BY c.seq", sid, name)]

    def test_attach_captures_the_gpu_until_detach(self):
        # A running process that uses CUDA (the driver's stand-in is loaded): `tidemark attach`
        # starts the CUPTI capture there; `detach` stops it, so a second step is not recorded.
        env = dict(os.environ, TIDEMARK_CUPTI_LIBRARY=FAKE_CUPTI, TIDEMARK_FAKE_CUDA_DRIVER=FAKE_DRIVER)
        job = subprocess.Popen([PROGRAM, "attach-target"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            self.assertEqual(job.stdout.readline().strip(), "ready")
            attached = self.daemon.cli_json("attach", str(job.pid), "--no-adapter")
            self.assertIn("GPU capture started (CUPTI)", attached["message"])
            self.assertEqual(job.stdout.readline().strip(), "captured")
            self.daemon.cli("detach", str(job.pid))
            job.stdin.write("again\n")
            job.stdin.flush()
            self.assertEqual(job.stdout.readline().strip(), "again done")
            job.stdin.close()
            self.assertEqual(job.wait(timeout=30), 0, job.stderr.read())
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
            job.stdout.close()
            job.stderr.close()
        sid = attached["session"]
        self.daemon.wait_analyzed(sid)
        ops = {o["name"]: o for o in self.daemon.cli_json("ops", str(sid))["ops"]}
        self.assertEqual((ops["sgemm_128x64"]["calls"], ops["sgemm_128x64"]["total_ns"]),
                         (2, 20000))  # one step's two, not the second step's
        self.assertEqual(self.counters(sid, "cupti_dropped_records"), [3])
        blocks = self.daemon.sql(
            "SELECT address, size_bytes, memory_kind FROM allocation WHERE session_id = ? "
            "ORDER BY alloc_seq", sid)
        self.assertEqual(blocks, [(0x7f0000200000, 2 * MIB, 2), (0x7f1000000000, MIB, 2),
                                  (0x5000, 4096, 1), (0x7f2000000000, MIB // 2, 2)])
        # A process without CUDA is attached as before, without the GPU capture.
        plain = subprocess.Popen(["sleep", "30"])
        try:
            attached = self.daemon.cli_json("attach", str(plain.pid), "--no-adapter")
            self.assertIn("no CUDA in the process", attached["message"])
            self.daemon.cli("detach", str(plain.pid))
        finally:
            plain.kill()
            plain.wait()

    def test_tensors_in_segments_reconcile(self):
        # The program plays torch's caching allocator too (its memory reporter's calls): tensors
        # inside the segment the CUPTI callbacks saw reserved. The segment's bytes are the weight
        # (by its tag) and allocator slack; the stream-ordered and raw blocks, which never hold a
        # tensor, were workspace while they lived.
        sid, _ = self.run_program("with-tensors")
        tensors = self.daemon.sql(
            "SELECT address, size_bytes, device, free_seq IS NULL FROM allocation "
            "WHERE session_id = ? AND memory_kind = 3 ORDER BY alloc_seq", sid)
        self.assertEqual(tensors, [(0x7f0000200000, MIB, 0, 1),
                                   (0x7f0000300000, MIB // 4, 0, 0)])
        end = self.daemon.cli_json("breakdown", str(sid), "--at", "end")
        cats = {c: v["bytes"] for c, v in end["categories"].items()}
        self.assertEqual(cats["WEIGHT"], MIB, end)
        self.assertEqual(cats["ALLOCATOR_SLACK"], MIB, end)
        self.assertEqual(cats["ACTIVATION"], 0, end)
        self.assertEqual(end["tracked_bytes"], 2 * MIB + 4096)  # the segment and pinned memory
        self.assertEqual(end["reserved_bytes"], 2 * MIB)  # torch's reserved (the counter)
        # At the peak (all of the scenario's device memory live), every byte has one category.
        peak = self.daemon.cli_json("peak", str(sid))["breakdown"]
        cats = {c: v["bytes"] for c, v in peak["categories"].items()}
        self.assertEqual(sum(cats.values()), peak["tracked_bytes"])
        self.assertEqual(cats["WORKSPACE"], MIB + MIB // 2, peak)
        self.assertEqual(self.counters(sid, "reserved_bytes"), [2 * MIB])

    def test_device_memory_and_host_memory_apart(self):
        # --device: a GPU job's host memory (here the pinned block) and device memory, each alone.
        sid, _ = self.run_program("with-tensors")

        def cats(b):
            return {c: v["bytes"] for c, v in b["categories"].items() if v["bytes"]}

        gpu = self.daemon.cli_json("breakdown", str(sid), "--at", "end", "--device", "cuda")
        self.assertEqual((gpu["tracked_bytes"], gpu["reserved_bytes"]), (2 * MIB, 2 * MIB))
        self.assertEqual(cats(gpu), {"WEIGHT": MIB, "ALLOCATOR_SLACK": MIB})
        host = self.daemon.cli_json("breakdown", str(sid), "--at", "end", "--device", "cpu")
        self.assertEqual((host["tracked_bytes"], host["reserved_bytes"]), (4096, -1))
        # Each side's own peak: every device block live (the segment, the stream-ordered and the
        # raw block), and the pinned block.
        peak = self.daemon.cli_json("peak", str(sid), "--device", "cuda:0")["breakdown"]
        self.assertEqual(peak["tracked_bytes"], 3 * MIB + MIB // 2)
        # A device the session has no memory of: said so (not an empty answer at no moment).
        r = self.daemon.cli("peak", str(sid), "--device", "cuda:1", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("recorded no cuda:1 memory (it has cpu, cuda:0)", r.stderr)
        tl = self.daemon.cli_json("timeline", str(sid), "--device", "cpu", "--buckets", "20")
        self.assertEqual(max(b["max"][0] for b in tl["buckets"]), 4096)
        r = self.daemon.cli("breakdown", str(sid), "--device", "gpu0", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown device 'gpu0' (all, cpu, cuda or cuda:N)", r.stderr)

    def test_one_step_of_gpu_activity_is_stored(self):
        sid, _ = self.run_program()
        # Kernels, copies, fills and syncs: GPU time per name, from CUPTI's start and end.
        ops = {o["name"]: o for o in self.daemon.cli_json("ops", str(sid))["ops"]}
        expected = {"sgemm_128x64": (2, 20000), "nccl_allreduce": (1, 20000),
                    "softmax_fwd": (1, 3000), "elementwise_add": (1, 1000),
                    "[memcpy HtoD]": (1, 1000), "[memset]": (1, 500), "[synchronize]": (1, 500)}
        for name, (calls, total) in expected.items():
            self.assertEqual(ops[name]["kind"], "kernel", name)
            self.assertEqual((ops[name]["calls"], ops[name]["total_ns"]), (calls, total), name)
        # Each kernel tied to its launch (correlation id): launched under "model.layer", which
        # gets the kernels' GPU time.
        for name in ("sgemm_128x64", "nccl_allreduce", "softmax_fwd", "elementwise_add"):
            self.assertEqual(ops[name]["launched_by"], "model.layer", name)
        self.assertEqual(ops["[memcpy HtoD]"]["launched_by"], "")  # its launch was not seen
        self.assertEqual(ops["model.layer"]["gpu_ns"], 20000 + 20000 + 3000 + 1000)
        # ... and to the op open there.
        self.assertEqual((ops["aten::linear"]["kind"], ops["aten::linear"]["gpu_ns"]),
                         ("op", 20000 + 20000 + 3000 + 1000))
        # The NVTX range as an op, its end found by the marker id.
        self.assertEqual((ops["train_step"]["kind"], ops["train_step"]["total_ns"]), ("op", 27000))
        # Kernels are on their streams.
        lanes = dict(self.daemon.sql(
            "SELECT s.value, sc.thread_id FROM scope sc JOIN string s ON s.session_id = "
            "sc.session_id AND s.iid = sc.name_id WHERE sc.session_id = ? AND sc.kind = 2", sid))
        self.assertEqual(lanes["nccl_allreduce"], 13)
        self.assertEqual(lanes["softmax_fwd"], 7)
        # Device memory from the API callbacks, on the calling thread: cudaMalloc's segment stays
        # (its inner cuMemAlloc is not counted twice), the cudaMallocAsync block went back to its
        # pool, cudaMallocHost's pinned block is host memory, a direct cuMemAlloc was freed.
        blocks = self.daemon.sql(
            "SELECT address, size_bytes, memory_kind, device, free_seq IS NULL FROM allocation "
            "WHERE session_id = ? ORDER BY alloc_seq", sid)
        self.assertEqual(blocks, [(0x7f0000200000, 2 * MIB, 2, 0, 1),
                                  (0x7f1000000000, 1 * MIB, 2, 0, 0),
                                  (0x5000, 4096, 1, -1, 1),
                                  (0x7f2000000000, MIB // 2, 2, 0, 0)])
        # ... counted to the module open on that thread when they were allocated.
        peak = self.daemon.cli_json("peak", str(sid))
        modules = {m["name"]: m["bytes"] for m in peak["modules"]}
        self.assertEqual(modules.get("model.layer"), peak["breakdown"]["tracked_bytes"],
                         peak["modules"])
        self.assertEqual(peak["breakdown"]["scope"], "model.layer")
        self.assertEqual(self.counters(sid, "device_reserved_bytes"), [2 * MIB, 3 * MIB, 2 * MIB])
        self.assertEqual(self.counters(sid, "pool_reserved_bytes"), [64 * MIB])
        self.assertEqual(self.counters(sid, "cupti_dropped_records"), [3])
        # One clock: CUPTI's timestamps (from the agent's timestamp callback) fall inside the
        # session's host time.
        s = [x for x in self.daemon.cli_json("sessions")["sessions"] if x["id"] == sid][0]
        for (ts,) in self.daemon.sql(
                "SELECT begin_ts_ns FROM scope WHERE session_id = ? AND kind = 2", sid):
            self.assertTrue(s["start_ts_ns"] <= ts <= s["end_ts_ns"], (ts, s))
        # The end of the session, after its last event: what was still live then.
        end = self.daemon.cli_json("breakdown", str(sid), "--at", "end")
        self.assertEqual(end["tracked_bytes"], 2 * MIB + 4096)
        # The peak: every block but the direct one, freed before the pool block was.
        self.assertEqual(peak["breakdown"]["tracked_bytes"], 3 * MIB + 4096 + MIB // 2)

    def test_a_child_of_the_job_is_not_captured(self):
        r = self.daemon.run(PROGRAM, "with-child", env=dict(TIDEMARK_CUPTI_LIBRARY=FAKE_CUPTI),
                            timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        child = int(r.stdout.split("child ")[1].split()[0])
        pids = [s["pid"] for s in self.daemon.cli_json("sessions")["sessions"]]
        self.assertNotIn(child, pids)  # the child initialized CUDA, but is not the job
        sid = self.daemon.newest_session()["id"]
        self.daemon.wait_analyzed(sid)
        self.assertEqual(self.daemon.sql("SELECT COUNT(*) FROM scope WHERE session_id = ? AND "
                                         "kind = 2", sid), [(8,)])  # the job's own: 7 + 1 sync

    def test_another_cupti_subscriber_keeps_the_slot(self):
        sid, err = self.run_program(FAKE_CUPTI_BUSY="1")
        self.assertIn("another CUPTI subscriber", err)
        self.assertEqual(err.count("another CUPTI subscriber"), 1)  # said once
        # The session is still recorded, without GPU activity.
        self.assertEqual(self.daemon.sql(
            "SELECT COUNT(*) FROM scope WHERE session_id = ? AND kind = 2", sid), [(0,)])


if __name__ == "__main__":
    unittest.main()
