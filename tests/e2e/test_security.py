"""Only a job's owner sees and steers it (docs/security.md), tried as root with a second uid
(65534) made by setpriv: the per-user daemon started on demand with private files; another uid
can neither list, read, plan nor apply on a root job, each refusal exit code 5 with the owner
named and logged, while the job finishes with its own losses; a job sends nothing to a daemon of
another uid (its events spooled, uploaded later to the user's own); the spool never goes through
a planted link or file; tokens' roles (ingest, read, control) enforced, only their hashes kept;
TLS with certificates made here by openssl, mutual TLS, a wrong CA named as such, callers from
another address of this machine needing a token, and a rogue TLS daemon getting nothing."""
import atexit
import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import tempfile
import time
import unittest

from tidemark_env import BIN, Daemon, DaemonTestCase, PYTHON, SOURCE, stop_daemon_of_store

NOBODY = 65534
AS_NOBODY = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]
TIDEMARK = os.path.join(BIN, "tidemark")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan_target_train.py")
ARGS = ("--steps", "40", "--sleep", "0.15")
ALLOC_JOB = [PYTHON, "-c", "import torch; xs = [torch.ones(1 << 16) for _ in range(20)]; print('ok')"]


_NOBODY_BIN = []


def nobody_bin():
    """Where the second uid runs the build's tidemark, tidemarkd, agent and adapter from: the
    build itself when it can reach it, else a copy in a directory it can enter (a checkout inside
    a mode-0700 directory, as `mktemp -d` makes, keeps other uids out of its build), laid out as
    an install is (bin/, lib/, share/tidemark/python/), removed at the end."""
    if _NOBODY_BIN:
        return _NOBODY_BIN[0]
    agent = os.path.join(BIN, "..", "lib", "libtidemark_agent.so")
    if subprocess.run(AS_NOBODY + ["test", "-r", agent, "-a", "-x",
                                   os.path.join(BIN, "tidemark")]).returncode == 0:
        _NOBODY_BIN.append(BIN)
        return BIN
    root = tempfile.mkdtemp(prefix="tidemark-nobody-build-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for sub in ("bin", "lib", os.path.join("share", "tidemark", "python")):
        os.makedirs(os.path.join(root, sub))
    for name in ("tidemark", "tidemarkd"):
        shutil.copy2(os.path.join(BIN, name), os.path.join(root, "bin", name))
    shutil.copy2(agent, os.path.join(root, "lib", "libtidemark_agent.so"))
    shutil.copytree(os.path.join(SOURCE, "python", "tidemark"),
                    os.path.join(root, "share", "tidemark", "python", "tidemark"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o755 if d.endswith("bin") else 0o644)
    _NOBODY_BIN.append(os.path.join(root, "bin"))
    return _NOBODY_BIN[0]


def nobody_tool(name):
    """A build's program as the second uid runs it (nobody_bin)."""
    return os.path.join(nobody_bin(), name)


def losses(text):
    return re.findall(r"^step \d+ loss (\S+)$", text, re.M)


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def nobody_dir():
    """A directory the second uid owns (mode 0700), for its HOME and files."""
    d = tempfile.mkdtemp(prefix="tidemark-nobody-")
    os.chown(d, NOBODY, NOBODY)
    os.chmod(d, 0o700)
    return d


def home_env(home):
    """The environment of a user whose HOME is home and who has no XDG directories set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("XDG_") and k != "TIDEMARK_SERVER"}
    env["HOME"] = home
    return env


class PerUserDaemonTest(unittest.TestCase):
    def test_commands_start_the_users_own_daemon_and_keep_its_files_private(self):
        home = tempfile.mkdtemp(prefix="tidemark-home-")
        env = home_env(home)
        db = os.path.join(home, ".local", "share", "tidemark", "tidemark.db")
        try:
            r = subprocess.run([TIDEMARK, "run", "--", *ALLOC_JOB], capture_output=True,
                               text=True, timeout=300, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("started your tidemarkd", r.stderr)
            r = subprocess.run([TIDEMARK, "sessions", "--json"], capture_output=True, text=True,
                               timeout=60, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("started", r.stderr, "the running daemon is used, not a second one")
            sessions = json.loads(r.stdout)["sessions"]
            self.assertEqual(len(sessions), 1)
            self.assertEqual(sessions[0]["owner_uid"], os.geteuid())
            self.assertGreater(sessions[0]["events_stored"], 0)
            sock = os.path.join(home, ".cache", "tidemark", "tidemarkd.sock")
            self.assertTrue(stat.S_ISSOCK(os.lstat(sock).st_mode))
            self.assertEqual(mode(sock), 0o600)
            self.assertEqual(mode(os.path.dirname(sock)), 0o700)
            self.assertEqual(mode(os.path.dirname(db)), 0o700)
            for f in os.listdir(os.path.dirname(db)):  # the store, its journal, its lock
                self.assertEqual(mode(os.path.join(os.path.dirname(db), f)) & 0o077, 0, f)
            # Another uid cannot even reach the socket.
            r = subprocess.run(AS_NOBODY + [nobody_tool("tidemark"), "--server", "unix:" + sock, "sessions"],
                               capture_output=True, text=True, timeout=60, env=home_env("/"))
            self.assertEqual(r.returncode, 5, r.stderr)
            self.assertIn("Permission denied", r.stderr)
        finally:
            stop_daemon_of_store(db)
            shutil.rmtree(home, ignore_errors=True)

    def test_a_socket_directory_that_is_not_private_is_refused(self):
        d = tempfile.mkdtemp(prefix="tidemark-sockdir-")
        try:
            for owner, perm, why in [(0, 0o755, "can be entered by other users (mode 0755)"),
                                     (NOBODY, 0o700, "belongs to uid %d" % NOBODY)]:
                run_dir = os.path.join(d, "run%d" % owner)
                os.mkdir(run_dir)
                os.chown(run_dir, owner, owner)
                os.chmod(run_dir, perm)
                r = subprocess.run([os.path.join(BIN, "tidemarkd"), "--unix",
                                    os.path.join(run_dir, "d.sock"), "--db",
                                    os.path.join(d, "s%d.db" % owner)],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(why, r.stderr)
                self.assertEqual(os.listdir(run_dir), [], "nothing made in it")
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_listening_off_this_host_is_refused(self):
        d = tempfile.mkdtemp(prefix="tidemark-listen-")
        try:
            r = subprocess.run([os.path.join(BIN, "tidemarkd"), "--no-unix", "--listen",
                                "0.0.0.0:0", "--db", os.path.join(d, "s.db")],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("can be reached from other machines", r.stderr)
        finally:
            shutil.rmtree(d, ignore_errors=True)


def as_nobody(daemon, *args, home):
    """`tidemark ARGS` against daemon as the second uid, with its own home."""
    return subprocess.run(AS_NOBODY + [nobody_tool("tidemark"), "--server", daemon.address, *args],
                          capture_output=True, text=True, timeout=300, env=home_env(home))


class AnotherUsersJobTest(DaemonTestCase):
    """A daemon shared on this host: each uid sees its own training jobs only."""

    def nobody(self, *args, home):
        return as_nobody(self.daemon, *args, home=home)

    def test_a_job_is_its_owners_only(self):
        # Two users name their runs alike on one daemon: two jobs, each seen by its owner only.
        home = nobody_dir()
        r = self.daemon.cli("run", "--job", "shared-name", "--", *ALLOC_JOB)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run(AS_NOBODY + [nobody_tool("tidemark"), "--server", self.daemon.address, "run", "--job",
                                        "shared-name", "--", *ALLOC_JOB], capture_output=True,
                           text=True, timeout=300, env=home_env(home))
        self.assertEqual(r.returncode, 0, r.stderr)
        jobs = self.daemon.cli_json("jobs")["jobs"]  # root sees both
        named = [j for j in jobs if j["key"] == "shared-name"]
        self.assertEqual(sorted(j["owner_uid"] for j in named), [0, NOBODY])
        roots = [j["id"] for j in named if j["owner_uid"] == 0][0]
        theirs = json.loads(self.nobody("jobs", "--json", home=home).stdout)["jobs"]
        self.assertEqual([j["owner_uid"] for j in theirs], [NOBODY])
        self.assertEqual(theirs[0]["ranks_recorded"], 1)
        # Root's job does not exist for them, by id or by name (their own is found by name).
        r = self.nobody("job", str(roots), home=home)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("no job %d" % roots, r.stderr)
        mine = json.loads(self.nobody("job", "shared-name", "--json", home=home).stdout)
        self.assertEqual(mine["job"]["id"], theirs[0]["id"])
        self.assertEqual([x["session"]["owner_uid"] for x in mine["ranks"]], [NOBODY])


    def test_a_handoff_to_a_daemon_of_another_uid_is_never_left_in_memory(self):
        # Root's daemon never removes another user's file (a daemon serving several users leaves
        # it to its owner): the exit's handoff of uid 65534 goes to its spool directory on disk,
        # never to /dev/shm, where it would hold memory until a reboot. (Every exit hands off
        # here: a minimum of one event.)
        home = nobody_dir()
        env = home_env(home)
        env["TIDEMARK_HANDOFF_MIN_EVENTS"] = "1"
        r = subprocess.run(AS_NOBODY + [nobody_tool("tidemark"), "--server", self.daemon.address,
                                        "run", "--", *ALLOC_JOB], capture_output=True,
                           text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        m = re.search(r"handed to the daemon in (\S+),", r.stderr)
        self.assertIsNotNone(m, r.stderr)
        self.assertTrue(m.group(1).startswith(home + "/"), m.group(1))
        session = [s for s in self.daemon.cli_json("sessions")["sessions"]
                   if s["owner_uid"] == NOBODY][-1]
        s = self.daemon.wait_ended(session["id"])
        self.assertEqual(s["events_dropped"], 0)
        self.assertEqual(s["events_stored"], s["events_sent"])


class AnotherUserTest(DaemonTestCase):
    """A daemon shared on this host (loopback TCP): each uid sees its own sessions only."""

    def nobody(self, *args, home):
        return as_nobody(self.daemon, *args, home=home)

    def test_another_uid_can_neither_read_nor_steer_a_running_job(self):
        plain = subprocess.run([PYTHON, SCRIPT, *ARGS], capture_output=True, text=True,
                               timeout=300)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        home = nobody_dir()
        plan = os.path.join(home, "plan.json")
        with open(plan, "w") as f:
            json.dump({"format": "tidemark-plan", "version": 1, "strategy": "optimal",
                       "budget_bytes": 1, "feasible": True,
                       "predicted": {"peak_bytes": 1, "extra_ns": 0, "step_ns": 0,
                                     "overhead": 0, "peak_at": {"phase": "forward"}},
                       "baseline": {"peak_bytes": 1, "step_ns": 0}, "lower_bound_extra_ns": 0,
                       "min_feasible_budget_bytes": 1,
                       "chain": {"name": "x", "stages": 1, "static_bytes": 0},
                       "segments": [{"mode": "recompute", "modules": ["Net.blocks.0"]}]}, f)
        os.chown(plan, NOBODY, NOBODY)
        job = subprocess.Popen([TIDEMARK, "--server", self.daemon.address, "run", "--", PYTHON,
                                SCRIPT, *ARGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        try:
            sid = self.wait_live(2)
            s = str(sid)
            r = self.nobody("sessions", "--json", home=home)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["sessions"], [], "root's job is not listed")
            for args in [("breakdown", s), ("peak", s), ("timeline", s), ("steps", s),
                         ("ops", s), ("diff", s, s), ("export", s, "-o",
                                                       os.path.join(home, "t.json")),
                         ("chain", s), ("pareto", s), ("plan", s, "--budget", "50%"),
                         ("plan-check", s), ("apply", s, plan, "--no-wait"), ("delete", s)]:
                r = self.nobody(*args, home=home)
                self.assertEqual(r.returncode, 5, "%s: %s%s" % (args[0], r.stdout, r.stderr))
                self.assertIn("refused (permission denied)", r.stderr, args[0])
                self.assertIn("session %d belongs to uid 0, not to uid %d" % (sid, NOBODY),
                              r.stderr, args[0])
            self.assertFalse(os.path.exists(os.path.join(home, "t.json")))
            # Its own job on the same daemon is its own to see.
            r = subprocess.run(AS_NOBODY + [nobody_tool("tidemark"), "--server", self.daemon.address, "run",
                                            "--", *ALLOC_JOB], capture_output=True, text=True,
                               timeout=300, env=home_env(home))
            self.assertEqual(r.returncode, 0, r.stderr)
            mine = json.loads(self.nobody("sessions", "--json", home=home).stdout)["sessions"]
            self.assertEqual([x["owner_uid"] for x in mine], [NOBODY])
            self.assertEqual(self.nobody("breakdown", str(mine[0]["id"]), home=home).returncode,
                             0)
            # Nor are root's recorded re-runs its to time a plan by.
            for command, *rest in [("plan", "--budget", "50%"), ("chain",), ("pareto",)]:
                r = self.nobody(command, str(mine[0]["id"]), *rest, "--rerun-times-from", s,
                                home=home)
                self.assertEqual(r.returncode, 5, "%s: %s" % (command, r.stderr))
                self.assertIn("session %d belongs to uid 0, not to uid %d" % (sid, NOBODY),
                              r.stderr, command)
            out, err = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
        self.assertEqual(job.returncode, 0, err)
        self.assertEqual(losses(out), losses(plain.stdout), "the job trained as if alone")
        # Root sees both; the owner reads its own; nothing was applied.
        owners = sorted(x["owner_uid"] for x in self.daemon.cli_json("sessions")["sessions"])
        self.assertEqual(owners, [0, NOBODY])
        self.assertEqual(self.daemon.cli("breakdown", s).returncode, 0)
        self.assertEqual(self.daemon.cli_json("plan-check", s)["plans"], [])
        self.assertIn("refused (127.0.0.1:", self.daemon.read_log())

    def wait_live(self, steps, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            live = [x for x in self.daemon.cli_json("sessions")["sessions"]
                    if x["state"] == "live" and x["steps"] >= steps]
            if live:
                return live[-1]["id"]
            time.sleep(0.1)
        raise AssertionError("no live session reached %d steps" % steps)

    def test_a_daemon_of_another_uid_never_takes_up_a_users_spool(self):
        # The daemon takes up by itself only the spools of its own user's sessions, from its own
        # directories: uid 65534's job, whose end reached no one (root's daemon hung at its exit),
        # keeps its spool for its own `tidemark upload`; the daemon closes the session as aborted
        # once the job is gone and touches nothing of that user's. (A daemon of its own: this one
        # is stopped for a while, and the session it keeps is uid 65534's.)
        daemon = Daemon()
        self.addCleanup(daemon.cleanup)
        home = nobody_dir()
        ready, go = os.path.join(home, "ready"), os.path.join(home, "go")
        code = ("import os, sys, time, torch\n"
                "xs = [torch.ones(1 << 16) for _ in range(20)]\n"
                "open(sys.argv[1], 'w').close()\n"
                "while not os.path.exists(sys.argv[2]):\n"
                "    time.sleep(0.02)\n"
                "print('ok')\n")
        env = dict(home_env(home), TIDEMARK_ACK_TIMEOUT_MS="500")
        job = subprocess.Popen(AS_NOBODY + [nobody_tool("tidemark"), "--server",
                                            daemon.address, "run", "--", PYTHON, "-c", code,
                                            ready, go],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.time() + 120
            session = None
            while session is None:
                self.assertIsNone(job.poll(), "the job ended early")
                self.assertLess(time.time(), deadline, "the job's session did not appear")
                found = [s for s in daemon.cli_json("sessions")["sessions"]
                         if s["pid"] == job.pid and s["events_stored"] > 0]
                session = found[0] if found and os.path.exists(ready) else None
                time.sleep(0.05)
            os.kill(daemon.proc.pid, signal.SIGSTOP)
            open(go, "w").close()
            out, err = job.communicate(timeout=120)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
            if job.poll() is None:
                job.kill()
        self.assertEqual(job.returncode, 0, err)
        self.assertIn("ok", out)
        self.assertIn("complete the session with: tidemark upload", err)
        self.assertNotIn("takes it up", err)
        spool = err.split("tidemark upload ")[-1].strip()
        self.assertTrue(spool.startswith(home + "/"), err)
        s = daemon.wait_ended(session["id"])
        self.assertEqual(s["state"], "aborted")
        self.assertTrue(os.path.exists(spool), "the daemon removed another user's spool")
        self.assertEqual(os.stat(spool).st_uid, NOBODY)
        self.assertNotIn("taking up the rest of its run", daemon.read_log())
        r = as_nobody(daemon, "upload", spool, home=home)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"uploaded \d+ events as session \d+")


class AnotherUsersDaemonTest(unittest.TestCase):
    def test_a_job_sends_nothing_to_a_daemon_of_another_uid(self):
        rogue = nobody_dir()
        port_file = os.path.join(rogue, "port")
        proc = subprocess.Popen(AS_NOBODY + [nobody_tool("tidemarkd"), "--listen",
                                             "127.0.0.1:0", "--port-file", port_file, "--unix",
                                             os.path.join(rogue, "run", "d.sock"), "--db",
                                             os.path.join(rogue, "s.db")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=home_env(rogue))
        spool = tempfile.mkdtemp(prefix="tidemark-spool-")
        own = None
        try:
            deadline = time.time() + 30
            while not os.path.exists(port_file) and time.time() < deadline:
                time.sleep(0.05)
            with open(port_file) as f:
                address = "127.0.0.1:" + f.read().strip()
            r = subprocess.run([TIDEMARK, "--server", address, "run", "--", *ALLOC_JOB],
                               capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, TIDEMARK_SPOOL_DIR=spool))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("not sending anything to the daemon at %s: port" % address, r.stderr)
            self.assertIn("listened on by uid %d" % NOBODY, r.stderr)
            con = sqlite3.connect("file:%s?mode=ro" % os.path.join(rogue, "s.db"), uri=True)
            self.assertEqual(con.execute("SELECT COUNT(*) FROM session").fetchone()[0], 0)
            con.close()
            r = subprocess.run([TIDEMARK, "--server", "unix:" + os.path.join(rogue, "run", "d.sock"),
                                "run", "--", *ALLOC_JOB], capture_output=True, text=True,
                               timeout=300, env=dict(os.environ, TIDEMARK_SPOOL_DIR=spool))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("the socket %s belongs to uid %d" % (
                os.path.join(rogue, "run", "d.sock"), NOBODY), r.stderr)
            for target in (address, "unix:" + os.path.join(rogue, "run", "d.sock")):
                r = subprocess.run([TIDEMARK, "--server", target, "sessions"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 5, r.stderr)
                self.assertIn("not talking to the daemon", r.stderr)
            # What the first job recorded waits in the spool for the user's own daemon.
            files = sorted(os.listdir(spool), key=lambda f: os.path.getmtime(os.path.join(spool, f)))
            self.assertEqual(len(files), 2)
            self.assertEqual(mode(os.path.join(spool, files[0])), 0o600)
            own = Daemon()
            up = own.cli("upload", os.path.join(spool, files[0]), "--json")
            self.assertEqual(up.returncode, 0, up.stderr)
            stored = own.cli_json("sessions")["sessions"]
            self.assertEqual(len(stored), 1)
            self.assertGreater(stored[0]["events_stored"], 0)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if own:
                own.cleanup()
            shutil.rmtree(rogue, ignore_errors=True)
            shutil.rmtree(spool, ignore_errors=True)


class SpoolDirectoryTest(unittest.TestCase):
    def test_the_default_spool_is_private_and_never_goes_through_a_plant(self):
        home = tempfile.mkdtemp(prefix="tidemark-home-")
        env = home_env(home)
        env["TIDEMARK_SERVER"] = "127.0.0.1:1"  # nobody answers: the run is spooled
        spool = os.path.join(home, ".local", "state", "tidemark", "spool")
        elsewhere = tempfile.mkdtemp(prefix="tidemark-elsewhere-")
        try:
            r = subprocess.run([TIDEMARK, "run", "--", *ALLOC_JOB], capture_output=True,
                               text=True, timeout=300, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(mode(spool), 0o700)
            files = os.listdir(spool)
            self.assertEqual(len(files), 1, r.stderr)
            self.assertEqual(mode(os.path.join(spool, files[0])), 0o600)
            self.assertIn(os.path.join(spool, files[0]), r.stderr)
            shutil.rmtree(spool)
            for plant in ("link", "file"):
                if plant == "link":
                    os.symlink(elsewhere, spool)
                else:
                    open(spool, "w").close()
                r = subprocess.run([TIDEMARK, "run", "--", *ALLOC_JOB], capture_output=True,
                                   text=True, timeout=300, env=env)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("ok", r.stdout)
                self.assertIn("could not be spooled (%s is not a directory)" % spool, r.stderr)
                self.assertEqual(os.listdir(elsewhere), [], plant)
                os.unlink(spool)
        finally:
            shutil.rmtree(home, ignore_errors=True)
            shutil.rmtree(elsewhere, ignore_errors=True)


class OwnDaemon:
    """A tidemarkd of the test's with extra options, on a free loopback (or given) port."""

    def __init__(self, *options, listen="127.0.0.1:0", as_nobody=False, directory=None):
        self.dir = directory or tempfile.mkdtemp(prefix="tidemark-e2e-")
        port_file = os.path.join(self.dir, "port")
        self.db = os.path.join(self.dir, "s.db")
        self.log_path = os.path.join(self.dir, "tidemarkd.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                (AS_NOBODY + [nobody_tool("tidemarkd")] if as_nobody else
                 [os.path.join(BIN, "tidemarkd")]) + ["--no-unix", "--listen", listen, "--port-file",
                 port_file, "--db", self.db, *options], stdout=log, stderr=subprocess.STDOUT,
                env=home_env(self.dir))
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("tidemarkd did not start: " + self.log())
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())
        self.address = "127.0.0.1:%d" % self.port

    def cli(self, *args, server=None, nobody=False, env=None):
        full = dict(os.environ)
        full.pop("TIDEMARK_TOKEN", None)
        full.update(env or {})
        if nobody:
            full["HOME"] = self.dir
        return subprocess.run((AS_NOBODY + [nobody_tool("tidemark")] if nobody else [TIDEMARK]) +
                              ["--server", server or self.address, *args],
                              capture_output=True, text=True, timeout=300, env=full)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def applicable_plan(path):
    with open(path, "w") as f:
        json.dump({"format": "tidemark-plan", "version": 1, "strategy": "optimal",
                   "budget_bytes": 1, "feasible": True,
                   "predicted": {"peak_bytes": 1, "extra_ns": 0, "step_ns": 0, "overhead": 0,
                                 "peak_at": {"phase": "forward"}},
                   "baseline": {"peak_bytes": 1, "step_ns": 0}, "lower_bound_extra_ns": 0,
                   "min_feasible_budget_bytes": 1,
                   "chain": {"name": "x", "stages": 1, "static_bytes": 0},
                   "segments": [{"mode": "recompute", "modules": ["Net.blocks.0"]}]}, f)
    os.chmod(path, 0o644)


