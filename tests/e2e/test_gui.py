"""tidemark-gui opens a real window under Xvfb and renders it (a screenshot with content)."""
import atexit
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import unittest
import zlib

from tidemark_env import BIN, PYTHON, SOURCE, Daemon, start_ranks


def png_pixels(path):
    """(width, height, set of distinct pixels) of an 8-bit RGB/RGBA, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels = set()
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, bpp):
            pixels.add(bytes(line[x:x + bpp]))
        prev = line
    return width, height, pixels


# The fixed colours of gui/model/category_colors.cpp (docs/gui.md), by category.
CATEGORY_RGB = {
    "WEIGHT": (76, 114, 176), "GRADIENT": (221, 132, 82), "OPTIMIZER_STATE": (129, 114, 179),
    "ACTIVATION": (85, 168, 104), "CHECKPOINT_INPUT": (147, 120, 96), "RECOMPUTED": (218, 139, 195),
    "INPUT": (110, 110, 110), "TEMPORARY": (204, 185, 116), "WORKSPACE": (100, 181, 205),
    "ALLOCATOR_SLACK": (196, 78, 82), "UNKNOWN": (208, 208, 208)}
PEAK_MARKER = (255, 0, 255)


class VirtualDisplay:
    """A private Xvfb server for the windows of this process. Xvfb picks a free display itself
    (-displayfd), so suites running side by side never race for one, and a program's exit code is
    its own (xvfb-run replaced it with 5 when it could not remove its temporary directory)."""

    def __init__(self):
        read_end, write_end = os.pipe()
        self.proc = subprocess.Popen(["Xvfb", "-displayfd", str(write_end), "-screen", "0",
                                      "1400x900x24", "-nolisten", "tcp"],
                                     pass_fds=(write_end,), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(write_end)
        number = b""
        deadline = time.time() + 60
        while not number.endswith(b"\n"):
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.time()))
            chunk = os.read(read_end, 16) if ready else b""
            if not chunk:
                os.close(read_end)
                self.close()
                raise RuntimeError("Xvfb did not start (exit %s)" % self.proc.poll())
            number += chunk
        os.close(read_end)
        self.display = ":" + number.decode().strip()

    def env(self, base=None, **extra):
        env = dict(os.environ if base is None else base, DISPLAY=self.display, **extra)
        env.pop("WAYLAND_DISPLAY", None)
        env.pop("QT_QPA_PLATFORM", None)
        return env

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_DISPLAY = None


def display():
    """The private Xvfb of this process, started at its first use (also by the suites that
    import screenshot from here) and stopped when the process exits."""
    global _DISPLAY
    if _DISPLAY is None:
        _DISPLAY = VirtualDisplay()
        atexit.register(_DISPLAY.close)
    return _DISPLAY


def screenshot(args, out):
    return subprocess.run([os.path.join(BIN, "tidemark-gui"), *args, "--screenshot", out],
                          capture_output=True, text=True, timeout=180, env=display().env())


class GuiWindowTest(unittest.TestCase):
    def test_window_renders_an_empty_store(self):
        daemon = Daemon()  # a store with no session yet, read as a file
        daemon.stop()
        out = os.path.join(daemon.dir, "window.png")
        self.addCleanup(daemon.cleanup)
        r = screenshot(["--db", daemon.db], out)
        self.assertEqual(r.returncode, 0, r.stderr)
        width, height, pixels = png_pixels(out)
        self.assertEqual((width, height), (1280, 800))
        self.assertGreater(len(pixels), 8)  # a window with text, not a blank one

    def test_screenshot_mode_says_what_failed_at_once(self):
        """No daemon, or no such session: the screenshot mode says so on stderr and exits 2
        at once (it waited 60 s and said nothing)."""
        daemon = Daemon()
        try:
            for args, says in ((["--server", "127.0.0.1:1", "--open", "1"], "no tidemarkd at"),
                               (["--server", daemon.address, "--open", "99"], "no session 99")):
                start = time.time()
                r = screenshot(args, os.path.join(daemon.dir, "none.png"))
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertIn(says, r.stderr)
                self.assertLess(time.time() - start, 45)  # not the 60 s wait
        finally:
            daemon.cleanup()

    def test_help_needs_no_display(self):
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY",
                                                                "QT_QPA_PLATFORM")}
        r = subprocess.run([os.path.join(BIN, "tidemark-gui"), "--help"], capture_output=True,
                           text=True, timeout=60, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--db <file>", r.stdout)


    def test_bad_options_are_refused_before_a_window_opens(self):
        for args, says in ((["--budget", "5"], "--budget"), (["--budget", "lots"], "--budget"),
                           (["--open", "first"], "--open"), (["--tab", "plans"], "--tab"),
                           (["--device", "gpu0"], "unknown device 'gpu0'"),
                           (["--offload", "fast"], "--offload: bad speed 'fast'")):
            r = subprocess.run([os.path.join(BIN, "tidemark-gui"), *args],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(says, r.stderr)


def record_training(test, daemon):
    """A 3-step training recorded and analysed by daemon: its session id."""
    r = daemon.run(PYTHON, os.path.join(SOURCE, "examples", "train.py"), "--steps", "3")
    test.assertEqual(r.returncode, 0, r.stderr)
    sid = daemon.newest_session()["id"]
    daemon.wait_analyzed(sid)
    return sid


def interaction_passes(test, daemon, slot, **env):
    """One QTest slot of tests/gui/gui_interaction_test.cpp against daemon, under Xvfb."""
    r = subprocess.run([os.path.join(BIN, "tidemark_gui_interaction_test"), slot],
                       capture_output=True, text=True, timeout=300,
                       env=display().env(TIDEMARK_SERVER=daemon.address, **env))
    test.assertEqual(r.returncode, 0, r.stdout + r.stderr)
    test.assertIn("PASS   : GuiInteraction::%s()" % slot, r.stdout)


class GuiSessionTest(unittest.TestCase):
    """The GUI against a real tidemarkd holding a recorded training: the timeline draws every
    category the peak holds in its colour, marks the peak, and the plan panel loads a plan."""

    def test_timeline_and_plan_of_a_recorded_session(self):
        daemon = Daemon()
        try:
            sid = record_training(self, daemon)
            peak = daemon.cli_json("breakdown", str(sid))
            plan = daemon.cli_json("plan", str(sid), "--budget", "60%")
            out = os.path.join(daemon.dir, "session.png")
            r = screenshot(["--server", daemon.address, "--open", str(sid), "--budget", "60"], out)
            self.assertEqual(r.returncode, 0, r.stderr)
            _, _, pixels = png_pixels(out)
            rgb = {p[:3] for p in pixels}
            self.assertIn(bytes(PEAK_MARKER), rgb, "the peak marker is not drawn")
            # Every category holding more than 1 % of the peak is drawn in its colour.
            for name, c in peak["categories"].items():
                if c["bytes"] > 0.01 * peak["tracked_bytes"]:
                    self.assertIn(bytes(CATEGORY_RGB[name]), rgb, name)
            # The plan panel drew the plan's predicted peak line (green, dotted).
            self.assertIn(bytes((0, 150, 0)), rgb)
            self.assertTrue(plan["feasible"])
            # The Steps tab overlays the first and last step in their two colours
            # (StepCompareView::kColorA, kColorB).
            out = os.path.join(daemon.dir, "steps.png")
            r = screenshot(["--server", daemon.address, "--open", str(sid), "--tab", "steps"], out)
            self.assertEqual(r.returncode, 0, r.stderr)
            rgb = {p[:3] for p in png_pixels(out)[2]}
            self.assertIn(bytes((0x1f, 0x5f, 0xa8)), rgb, "step A's curve is not drawn")
            self.assertIn(bytes((0xe0, 0x7b, 0x00)), rgb, "step B's curve is not drawn")
            # The Icicle tab: shot once it shows the peak's modules.
            out = os.path.join(daemon.dir, "icicle.png")
            r = screenshot(["--server", daemon.address, "--open", str(sid), "--tab", "icicle"],
                           out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.getsize(out) > 0)
        finally:
            daemon.cleanup()


class GuiJobTest(unittest.TestCase):
    """A training job's ranks in the Job tab: a row per rank, the memory need's curve and row in
    their colours (JobView::kNeedColor, kNeedRowColor), the others' curves in theirs
    (kRankColor); QTest clicks the memory need's row, which opens its session."""

    def test_the_job_tab_of_a_rank(self):
        daemon = Daemon()
        out = tempfile.mkdtemp(prefix="tidemark-gui-job-")
        try:
            start_ranks(daemon, out, world=2, big_rank=1)
            sessions = daemon.cli_json("sessions")["sessions"]
            by_rank = {s["rank"]: s["id"] for s in sessions}
            self.assertEqual(sorted(by_rank), [0, 1])
            for sid in by_rank.values():
                daemon.wait_ended(sid)
            job = daemon.cli_json("job", str(sessions[0]["job_id"]))
            self.assertEqual(job["memory_session_id"], by_rank[1])
            shot = os.path.join(daemon.dir, "job.png")
            r = screenshot(["--server", daemon.address, "--open", str(by_rank[0]), "--tab", "job"],
                           shot)
            self.assertEqual(r.returncode, 0, r.stderr)
            rgb = {p[:3] for p in png_pixels(shot)[2]}
            self.assertIn(bytes((0xd6, 0x27, 0x28)), rgb, "the memory need's curve")
            self.assertIn(bytes((0xfd, 0xe6, 0xe6)), rgb, "the memory need's row")
            self.assertIn(bytes((0x1f, 0x77, 0xb4)), rgb, "the other rank's curve")
            interaction_passes(self, daemon, "clickARankOfTheJob",
                               TIDEMARK_GUI_JOB_SESSION=str(by_rank[0]),
                               TIDEMARK_GUI_JOB_NEED=str(by_rank[1]))
            # A session that is no rank says so instead.
            r = daemon.run(PYTHON, "-c", "import torch; x = torch.ones(10)")
            self.assertEqual(r.returncode, 0, r.stderr)
            alone = daemon.newest_session()["id"]
            shot = os.path.join(daemon.dir, "alone.png")
            r = screenshot(["--server", daemon.address, "--open", str(alone), "--tab", "job"], shot)
            self.assertEqual(r.returncode, 0, r.stderr)
            rgb = {p[:3] for p in png_pixels(shot)[2]}
            self.assertNotIn(bytes((0xd6, 0x27, 0x28)), rgb)
        finally:
            daemon.cleanup()
            shutil.rmtree(out, ignore_errors=True)


