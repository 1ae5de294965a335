"""`tidemark attach` / `tidemark detach` on real processes started without tidemark: a CPU
training attached mid-run trains exactly as without, its breakdown after the attach is exact for
WEIGHT and OPTIMIZER_STATE, attach and detach repeat, and every error leaves the target as it was."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest

from tidemark_env import BIN, DaemonTestCase, PYTHON, SOURCE, torch_version

TRAIN = os.path.join(SOURCE, "examples", "train.py")
LIB = os.path.join(BIN, "..", "lib")


def parse_run(text):
    """(losses as printed, parameter bytes, optimizer state bytes) of examples/train.py's output."""
    losses = re.findall(r"^step (\d+) loss (\S+)", text, re.M)
    params = int(re.search(r"parameters, (\d+) bytes", text).group(1))
    state = int(re.search(r"^optimizer state: (\d+) bytes", text, re.M).group(1))
    return losses, params, state


def thread_names(pid, wanted, timeout=10):
    """The names of process pid's threads, read until they include `wanted` or timeout passes (a
    thread just started may not have named itself yet; one may end while they are read)."""
    deadline = time.time() + timeout
    while True:
        names = set()
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    names.add(f.read().strip())
            except OSError:
                pass
        if wanted <= names or time.time() > deadline:
            return names
        time.sleep(0.05)