class TokenTest(unittest.TestCase):
    """A daemon shared on this host that requires a token of every call: roles enforced."""

    def test_roles_of_tokens_are_enforced_and_only_hashes_are_kept(self):
        d = OwnDaemon("--require-token")
        os.chmod(d.dir, 0o755)  # the second uid reads the plan file there
        try:
            r = d.cli("sessions")
            self.assertEqual(r.returncode, 5)
            self.assertIn("refused (unauthenticated)", r.stderr)
            self.assertIn("requires a token", r.stderr)
            tokens = {}
            for role in ("ingest", "read", "control"):
                r = d.cli("token", "create", "--role", role, "--uid", str(NOBODY), "--name",
                          "for nobody", "--json")
                self.assertEqual(r.returncode, 0, r.stderr)
                tokens[role] = json.loads(r.stdout)["token"]
            with_token = lambda role: {"TIDEMARK_TOKEN": tokens[role]}
            # Only hashes in the store.
            for f in os.listdir(d.dir):
                if f.startswith("s.db"):
                    with open(os.path.join(d.dir, f), "rb") as fh:
                        data = fh.read()
                    for t in tokens.values():
                        self.assertNotIn(t.encode(), data, f)
            # ingest: streams a job, nothing else.
            r = d.cli("run", "--", *ALLOC_JOB, nobody=True, env=with_token("ingest"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("events sent to", r.stderr)
            r = d.cli("sessions", nobody=True, env=with_token("ingest"))
            self.assertEqual(r.returncode, 5)
            self.assertIn("needs a token with the read role; token 1 has the ingest role",
                          r.stderr)
            # read: the uid's sessions, no plans.
            r = d.cli("sessions", "--json", nobody=True, env=with_token("read"))
            self.assertEqual(r.returncode, 0, r.stderr)
            sessions = json.loads(r.stdout)["sessions"]
            self.assertEqual([s["owner_uid"] for s in sessions], [NOBODY])
            sid = str(sessions[0]["id"])
            self.assertEqual(d.cli("breakdown", sid, nobody=True,
                                   env=with_token("read")).returncode, 0)
            plan = os.path.join(d.dir, "plan.json")
            applicable_plan(plan)
            r = d.cli("apply", sid, plan, "--no-wait", nobody=True, env=with_token("read"))
            self.assertEqual(r.returncode, 5, r.stderr)
            self.assertIn("needs a token with the control role", r.stderr)
            # control: past the role check (the job has ended: the daemon says so).
            r = d.cli("apply", sid, plan, "--no-wait", nobody=True, env=with_token("control"))
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertNotIn("refused", r.stderr)
            # Tokens are managed by the daemon's own user or root only, by the kernel's word.
            r = d.cli("token", "create", "--role", "read", nobody=True,
                      env=with_token("control"))
            self.assertEqual(r.returncode, 5)
            self.assertIn("only the daemon's own user (uid 0) or root manage its tokens", r.stderr)
            # Revoked, or made up: refused.
            self.assertEqual(d.cli("token", "revoke", "2").returncode, 0)
            for token in (tokens["read"], "tdm_" + "0" * 64):
                r = d.cli("sessions", nobody=True, env={"TIDEMARK_TOKEN": token})
                self.assertEqual(r.returncode, 5)
                self.assertIn("the token is not one of this daemon's", r.stderr)
            listed = json.loads(d.cli("token", "list", "--json").stdout)["tokens"]
            self.assertEqual([(t["role"], t["revoked"]) for t in listed],
                             [("ingest", False), ("read", True), ("control", False)])
            self.assertIn("refused (127.0.0.1:", d.log())
        finally:
            d.stop()


class AllowGroupTest(unittest.TestCase):
    def test_members_of_the_allowed_group_see_every_session(self):
        d = OwnDaemon("--allow-group", str(NOBODY))  # the second uid's own group (nogroup)
        try:
            self.assertEqual(d.cli("run", "--", *ALLOC_JOB).returncode, 0)
            r = d.cli("sessions", "--json", nobody=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            sessions = json.loads(r.stdout)["sessions"]
            self.assertEqual([s["owner_uid"] for s in sessions], [0])
            self.assertEqual(d.cli("breakdown", str(sessions[0]["id"]), nobody=True).returncode, 0)
        finally:
            d.stop()


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = tempfile.mkdtemp(prefix="tidemark-pki-")
        os.chmod(cls.pki, 0o755)
        ext = os.path.join(cls.pki, "san.ext")
        ips = ["127.0.0.1"] + [a for a in subprocess.run(["hostname", "-I"], capture_output=True,
                                                          text=True).stdout.split()
                               if ":" not in a]
        with open(ext, "w") as f:
            f.write("subjectAltName=" + ",".join("IP:" + a for a in ips) + ",DNS:localhost\n")
        cls.other_ip = ips[1] if len(ips) > 1 else None

        def ssl(*args):
            subprocess.run(["openssl", *args], cwd=cls.pki, check=True, capture_output=True)
        for ca in ("ca", "other"):
            ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca + ".key", "-out",
                ca + ".pem", "-days", "2", "-subj", "/CN=tidemark test " + ca)
        for name, extra in (("server", ["-extfile", ext]), ("client", [])):
            ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                name + ".csr", "-subj", "/CN=" + name)
            ssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", *extra)
        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out",
            "rogue.pem", "-days", "2", "-subj", "/CN=localhost", "-addext",
            "subjectAltName=IP:127.0.0.1")
        for f in os.listdir(cls.pki):
            os.chmod(os.path.join(cls.pki, f), 0o644)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.pki, ignore_errors=True)

    def pem(self, name):
        return os.path.join(self.pki, name + ".pem")

    def server_tls(self):
        return ("--tls-cert", self.pem("server"), "--tls-key",
                os.path.join(self.pki, "server.key"))

    def test_agent_and_cli_over_tls_and_a_wrong_ca_fails_clearly(self):
        d = OwnDaemon(*self.server_tls())
        try:
            ca = ("--tls-ca", self.pem("ca"))
            r = d.cli(*ca, "run", "--", *ALLOC_JOB)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("events sent to %s" % d.address, r.stderr)
            listed = json.loads(d.cli(*ca, "sessions", "--json").stdout)["sessions"]
            self.assertEqual(len(listed), 1)
            self.assertEqual(listed[0]["owner_uid"], 0, "a loopback TLS caller is known by uid")
            self.assertGreater(listed[0]["events_stored"], 0)
            r = d.cli("--tls-ca", self.pem("other"), "sessions")
            self.assertEqual(r.returncode, 3)
            self.assertIn("the TLS handshake with %s failed: its certificate is not signed by "
                          "the CA given" % d.address, r.stderr)
            r = d.cli("sessions")
            self.assertEqual(r.returncode, 3)
            self.assertIn("a daemon with TLS needs --tls-ca", r.stderr)
        finally:
            d.stop()

    def test_an_unreadable_ca_never_falls_back_to_the_system_roots(self):
        d = OwnDaemon(*self.server_tls())
        spool = tempfile.mkdtemp(prefix="tidemark-spool-")
        try:
            missing = os.path.join(self.pki, "missing.pem")
            r = d.cli("--tls-ca", missing, "sessions")
            self.assertEqual(r.returncode, 2)
            self.assertIn("cannot read the PEM file %s" % missing, r.stderr)
            r = d.cli("run", "--", *ALLOC_JOB,
                      env={"TIDEMARK_TLS_CA": missing, "TIDEMARK_SPOOL_DIR": spool})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("not connecting to %s: cannot read the PEM file" % d.address, r.stderr)
            self.assertIn("events spooled to", r.stderr)
            self.assertEqual(len(os.listdir(spool)), 1, "the run is kept for an upload")
            self.assertEqual(json.loads(d.cli("--tls-ca", self.pem("ca"), "sessions",
                                              "--json").stdout)["sessions"], [])
        finally:
            d.stop()
            shutil.rmtree(spool, ignore_errors=True)

    def test_an_attached_agent_gets_the_tls_settings_and_token(self):
        d = OwnDaemon(*self.server_tls(), "--require-token")
        job = subprocess.Popen([PYTHON, "-u", SCRIPT, "--steps", "60", "--sleep", "0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ca = ("--tls-ca", os.path.relpath(self.pem("ca")))  # made absolute for the process
            token = json.loads(d.cli(*ca, "token", "create", "--role", "ingest",
                                     "--json").stdout)["token"]
            env = {"TIDEMARK_TOKEN": token}
            self.assertTrue(job.stdout.readline().startswith("step "))
            r = d.cli(*ca, "attach", str(job.pid), "--json", env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertGreater(json.loads(r.stdout)["session"], 0, "the daemon answered it")
            out, err = job.communicate(timeout=300)
            self.assertEqual(job.returncode, 0, err)
            reader = json.loads(d.cli(*ca, "token", "create", "--role", "read",
                                      "--json").stdout)["token"]
            listed = json.loads(d.cli(*ca, "sessions", "--json",
                                      env={"TIDEMARK_TOKEN": reader}).stdout)["sessions"]
            self.assertEqual([s["pid"] for s in listed], [job.pid])
            self.assertGreater(listed[0]["events_stored"], 0)
        finally:
            if job.poll() is None:
                job.kill()
            d.stop()

    def test_mutual_tls_and_callers_from_elsewhere_need_a_token(self):
        listen = "0.0.0.0:0" if self.other_ip else "127.0.0.1:0"
        d = OwnDaemon(*self.server_tls(), "--tls-client-ca", self.pem("ca"), listen=listen)
        try:
            ca = ("--tls-ca", self.pem("ca"))
            mine = ("--tls-cert", self.pem("client"), "--tls-key",
                    os.path.join(self.pki, "client.key"))
            r = d.cli(*ca, "sessions")
            self.assertEqual(r.returncode, 3, "no client certificate, no connection")
            self.assertIn("TLS handshake", r.stderr)
            r = d.cli(*ca, *mine, "run", "--", *ALLOC_JOB)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("events sent to", r.stderr)
            self.assertEqual(d.cli(*ca, *mine, "sessions").returncode, 0)
            if not self.other_ip:
                return  # no address but loopback on this machine: the rest needs one
            remote = "%s:%d" % (self.other_ip, d.port)
            r = d.cli(*ca, *mine, "sessions", server=remote)
            self.assertEqual(r.returncode, 5)
            self.assertIn("refused (unauthenticated)", r.stderr)
            self.assertIn("present a token", r.stderr)
            token = json.loads(d.cli(*ca, *mine, "token", "create", "--role", "read",
                                     "--json").stdout)["token"]
            r = d.cli(*ca, *mine, "sessions", "--json", server=remote,
                      env={"TIDEMARK_TOKEN": token})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(len(json.loads(r.stdout)["sessions"]), 1)
            r = d.cli(*ca, *mine, "token", "list", server=remote, env={"TIDEMARK_TOKEN": token})
            self.assertEqual(r.returncode, 5, "tokens are managed from this host only")
        finally:
            d.stop()

    def test_a_rogue_daemon_gets_nothing_from_a_job_that_checks_the_certificate(self):
        rogue_dir = nobody_dir()
        for f in ("rogue.pem", "rogue.key"):
            shutil.copy(os.path.join(self.pki, f), rogue_dir)
            os.chown(os.path.join(rogue_dir, f), NOBODY, NOBODY)
        rogue = OwnDaemon("--tls-cert", os.path.join(rogue_dir, "rogue.pem"), "--tls-key",
                          os.path.join(rogue_dir, "rogue.key"), as_nobody=True,
                          directory=rogue_dir)
        spool = tempfile.mkdtemp(prefix="tidemark-spool-")
        try:
            r = rogue.cli("--tls-ca", self.pem("ca"), "run", "--", *ALLOC_JOB,
                          env={"TIDEMARK_SPOOL_DIR": spool, "TIDEMARK_TOKEN": "tdm_" + "1" * 64})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("events spooled to", r.stderr)
            con = sqlite3.connect("file:%s?mode=ro" % rogue.db, uri=True)
            self.assertEqual(con.execute("SELECT COUNT(*) FROM session").fetchone()[0], 0)
            con.close()
            self.assertNotIn("tdm_111", rogue.log())
            self.assertEqual(len(os.listdir(spool)), 1)
        finally:
            rogue.stop()
            shutil.rmtree(spool, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