class GuiJobPlanTest(unittest.TestCase):
    """The plan panel on a rank of a running data-parallel job (2 ranks of the examples' GPT):
    QTest opens the rank that is not the memory need, checks that the plan comes from the memory
    need's rank, clicks Apply, and waits for both ranks' outcomes: applied from one step, each
    measured beside the prediction. The CLI then says the same, and the job trained on."""

    def test_a_plan_for_the_whole_job(self):
        daemon = Daemon()
        out = tempfile.mkdtemp(prefix="tidemark-gui-jobplan-")
        ranks = []
        try:
            port, ranks = start_ranks(daemon, out, world=2, steps=120, model="gpt", wait=False)
            deadline = time.time() + 300
            while time.time() < deadline:
                live = [s for s in daemon.cli_json("sessions")["sessions"]
                        if s["state"] == "live" and s["job_id"] != 0 and s["steps"] >= 3]
                if len(live) == 2:
                    break
                time.sleep(0.2)
            self.assertEqual(len(live), 2, "the ranks did not run 3 steps each")
            job = daemon.cli_json("job", str(live[0]["job_id"]))
            need = job["memory_session_id"]
            other = [s["id"] for s in live if s["id"] != need][0]
            interaction_passes(self, daemon, "planAndApplyToAJob",
                               TIDEMARK_GUI_JOB_SESSION=str(other),
                               TIDEMARK_GUI_JOB_NEED=str(need))
            for p in ranks:
                _, err = p.communicate(timeout=600)
                self.assertEqual(p.returncode, 0, err)
            check = daemon.cli_json("plan-check", "--job", "127.0.0.1:%d" % port)
            steps = set()
            for rank in check["ranks"]:
                [plan] = rank["plans"]
                self.assertEqual(plan["state"], "applied")
                self.assertGreaterEqual(plan["steps_measured"], 2)
                steps.add(plan["from_step"])
            self.assertEqual(len(steps), 1, "every rank switched at one step")
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
            daemon.cleanup()
            shutil.rmtree(out, ignore_errors=True)