def _allow_core_files():
    """In the job's child before exec: core files as large as the hard limit allows."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


class Job:
    """examples/train.py (or any command), started without tidemark."""

    def __init__(self, *args, command=None):
        # A job that dies of a signal says where its Python threads were (faulthandler), in what
        # fate() reports: an attach that killed a job once (SIGSEGV, the sixth attach of twenty
        # under torch 2) left only its exit status.
        # And it may leave a core file, whose native stacks fate() reads with gdb where it can.
        self.proc = subprocess.Popen(command or [PYTHON, "-u", TRAIN, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONFAULTHANDLER="1"),
                                     preexec_fn=_allow_core_files)
        self.out = []

    @property
    def pid(self):
        return self.proc.pid

    def wait_for_step(self, n, timeout=300):
        self.wait_for(r"^step %d " % n, "step %d" % n, timeout)

    def wait_for(self, pattern, what, timeout=300):
        """Reads the job's output until a line matches `pattern`. Straight from the pipe (no
        buffered reader): what follows stays in the pipe for finish()'s communicate(), which
        reads the descriptor itself."""
        deadline = time.time() + timeout
        fd = self.proc.stdout.fileno()
        while time.time() < deadline:
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                raise AssertionError("the job ended before %s: %s" % (what, self.proc.stderr.read()))
            self.out.append(chunk)
            if re.search(pattern, "".join(self.out), re.M):
                return
        raise AssertionError("no %s within %d s" % (what, timeout))

    def finish(self, timeout=600):
        out, err = self.proc.communicate(timeout=timeout)
        self.out.append(out)
        return self.proc.returncode, "".join(self.out), err

    def fate(self):
        """For a failure's message: whether the job still runs a moment later (with its threads'
        states: a zombie main thread beside live ones is a job dying, or one whose main thread
        ended), else its exit and last words."""
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            return "; the job still runs (threads: %s)" % self.thread_states()
        return "; the job ended with %d: %s%s" % (self.proc.returncode,
                                                  self.proc.stderr.read()[-6000:],
                                                  self.native_stacks())

    def native_stacks(self):
        """The native stacks of the threads of a job that dumped core (the kernel's core_pattern
        "core" or "core.PID" in this directory), read by gdb; "" where there is no core or no
        gdb. The core file is removed."""
        for name in ("core.%d" % self.pid, "core"):
            if not os.path.exists(name):
                continue
            try:
                r = subprocess.run(["gdb", "-batch", "-nx", "-ex", "thread apply all bt 12",
                                    PYTHON, name], capture_output=True, text=True, timeout=120)
                return "\nnative stacks (gdb):\n" + r.stdout[-8000:]
            except (OSError, subprocess.TimeoutExpired):
                return ""
            finally:
                os.unlink(name)
        return ""

    def thread_states(self):
        states = []
        task = "/proc/%d/task" % self.pid
        for tid in sorted(os.listdir(task), key=int)[:24] if os.path.isdir(task) else []:
            try:
                with open("%s/%s/stat" % (task, tid)) as f:
                    name, rest = f.read().rsplit(")", 1)
                states.append("%s %s %s" % (tid, name.split("(", 1)[1], rest.split()[0]))
            except (OSError, IndexError):
                pass
        return ", ".join(states) or "none"

    def kill(self):
        died = self.proc.poll() is not None and self.proc.returncode < 0  # of itself, not of us
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if not pipe.closed:
                pipe.close()
        if died:
            self.native_stacks()  # a core file a failure did not read is not left behind


class AttachTest(DaemonTestCase):
    def cli(self, *args):
        """(exit code, --json answer, stderr) of `tidemark ARGS --json`."""
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.daemon.address, *args,
                            "--json"], capture_output=True, text=True, timeout=300)
        return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else None), r.stderr

    def reference(self, *args):
        r = subprocess.run([PYTHON, TRAIN, *args], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        return parse_run(r.stdout)

    def attach_mid_run(self, args, *attach_args):
        """examples/train.py ARGS, attached at its step 2 with ATTACH_ARGS and run to its end:
        its losses are those of a run without tidemark. (session id, the job's stderr) once the
        session is analysed."""
        ref_losses, _, _ = self.reference(*args)
        job = Job(*args)
        try:
            job.wait_for_step(2)
            rc, a, err = self.cli("attach", str(job.pid), *attach_args)
            self.assertEqual(rc, 0, err)
            rc, out, err = job.finish()
        finally:
            job.kill()
        self.assertEqual(rc, 0, err)
        self.assertEqual(parse_run(out)[0], ref_losses)
        sid = a["session"]
        self.wait_ended(sid)
        self.daemon.wait_analyzed(sid)
        return sid, err

    def wait_ended(self, sid, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = [s for s in self.daemon.cli_json("sessions")["sessions"] if s["id"] == sid]
            if s and s[0]["state"] != "live":
                return s[0]
            time.sleep(0.2)
        raise AssertionError("session %d still live" % sid)

    def test_attached_mid_run_trains_identically_and_breaks_down_exactly(self):
        args = ("--steps", "9", "--seed", "5")
        ref_losses, params, state = self.reference(*args)
        job = Job(*args)
        try:
            job.wait_for_step(3)
            rc, a, err = self.cli("attach", str(job.pid), "--name", "attached")
            self.assertEqual(rc, 0, err)
            self.assertTrue(a["loaded_now"])
            self.assertTrue(a["python_adapter"], a)
            self.assertGreater(a["patched_entries"], 0)
            sid = a["session"]
            self.assertGreater(sid, 0)
            # A second attach is refused; the job goes on.
            rc, e, err = self.cli("attach", str(job.pid))
            self.assertEqual(rc, 1)
            self.assertEqual(e["reason"], "already_attached")
            self.assertIn("already attached (session %d)" % sid, err)
            rc, out, err = job.finish()
        finally:
            job.kill()
        self.assertEqual(rc, 0, err)
        losses, _, _ = parse_run(out)
        self.assertEqual(losses, ref_losses)  # exactly: the same digits, every step
        session = self.wait_ended(sid)
        self.assertEqual(session["name"], "attached")
        self.assertGreaterEqual(session["steps"], 4)  # the steps after the attach
        self.daemon.wait_analyzed(sid)
        # The peak of the last step (the session's own may come in the step the attach landed
        # in, whose saved tensors nobody tagged: docs/attach.md).
        last = self.daemon.cli_json("steps", str(sid))["steps"][-1]["step"]
        b = self.daemon.cli_json("breakdown", str(sid), "--step", str(last))
        cats = {k: v["bytes"] for k, v in b["categories"].items()}
        self.assertEqual(cats["WEIGHT"], params)
        self.assertEqual(cats["OPTIMIZER_STATE"], state)
        # At the peak (in a backward) every gradient is there under torch 1.13, whose zero_grad
        # keeps them, and only those made so far under torch 2's, which frees them.
        self.assertLessEqual(cats["GRADIENT"], params)
        self.assertGreater(cats["GRADIENT"], 0)
        self.assertGreater(cats["ACTIVATION"], 0)
        # At the end of each recorded step (right after the optimizer) all of them, under both.
        for s in self.daemon.cli_json("steps", str(sid))["steps"]:
            b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
            end = {k: v["bytes"] for k, v in b["categories"].items()}
            self.assertEqual((end["WEIGHT"], end["GRADIENT"], end["OPTIMIZER_STATE"]),
                             (params, params, state), "end of step %d" % s["step"])

    def test_attach_with_op_scopes(self):
        """`tidemark attach --ops`: torch 2's ops become op scopes from the attach on (the job's
        losses unchanged); torch 1.13 says it cannot and records the rest."""
        sid, err = self.attach_mid_run(("--steps", "12", "--seed", "3", "--layers", "2"), "--ops")
        ops = {o["name"]: o["calls"] for o in self.daemon.cli_json("ops", str(sid))["ops"]
               if o["kind"] == "op"}
        if torch_version() >= (2, 0):
            self.assertGreater(ops.get("aten::addmm", 0), 0, ops)
        else:
            self.assertEqual(ops, {})
            self.assertIn("tidemark: op scopes are off: op scopes need torch 2", err)

    def test_attach_with_a_capture_schedule(self):
        """`tidemark attach --steps 2-3`: the steps counted from the attach; steps 2-3 in full
        detail, the others summarized (the job's losses unchanged, nothing counted lost)."""
        # 30 steps: on a busy machine the attach has landed as late as the job's step 7.
        sid, _ = self.attach_mid_run(("--steps", "30", "--seed", "5", "--layers", "2"),
                                     "--steps", "2-3")
        steps = {s["step"]: s for s in self.daemon.cli_json("steps", str(sid))["steps"]}
        self.assertGreaterEqual(len(steps), 4, steps.keys())
        self.assertEqual(sorted(n for n, s in steps.items() if not s["summarized"]), [2, 3])
        for n, s in steps.items():
            self.assertGreater(s["peak"]["tracked_bytes"], 0, n)
        stats = dict(self.daemon.sql("SELECT name, value FROM stat WHERE session_id = ?", sid))
        self.assertGreater(stats.get("events_summarized", 0), 0)
        self.assertEqual(stats.get("seq_gap", 0), 0)
        self.assertEqual(stats.get("free_of_untracked", 0), 0)

    def test_detach_and_attach_again_twenty_times(self):
        args = ("--steps", "3000", "--seed", "2", "--layers", "2", "--d-model", "32",
                "--seq-len", "16", "--batch", "2", "--checkpoint", "")
        ref_losses, params, _ = self.reference(*args)
        job = Job(*args)
        sessions = []
        try:
            job.wait_for_step(2)
            for cycle in range(20):
                rc, a, err = self.cli("attach", str(job.pid))
                if rc != 0:  # (the job's fate is read only then: it waits a moment)
                    self.fail("attach %d: %s%s" % (cycle, err, job.fate()))
                self.assertEqual(a["loaded_now"], cycle == 0)
                sessions.append(a["session"])
                time.sleep(0.1)
                rc, d, err = self.cli("detach", str(job.pid))
                if rc != 0:
                    self.fail("detach %d: %s%s" % (cycle, err, job.fate()))
                self.assertEqual(d["session"], a["session"])
            # Detached: detaching again is refused.
            rc, e, err = self.cli("detach", str(job.pid))
            self.assertEqual(rc, 1)
            self.assertIn("is not attached", err)
            rc, out, err = job.finish()
        finally:
            job.kill()
        self.assertEqual(rc, 0, err)
        self.assertEqual(parse_run(out)[0], ref_losses)
        self.assertNotIn("Warning", err)  # nothing the job would not have said anyway
        self.assertEqual(len(set(sessions)), 20, sessions)
        for sid in sessions:
            s = self.wait_ended(sid)
            self.assertGreater(s["events_stored"], 0)
            self.assertGreater(s["blocks"], 0)
        # Each attach seeded the weights again: every session holds them all.
        self.daemon.wait_analyzed(sessions[-1])
        b = self.daemon.cli_json("breakdown", str(sessions[-1]))
        self.assertEqual(b["categories"]["WEIGHT"]["bytes"], params)

    def test_attach_while_backward_replaces_the_gradients(self):
        """A job whose backward is running most of the time, setting 2,000 gradients anew each
        step: attached and detached 10 times it trains exactly as without (an attach thread that
        read each parameter's .grad while the backward replaced it killed the job with SIGSEGV),
        and every session's steps end with all 2,000 gradients in GRADIENT (a step the job
        began while the attach was seeding ended without those it held: the hooks stay off until
        the attach is done)."""
        churn = os.path.join(SOURCE, "tests", "e2e", "gradient_churn_train.py")
        scratch = tempfile.mkdtemp(prefix="tidemark-churn-")
        self.addCleanup(shutil.rmtree, scratch, ignore_errors=True)
        stop = os.path.join(scratch, "stop")
        job = Job(command=[PYTHON, "-u", churn, "--steps", "100000", "--stop-file", stop])
        sessions = []
        try:
            job.wait_for_step(2)
            for cycle in range(int(os.environ.get("TIDEMARK_TEST_CYCLES", "10"))):
                rc, a, err = self.cli("attach", str(job.pid))
                if rc != 0:
                    self.fail("attach %d: %s%s" % (cycle, err, job.fate()))
                sessions.append(a["session"])
                job.wait_for(r"^step \d+ ", "a step", 120)  # (at least one more step begun)
                time.sleep(0.3)
                rc, d, err = self.cli("detach", str(job.pid))
                if rc != 0:
                    self.fail("detach %d: %s%s" % (cycle, err, job.fate()))
            open(stop, "w").close()
            rc, out, err = job.finish()
        finally:
            job.kill()
        self.assertEqual(rc, 0, err)
        losses = re.findall(r"^step \d+ loss \S+", out, re.M)
        reference = subprocess.run([PYTHON, "-u", churn, "--steps", str(len(losses))],
                                   capture_output=True, text=True, timeout=600)
        self.assertEqual(reference.returncode, 0, reference.stderr)
        self.assertEqual(losses, re.findall(r"^step \d+ loss \S+", reference.stdout, re.M))
        gradients = 2000 * 8 * 4
        ended, wrong = 0, []
        for sid in sessions:
            self.wait_ended(sid)
            self.daemon.wait_analyzed(sid)
            for s in self.daemon.cli_json("steps", str(sid))["steps"]:
                # A session attached and detached inside one step has none: 104 steps were once
                # inferred in one from the 2,000 parameters' identical terms, none with gradients.
                self.assertFalse(s["inferred"], (sid, s["step"]))
                if not s.get("end_ts_ns"):  # the step the detach cut short
                    continue
                ended += 1
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
                if b["categories"]["GRADIENT"]["bytes"] != gradients:
                    wrong.append((sid, s["step"], {k: v["bytes"]
                                                   for k, v in b["categories"].items() if v}))
        self.assertEqual(wrong, [], "of %d steps" % ended)
        self.assertGreater(ended, 0)

    def test_threads_allocating_through_the_attach_lose_no_free(self):
        """A native program whose 4 threads allocate and free without pause, attached and
        detached five times while they run: every block a session saw allocated it saw freed,
        but for one per thread in flight at the detach. (Patching the allocator's entries before
        `free`'s let blocks be allocated through the hook and freed around it: live for ever in
        the recording, their addresses allocated again over them.)"""
        job = subprocess.Popen([os.path.join(BIN, "tidemark_churn_program")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sessions = []
        try:
            self.assertEqual(job.stdout.readline().strip(), "ready")
            for cycle in range(5):
                rc, a, err = self.cli("attach", str(job.pid), "--no-adapter")
                self.assertEqual(rc, 0, "attach %d: %s" % (cycle, err))
                sessions.append(a["session"])
                if cycle == 0:  # the agent's threads say whose they are (top, gdb, py-spy)
                    self.assertLessEqual({"tidemark-drain", "tidemark-send"},
                                         thread_names(job.pid, {"tidemark-drain", "tidemark-send"}))
                time.sleep(0.3)
                rc, _, err = self.cli("detach", str(job.pid))
                self.assertEqual(rc, 0, "detach %d: %s" % (cycle, err))
            out, err = job.communicate("", timeout=60)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        self.assertEqual(job.returncode, 0, err)
        self.assertRegex(out, r"\d+ pairs")
        for sid in sessions:
            self.wait_ended(sid)
            blocks, never_freed = self.daemon.sql(
                "SELECT COUNT(*), COUNT(*) - COUNT(free_seq) FROM allocation WHERE session_id = ?",
                sid)[0]
            stats = dict(self.daemon.sql("SELECT name, value FROM stat WHERE session_id = ?", sid))
            self.assertGreater(blocks, 1000, sid)  # the threads were recorded
            self.assertEqual(stats.get("alloc_over_live", 0), 0, (sid, stats))
            self.assertLessEqual(never_freed, 4, (sid, blocks, stats))

    def test_errors_leave_the_target_untouched(self):
        sleeper = Job(command=["sleep", "120"])
        try:
            # No such process: one that has just ended.
            gone = subprocess.Popen(["true"])
            gone.wait()
            rc, e, err = self.cli("attach", str(gone.pid))
            self.assertEqual((rc, e["reason"]), (1, "no_such_process"), err)
            self.assertIn("no process %d" % gone.pid, err)
            # Not attached: detach refuses.
            rc, e, err = self.cli("detach", str(sleeper.pid))
            self.assertEqual(rc, 1)
            self.assertIn("is not attached", err)
            # Bad usage.
            rc, _, err = self.cli("attach", "twelve")
            self.assertEqual(rc, 2)
            self.assertIn("not a process id", err)
            # No tidemarkd: nothing is touched.
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", "127.0.0.1:1", "attach",
                                str(sleeper.pid)], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 3, r.stderr)
            with open("/proc/%d/maps" % sleeper.pid) as maps:
                self.assertNotIn("libtidemark_agent", maps.read())
            self.assertIsNone(sleeper.proc.poll())
        finally:
            sleeper.kill()

    def test_target_exiting_during_the_attach(self):
        sleeper = Job(command=["sleep", "120"])
        try:
            time.sleep(0.2)
            rc, e, err = self.cli("attach", str(sleeper.pid), "--agent",
                                  os.path.join(LIB, "libtidemark_test_exit_on_load.so"))
            self.assertEqual((rc, e["reason"]), (1, "exited"), err)
            self.assertIn("exited during the attach (status 7)", err)
            self.assertEqual(sleeper.proc.wait(timeout=30), 7)
        finally:
            sleeper.kill()

    def test_a_job_under_tidemark_run_is_recorded_already(self):
        # Attached as soon as the agent is mapped, several times: the loader maps it before its
        # constructor marks the job as recorded (an attach there once went on into the starting
        # process); attach waits for the mark.
        for _ in range(5):
            job = Job(command=[os.path.join(BIN, "tidemark"), "--server", self.daemon.address,
                               "run", "--", "sleep", "120"])
            try:
                # `tidemark run` execs the command: the pid is the job's.
                deadline = time.time() + 30
                while True:
                    with open("/proc/%d/maps" % job.pid) as maps:
                        if "libtidemark_agent" in maps.read():
                            break
                    self.assertLess(time.time(), deadline)
                    time.sleep(0.002)
                rc, e, err = self.cli("attach", str(job.pid))
                self.assertEqual((rc, e.get("reason")), (1, "already_attached"), (e, err))
                self.assertIn("runs under `tidemark run`", err)
                rc, e, err = self.cli("detach", str(job.pid))
                self.assertEqual(rc, 1)
                self.assertIn("records until it exits", err)
                self.assertIsNone(job.proc.poll())
            finally:
                job.kill()

    def test_not_permitted(self):
        if os.geteuid() == 0:
            # Root without CAP_SYS_PTRACE may not trace another user's process.
            target = Job(command=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                  "sleep", "120"])
            prefix = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]
        else:
            # Not root: a process of another user (init, as a rule).
            if os.stat("/proc/1").st_uid == os.geteuid():
                self.skipTest("no process of another user to try")
            target, prefix = None, []
        pid = target.pid if target else 1
        try:
            time.sleep(0.2)
            r = subprocess.run(prefix + [os.path.join(BIN, "tidemark"), "--server",
                                         self.daemon.address, "attach", str(pid), "--json"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(json.loads(r.stdout)["reason"], "not_permitted", r.stderr)
            self.assertIn("CAP_SYS_PTRACE", r.stderr)
            if target:
                self.assertIsNone(target.proc.poll())
        finally:
            if target:
                target.kill()

    def test_unsupported_architecture(self):
        # A 32-bit x86 program, written here: it loops on pause().
        code = bytes([0xb8, 0x1d, 0, 0, 0, 0xcd, 0x80, 0xeb, 0xf7])  # mov eax,29; int 0x80; jmp
        base, off = 0x08048000, 52 + 32
        ehdr = (b"\x7fELF\x01\x01\x01" + b"\0" * 9 +
                struct.pack("<HHIIIIIHHHHHH", 2, 3, 1, base + off, 52, 0, 0, 52, 32, 1, 0, 0, 0))
        phdr = struct.pack("<IIIIIIII", 1, 0, base, base, off + len(code), off + len(code), 5,
                           0x1000)
        path = os.path.join(tempfile.mkdtemp(prefix="tidemark-i386-"), "pause32")
        with open(path, "wb") as f:
            f.write(ehdr + phdr + code)
        os.chmod(path, 0o755)
        try:
            prog = subprocess.Popen([path])
        except OSError as e:  # a kernel without 32-bit support cannot run it at all
            self.skipTest("this kernel cannot run 32-bit x86 programs: %s" % e)
        try:
            time.sleep(0.2)
            if prog.poll() is not None:
                self.skipTest("this kernel cannot run 32-bit x86 programs")
            rc, e, err = self.cli("attach", str(prog.pid))
            self.assertEqual((rc, e["reason"]), (1, "unsupported"), err)
            self.assertIn("32-bit x86 program", err)
            self.assertIsNone(prog.poll())
        finally:
            prog.send_signal(signal.SIGKILL)
            prog.wait()


if __name__ == "__main__":
    unittest.main()
