"""Shared helpers for the end-to-end tests: start a real tidemarkd on a free loopback port with its
own SQLite file, run the real CLI, and read the store directly for ground-truth joins.

With TIDEMARK_TEST_STORE=postgresql the daemons of a suite keep their store in a database of
their own on the tests' PostgreSQL server (its URI in the file TIDEMARK_TEST_POSTGRES_FILE names;
ctest's `postgres` fixture starts it): the same suite, the same assertions, the other backend."""
import atexit
import functools
import json
import os
import signal
import shutil
import sqlite3
import socket
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("TIDEMARK_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
SOURCE = os.environ.get("TIDEMARK_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
# The interpreter of the jobs: Debian's, with Debian's torch 1.13, or (TIDEMARK_TORCH_PYTHON) the
# virtual environment's with torch 2.x (scripts/install-deps.sh).
PYTHON = os.environ.get("TIDEMARK_TORCH_PYTHON") or "/usr/bin/python3"
if not os.access(PYTHON, os.X_OK):
    raise RuntimeError("TIDEMARK_TORCH_PYTHON=%s is not there: scripts/install-deps.sh makes the "
                       "torch 2 environment" % PYTHON)



@functools.lru_cache(maxsize=None)
def torch_version_string():
    """torch.__version__ of the jobs' torch (asked once: importing torch takes seconds)."""
    return subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def torch_version():
    """(major, minor) of the jobs' torch."""
    return tuple(int(x) for x in torch_version_string().split("+")[0].split(".")[:2])


# Nothing the tests run writes into the user's own directories: a daemon started on demand, its
# store and the agent's spool files go under this run's directory, removed (and such a daemon
# stopped) at exit.
PRIVATE_DIRS = tempfile.mkdtemp(prefix="tidemark-e2e-xdg-")
for _var in ("XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_STATE_HOME"):
    os.environ[_var] = os.path.join(PRIVATE_DIRS, _var.lower())


STORE_BACKEND = os.environ.get("TIDEMARK_TEST_STORE", "sqlite")
if STORE_BACKEND not in ("sqlite", "postgresql"):
    raise RuntimeError("TIDEMARK_TEST_STORE=%s: sqlite or postgresql" % STORE_BACKEND)


def fresh_postgres_database():
    """A new, empty database on the tests' PostgreSQL server: its URI (fails, saying how to get a
    server, when there is none)."""
    import psycopg2  # Debian's python3-psycopg2 (scripts/install-deps.sh)
    uri_file = os.environ.get("TIDEMARK_TEST_POSTGRES_FILE", "")
    if not uri_file or not os.path.exists(uri_file):
        raise RuntimeError("TIDEMARK_TEST_STORE=postgresql needs the tests' PostgreSQL server: run "
                           "the suite with ctest (its postgres fixture), or start one with "
                           "scripts/postgres-test-server.sh start FILE and set "
                           "TIDEMARK_TEST_POSTGRES_FILE=FILE")
    with open(uri_file) as f:
        admin = f.read().strip()
    name = "e2e_%d_%d" % (os.getpid(), fresh_postgres_database.count)
    fresh_postgres_database.count += 1
    con = psycopg2.connect(admin)
    try:
        con.autocommit = True
        con.cursor().execute("DROP DATABASE IF EXISTS " + name)
        con.cursor().execute("CREATE DATABASE " + name)
    finally:
        con.close()
    head, _, query = admin.partition("?")
    return head[:head.index("/", head.index("://") + 3) + 1] + name + ("?" + query if query else "")


fresh_postgres_database.count = 0


def stop_daemon_of_store(db):
    """Stops the tidemarkd holding the store db (its pid is in the store's lock file)."""
    try:
        with open(db + ".lock") as f:
            pid = int(f.read().split()[0])
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        return
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.05)


@atexit.register
def _remove_private_dirs():
    stop_daemon_of_store(os.path.join(os.environ["XDG_DATA_HOME"], "tidemark", "tidemark.db"))
    shutil.rmtree(PRIVATE_DIRS, ignore_errors=True)


class Daemon:
    """A tidemarkd process for one test class."""

    def __init__(self, *extra_args):
        self.dir = tempfile.mkdtemp(prefix="tidemark-e2e-")
        self.db = os.path.join(self.dir, "store.db")
        # The store the daemon is given: this file, or a PostgreSQL database (see the top).
        self.store = fresh_postgres_database() if STORE_BACKEND == "postgresql" else self.db
        self.log = open(os.path.join(self.dir, "tidemarkd.log"), "w")
        self._start(extra_args)

    def _start(self, extra_args):
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix", "--store",
             self.store, "--port-file", port_file, *extra_args], stdout=self.log,
            stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("tidemarkd did not start: " + self.read_log())
            time.sleep(0.05)
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()

    def kill_and_restart(self, *extra_args):
        """SIGKILL (nothing the daemon can do about it), then a new tidemarkd on the same store."""
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._start(extra_args)

    def read_log(self):
        with open(os.path.join(self.dir, "tidemarkd.log")) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()
        return self.proc.returncode

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def cli(self, *args, check=True):
        r = subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.address, *args],
                           capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise AssertionError("tidemark %s failed (%d): %s" % (" ".join(args), r.returncode,
                                                                  r.stderr))
        return r

    def cli_json(self, *args):
        return json.loads(self.cli(*args, "--json").stdout)

    def run(self, *cmd, env=None, timeout=600, run_options=()):
        """`tidemark run [run_options] -- cmd`: returns the CompletedProcess."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run([os.path.join(BIN, "tidemark"), "--server", self.address, "run",
                               *run_options, "--", *cmd], capture_output=True, text=True,
                              timeout=timeout, env=full_env)

    def session_for_pid(self, pid):
        for s in self.cli_json("sessions")["sessions"]:
            if s["pid"] == pid:
                return s
        raise AssertionError("no session for pid %d" % pid)

    def wait_analyzed(self, session_id, timeout=120):
        """Waits until the daemon has stored the session's analysis."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for s in self.cli_json("sessions")["sessions"]:
                if s["id"] == session_id and s["analyzed"]:
                    return s
            time.sleep(0.1)
        raise AssertionError("session %d was not analyzed in %ds" % (session_id, timeout))

    def wait_live_steps(self, steps, timeout=300):
        """The newest live session's id once it has run `steps` steps (the running one
        counted)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            live = [s for s in self.cli_json("sessions")["sessions"] if s["state"] == "live"]
            if live and live[-1]["steps"] >= steps:
                return live[-1]["id"]
            time.sleep(0.1)
        raise AssertionError("no live session reached %d steps in %ds" % (steps, timeout))

    def wait_ended(self, session_id, timeout=120):
        """Waits until the session has ended (its agent may have handed the rest of its run to
        the daemon in a file, which the daemon stores after the job's exit)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for s in self.cli_json("sessions")["sessions"]:
                if s["id"] == session_id and s["state"] != "live":
                    return s
            time.sleep(0.1)
        raise AssertionError("session %d did not end in %ds" % (session_id, timeout))

    def newest_session(self, wait_ended=True):
        """The newest session; by default once it is no longer live (its job has exited; the
        daemon may still be storing what the agent handed over at exit)."""
        sessions = self.cli_json("sessions")["sessions"]
        assert sessions, "no sessions"
        if wait_ended and sessions[-1]["state"] == "live":
            return self.wait_ended(sessions[-1]["id"])
        return sessions[-1]

    def sql(self, query, *params):
        return store_sql(self.store, query, *params)


def plan_doc(segments):
    """A plan document (tidemark-plan, version 1) with the segments given and figures of no
    meaning: what `tidemark.apply_plan` and the daemon take."""
    return {"format": "tidemark-plan", "version": 1, "strategy": "optimal", "budget_bytes": 1,
            "feasible": True, "predicted": {"peak_bytes": 1, "extra_ns": 0, "step_ns": 0,
                                            "overhead": 0, "peak_at": {"phase": "forward"}},
            "baseline": {"peak_bytes": 1, "step_ns": 0}, "lower_bound_extra_ns": 0,
            "min_feasible_budget_bytes": 1, "chain": {"name": "x", "stages": 1, "static_bytes": 0},
            "segments": segments}


def store_sql(store, query, *params):
    """The rows of QUERY (with ? placeholders) on a store: a PostgreSQL URI, or an SQLite file
    (opened read-only)."""
    if store.startswith("postgresql:"):
        import psycopg2
        con = psycopg2.connect(store)
        try:
            cur = con.cursor()
            cur.execute(query.replace("?", "%s"), params)
            return cur.fetchall()
        finally:
            con.close()
    con = sqlite3.connect("file:%s?mode=ro" % store, uri=True)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


def live_bytes_at(daemon, session, seq, snapshot):
    """Bytes, live just after event `seq`, of the blocks that held the snapshot's addresses at the
    moment the snapshot was taken (an address is reused over time, so the moment matters)."""
    total = 0
    for addr in snapshot["storages"]:
        rows = daemon.sql(
            "SELECT size_bytes FROM allocation WHERE session_id = ? AND address = ? AND "
            "alloc_ts_ns <= ? AND (free_ts_ns IS NULL OR free_ts_ns > ?) AND "
            "alloc_seq <= ? AND (free_seq IS NULL OR free_seq > ?)",
            session, int(addr), snapshot["ts"], snapshot["ts"], seq, seq)
        total += sum(r[0] for r in rows)
    return total


class DaemonTestCase(unittest.TestCase):
    """A test class with one tidemarkd of its own (self.daemon), started before its tests and
    cleaned up after them."""
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        # Also when a subclass's setUpClass fails after this (tearDownClass is not run then).
        cls.addClassCleanup(cls.daemon.cleanup)

    @classmethod
    def tearDownClass(cls):
        if cls.daemon:
            cls.daemon.cleanup()


# tidemark.v1.Category, by number.
CATEGORY_NAMES = {1: "WEIGHT", 2: "GRADIENT", 3: "OPTIMIZER_STATE", 4: "ACTIVATION",
                  5: "CHECKPOINT_INPUT", 6: "RECOMPUTED", 7: "INPUT", 8: "TEMPORARY",
                  9: "WORKSPACE", 10: "ALLOCATOR_SLACK", 11: "UNKNOWN"}


def block_categories(daemon, session):
    """{allocation id: category name} as the session's stored analysis decided them (the
    block_category table: a byte a block, in allocation id order, category in the low 4 bits)."""
    ids = [r[0] for r in daemon.sql("SELECT id FROM allocation WHERE session_id = ? ORDER BY id",
                                    session)]
    codes = b"".join(r[0] for r in daemon.sql("SELECT codes FROM block_category WHERE "
                                               "session_id = ? ORDER BY chunk", session))
    assert len(codes) == len(ids), "%d categories for %d blocks" % (len(codes), len(ids))
    return {i: CATEGORY_NAMES[c & 0xF] for i, c in zip(ids, codes)}


def blocks_of(daemon, session, snapshot):
    """[(allocation id, bytes)] of the blocks that held the snapshot's addresses at its moment."""
    out = []
    for addr in snapshot["storages"]:
        out += daemon.sql("SELECT id, size_bytes FROM allocation WHERE session_id = ? AND "
                          "address = ? AND alloc_ts_ns <= ? AND (free_ts_ns IS NULL OR "
                          "free_ts_ns > ?)", session, int(addr), snapshot["ts"], snapshot["ts"])
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(daemon, out_dir, world, big_rank=-1, steps=4, under_tidemark=True, model="mlp",
                wait=True):
    """The ranks of one data-parallel job (tests/e2e/ddp_train.py), started as a cluster launch
    script does (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each under `tidemark run` unless
    asked otherwise. Waits for them (their exit checked) unless wait is False. Returns the job's
    MASTER_PORT and the ranks' processes."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [PYTHON, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py"),
               "--model", model, "--steps", str(steps), "--out-dir", out_dir,
               "--big-rank", str(big_rank), "--big-batch", "1024"]
        if under_tidemark:
            cmd = [os.path.join(BIN, "tidemark"), "--server", daemon.address, "run", "--"] + cmd
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    if wait:
        for p in procs:
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise AssertionError("a rank failed (%d): %s" % (p.returncode, err))
    return port, procs


class CuttableProxy:
    """A TCP proxy on loopback between agents and a daemon that can hold back what the daemon
    says on the connections open now (`hold_replies`) and then cut them (`cut`), as a network
    that breaks right after the daemon answered does; connections made after a cut pass both
    ways again."""

    def __init__(self, target_port):
        import threading
        self._threading = threading
        self.target_port = target_port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open = []  # [client, server, holding]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            pair = [client, server, False]
            with self.lock:
                self.open.append(pair)
                self.accepted += 1
            for src, dst, replies in ((client, server, False), (server, client, True)):
                self._threading.Thread(target=self._pump, args=(pair, src, dst, replies),
                                       daemon=True).start()

    @staticmethod
    def _pump(pair, src, dst, replies):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                src.close()
                return
            if replies and pair[2]:
                continue  # held back: never delivered
            try:
                dst.sendall(data)
            except OSError:
                return

    def hold_replies(self):
        with self.lock:
            for pair in self.open:
                pair[2] = True

    def cut(self):
        """Closes every connection open now, both ways."""
        with self.lock:
            pairs, self.open = self.open, []
        for client, server, _ in pairs:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)  # wakes the pumps
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.listener.close()
        self.cut()