class GuiInteractionTest(unittest.TestCase):
    """QTest drives the real window (tests/gui/gui_interaction_test.cpp): select a session, zoom,
    click the peak, move the budget slider; on a live session, Apply sends the plan, which the
    job then applies."""

    def interact(self, daemon, sid, live):
        env = display().env(TIDEMARK_SERVER=daemon.address, TIDEMARK_GUI_SESSION=str(sid))
        if live:
            env["TIDEMARK_GUI_LIVE"] = "1"
        return subprocess.run([os.path.join(BIN, "tidemark_gui_interaction_test")],
                              capture_output=True, text=True, timeout=300, env=env)

    def test_recorded_session(self):
        daemon = Daemon()
        try:
            sid = record_training(self, daemon)
            r = self.interact(daemon, sid, live=False)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("3 passed, 0 failed", r.stdout)
        finally:
            daemon.cleanup()

    def test_tensor_stack_in_the_inspector(self):
        """An imported snapshot: a click on a tensor at the peak shows its allocation stack."""
        daemon = Daemon()
        try:
            snapshot = os.path.join(SOURCE, "tests", "fuzz", "corpus", "pickle",
                                    "training_step.pickle")
            sid = daemon.cli_json("import", snapshot)["session"]
            daemon.wait_analyzed(sid)
            interaction_passes(self, daemon, "tensorStackInTheInspector",
                               TIDEMARK_GUI_STACK_SESSION=str(sid))
        finally:
            daemon.cleanup()

    def test_own_stack_in_the_inspector(self):
        """A training recorded with `tidemark run --stacks`: the inspector's largest tensor at the
        peak shows the Python frames that allocated it, down to the training script."""
        daemon = Daemon()
        try:
            r = daemon.run(PYTHON, os.path.join(SOURCE, "examples", "train.py"), "--steps", "3",
                           run_options=("--stacks",))
            self.assertEqual(r.returncode, 0, r.stderr)
            sid = daemon.newest_session()["id"]
            daemon.wait_analyzed(sid)
            interaction_passes(self, daemon, "ownStackInTheInspector",
                               TIDEMARK_GUI_OWN_STACK_SESSION=str(sid),
                               TIDEMARK_GUI_OWN_STACK_SCRIPT="train.py")
        finally:
            daemon.cleanup()

    def test_nested_and_offloaded_plans(self):
        """The plan panel's plan space: Nested checkpointing and an offload speed, as `tidemark
        plan --nested --offload` (a GPT of 12 blocks: below the least one-level budget, a nested
        plan fits)."""
        daemon = Daemon()
        try:
            r = daemon.run(PYTHON, os.path.join(SOURCE, "examples", "train.py"), "--steps", "2",
                           "--layers", "12")
            self.assertEqual(r.returncode, 0, r.stderr)
            sid = daemon.newest_session()["id"]
            daemon.wait_analyzed(sid)
            # A budget (the slider's whole percents) with no one-level plan and a nested one.
            found = None
            for percent in range(10, 40):
                one = daemon.cli("plan", str(sid), "--budget", "%d%%" % percent, "--json",
                                 check=False)
                if one.returncode == 0:
                    break
                nested = daemon.cli("plan", str(sid), "--budget", "%d%%" % percent, "--nested",
                                    "--json", check=False)
                if one.returncode == 4 and nested.returncode == 0:
                    found = (percent, json.loads(nested.stdout))
                    break
            self.assertIsNotNone(found, "no budget where only a nested plan fits")
            percent, plan = found
            self.assertEqual(plan["version"], 2)  # it nests
            interaction_passes(self, daemon, "nestedAndOffloadedPlans",
                               TIDEMARK_GUI_NESTED_SESSION=str(sid),
                               TIDEMARK_GUI_BUDGET=str(percent),
                               TIDEMARK_GUI_NESTED_PEAK=str(plan["predicted"]["peak_bytes"]))
        finally:
            daemon.cleanup()

    def test_icicle_of_a_moment(self):
        """The Icicle tab: memory at the peak, then at a moment clicked, by module hierarchy."""
        daemon = Daemon()
        try:
            sid = record_training(self, daemon)
            interaction_passes(self, daemon, "icicleOfTheInspectorsMoment",
                               TIDEMARK_GUI_ICICLE_SESSION=str(sid))
        finally:
            daemon.cleanup()

    def test_apply_to_a_live_session(self):
        daemon = Daemon()
        try:
            job = subprocess.Popen(
                [os.path.join(BIN, "tidemark"), "--server", daemon.address, "run", "--", PYTHON,
                 os.path.join(SOURCE, "examples", "train.py"), "--steps", "40", "--checkpoint", ""],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                sid = None
                deadline = time.time() + 300
                while sid is None and time.time() < deadline:
                    live = [s for s in daemon.cli_json("sessions")["sessions"]
                            if s["state"] == "live" and s["steps"] >= 2]
                    sid = live[-1]["id"] if live else None
                    time.sleep(0.2)
                self.assertIsNotNone(sid, "the training did not start")
                r = self.interact(daemon, sid, live=True)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                # The job takes the plan at its next step boundary.
                state = None
                deadline = time.time() + 120
                while state != "applied" and time.time() < deadline:
                    plans = daemon.cli_json("plan-check", str(sid))["plans"]
                    state = plans[-1]["state"] if plans else None
                    time.sleep(0.3)
                self.assertEqual(state, "applied")
            finally:
                job.kill()
                job.communicate()
        finally:
            daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
