"""`tidemark run --stacks`: the Python stack of each allocation of at least the threshold is
recorded with it and shown by `tidemark block` — innermost first, each frame's function, file and
line as the script has them (lines marked `# at: NAME` in stacks_train.py): two calls deep, in a
model's forward under torch's module call, on a thread the script started; an allocation below the
threshold has none, and so has every allocation of a run without --stacks. The training's losses
are those of a run without tidemark. A script with a profiler of its own keeps it: told once, its
allocations go without stacks, the job trains on."""
import json
import os
import re
import subprocess
import unittest

from tidemark_env import BIN, PYTHON, Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "stacks_train.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def marked_lines():
    """NAME -> line number of the line marked `# at: NAME`."""
    lines = {}
    with open(SCRIPT) as f:
        for n, text in enumerate(f, 1):
            m = re.search(r"# at: (\S+)", text)
            if m:
                lines[m.group(1)] = n
    return lines


def losses(text):
    return re.findall(r"^step \d+ loss (\S+)$", text, re.M)


class StacksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.at = marked_lines()
        cls.plain = subprocess.run([PYTHON, SCRIPT], capture_output=True, text=True,
                                   timeout=300, env=ENV)
        cls.runs = {}
        for name, options in (("stacks", ["--stacks"]), ("none", []),
                              ("min", ["--stacks", "--stacks-min", "2MiB"])):
            cls.runs[name] = cls.record(options)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    @classmethod
    def record(cls, options, *script_args):
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", cls.daemon.address, "run",
                            *options, "--", PYTHON, SCRIPT, *script_args], capture_output=True,
                           text=True, timeout=300, env=ENV)
        if r.returncode != 0:
            raise AssertionError("the training failed (%d): %s" % (r.returncode, r.stderr))
        session = cls.daemon.newest_session()
        addresses = json.loads(r.stdout.strip().splitlines()[-1])
        return {"session": session["id"], "dropped": session["events_dropped"],
                "addresses": addresses, "stdout": r.stdout, "stderr": r.stderr}

    def frames(self, run, what):
        """The frames of the last block at what's address (the tensor the script kept)."""
        out = self.daemon.cli_json("block", str(run["session"]), str(run["addresses"][what]))
        return out["blocks"][-1]["frames"]

    def frame(self, function, mark):
        return "%s (%s:%d)" % (function, SCRIPT, self.at[mark])

    def test_the_stacks_name_the_lines_that_allocated(self):
        run = self.runs["stacks"]
        self.assertEqual(self.frames(run, "nested"),
                         [self.frame("make", "make"), self.frame("nested", "nested"),
                          self.frame("main", "main-nested"), self.frame("<module>", "module")])
        forward = self.frames(run, "forward")
        self.assertEqual(forward[0], self.frame("Net.forward", "forward"))
        self.assertIn(self.frame("main", "main-forward"), forward)
        self.assertEqual(forward[-1], self.frame("<module>", "module"))
        # torch's module call between them, as the interpreter ran it.
        between = forward[1:forward.index(self.frame("main", "main-forward"))]
        self.assertTrue(between and all("torch" in f for f in between), forward)
        thread = self.frames(run, "thread")
        self.assertEqual(thread[:3], [self.frame("make", "make"), self.frame("nested", "nested"),
                                      self.frame("on_thread", "thread")])
        self.assertIn("Thread.run", thread[3])

    def test_a_block_made_in_backward_has_the_line_that_called_it_and_no_adapter_frame(self):
        lives = self.daemon.cli_json("block", str(self.runs["stacks"]["session"]),
                                     str(self.runs["stacks"]["addresses"]["grad"]))["blocks"]
        grads = [b for b in lives if b["phase"] == "backward" and b["size_bytes"] == 4 << 17]
        self.assertTrue(grads, lives)
        frames = grads[-1]["frames"]
        self.assertIn(self.frame("main", "main-backward"), frames)
        self.assertTrue(any("torch" in f for f in frames[:frames.index(
            self.frame("main", "main-backward"))]), frames)
        # The adapter wraps torch.autograd.backward: its frames are left out.
        package = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python", "tidemark")
        self.assertFalse([f for f in frames if package in f or "tidemark_backward" in f], frames)

    def test_below_the_threshold_and_without_the_option_there_is_no_stack(self):
        self.assertEqual(self.frames(self.runs["stacks"], "small"), [])  # 400 bytes < 64 KiB
        for what in ("nested", "forward", "thread", "small", "grad"):
            self.assertEqual(self.frames(self.runs["none"], what), [], what)
        # --stacks-min 2MiB: the 1 MiB tensor goes without, the job as before.
        self.assertEqual(self.frames(self.runs["min"], "nested"), [])
        rows = self.daemon.sql("SELECT COUNT(*) FROM stack WHERE session_id = ?",
                               self.runs["none"]["session"])
        self.assertEqual(rows[0][0], 0)

    def test_the_training_is_the_one_without_tidemark(self):
        self.assertEqual(self.plain.returncode, 0, self.plain.stderr)
        self.assertEqual(len(losses(self.plain.stdout)), 3)
        for name, run in self.runs.items():
            self.assertEqual(losses(run["stdout"]), losses(self.plain.stdout), name)
            self.assertNotIn("--stacks:", run["stderr"], name)
            self.assertEqual(run["dropped"], 0, name)

    def test_a_bad_threshold_is_a_usage_error(self):
        for bad in ("12%", "0", "lots", "-5"):
            r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.daemon.address,
                                "run", "--stacks-min", bad, "--", PYTHON, "-c", "pass"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("bad --stacks-min '%s'" % bad, r.stderr)

    def run_with_own_profiler(self, option, why):
        """The script's run with a profiler of its own: it trains as without tidemark and is
        told once why some allocations go without their stack."""
        run = self.record(["--stacks"], option)
        self.assertEqual(losses(run["stdout"]), losses(self.plain.stdout))
        told = "--stacks: some allocations go without their Python stack: " + why
        self.assertEqual(run["stderr"].count(told), 1, run["stderr"])
        return run

    def test_a_profiler_of_the_scripts_own_is_kept(self):
        run = self.run_with_own_profiler("--own-profiler", "this thread has a profiler of its own")
        self.assertEqual(self.frames(run, "nested"), [])
        # The thread it started is the agent's to follow (its own profiler was for the main
        # thread only: sys.setprofile).
        self.assertEqual(self.frames(run, "thread")[0], self.frame("make", "make"))

    def test_a_profiler_the_script_set_for_its_threads_is_kept(self):
        run = self.run_with_own_profiler("--own-thread-profiler",
                                         "new threads have a profiler of the script's own")
        self.assertEqual(self.frames(run, "thread"), [])
        self.assertEqual(self.frames(run, "nested")[0], self.frame("make", "make"))

if __name__ == "__main__":
    unittest.main()
