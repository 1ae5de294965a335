"""End to end: `tidemark import` on every recording in ../shared/data/real, checked against the
figures each file holds (computed here from the file itself, and from its SOURCES.md /
inspection.jsonl entry), and on bad files, which must store nothing."""
import collections
import decimal
import gzip
import json
import os
import pickle
import random
import unittest

from tidemark_env import SOURCE, Daemon

# The real recordings live beside the repository (../shared/data/real), not in it.
REAL = os.environ.get("TIDEMARK_REAL_DATA",
                      os.path.join(SOURCE, "..", "shared", "data", "real"))
HAVE_REAL = os.path.isfile(os.path.join(REAL, "inspection.jsonl"))
CORPUS = os.path.join(SOURCE, "tests", "fuzz", "corpus")


def real_files(suffixes):
    out = []
    for root, _, files in os.walk(REAL):
        for f in sorted(files):
            if f.endswith(suffixes):
                out.append(os.path.join(root, f))
    return sorted(out)


def inspection():
    facts = {}
    with open(os.path.join(REAL, "inspection.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            facts[d["file"]] = d
    return facts


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused: %s.%s" % (module, name))


def snapshot_truth(path):
    """Reserved and allocated at the dump, and the absolute peak: allocated when the trace began
    (the dump less the trace's net) plus the running maximum over the trace."""
    with open(path, "rb") as f:
        d = _NoGlobals(f).load()
    segments = d["segments"] if isinstance(d, dict) else d
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(b["size"] for s in segments for b in s.get("blocks", [])
                    if b.get("state") in ("active_allocated", "active_pending_free"))
    traces = d.get("device_traces", []) if isinstance(d, dict) else []
    entries = sorted((e for t in traces for e in t), key=lambda e: e["time_us"])
    running = peak = 0
    for e in entries:
        if e["action"] == "alloc":
            running += e["size"]
        elif e["action"] == "free_completed":
            running -= e["size"]
        peak = max(peak, running)
    start = allocated - running
    return {"reserved": reserved, "allocated": allocated, "peak": start + peak}


@unittest.skipUnless(HAVE_REAL, "../shared/data/real is not beside this checkout")
class ImportRealTest(unittest.TestCase):
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.facts = inspection()

    @classmethod
    def tearDownClass(cls):
        if cls.daemon:
            cls.daemon.cleanup()

    def imported(self, path):
        r = self.daemon.cli("import", path, "--json")
        info = json.loads(r.stdout)
        self.daemon.wait_analyzed(info["session"])
        return info

    def test_memory_snapshots(self):
        files = real_files((".pickle",))
        self.assertGreater(len(files), 0)
        for path in files:
            with self.subTest(file=os.path.relpath(path, REAL)):
                truth = snapshot_truth(path)
                info = self.imported(path)
                sid = str(info["session"])
                self.assertEqual(info["reserved_bytes"], truth["reserved"])
                self.assertEqual(info["allocated_at_end_bytes"], truth["allocated"])
                end = self.daemon.cli_json("breakdown", sid, "--at", "end")
                self.assertEqual(end["tracked_bytes"], truth["allocated"])
                self.assertEqual(end["reserved_bytes"], truth["reserved"])
                peak = self.daemon.cli_json("breakdown", sid)
                self.assertEqual(peak["tracked_bytes"], truth["peak"])
                fact = self.facts.get(os.path.relpath(path, REAL))
                if fact:  # the figures SOURCES.md quotes
                    self.assertEqual(info["reserved_bytes"], fact["segment_reserved_bytes"])
                    self.assertEqual(info["allocated_at_end_bytes"], fact["segment_allocated_bytes"])
                    window = fact["trace_window_peak_bytes_per_device"][0]
                    self.assertEqual(peak["tracked_bytes"], info["preexisting_bytes"] + window)

    def test_sessions_name_them(self):
        """`tidemark sessions` has a NAME column once a session has a name: an imported file's,
        cut in its middle when long (both ends kept)."""
        path = real_files((".pickle",))[0]
        self.imported(path)
        name = os.path.basename(path)
        lines = self.daemon.cli("sessions").stdout.splitlines()
        self.assertIn("NAME", lines[0].split())
        shown = name if len(name) <= 24 else name[:10] + "..." + name[-11:]
        self.assertTrue(any(shown in line for line in lines[1:]), (shown, lines))

    def test_cs336_training_categories(self):
        # 423,183,360 fp32 parameters; AdamW keeps two moments of each (SOURCES.md).
        params = 423183360 * 4
        for path in real_files(("_training_memory_snapshot.pickle",)):
            with self.subTest(file=os.path.basename(path)):
                info = self.imported(path)
                cats = self.daemon.cli_json("breakdown", str(info["session"]), "--at",
                                            "end")["categories"]
                self.assertLessEqual(abs(cats["WEIGHT"]["bytes"] - params), 0.01 * params)
                self.assertLessEqual(abs(cats["OPTIMIZER_STATE"]["bytes"] - 2 * params),
                                     0.01 * 2 * params)
                self.assertEqual(cats["GRADIENT"]["bytes"], params)
                # At the peak (in the optimizer's step) nearly everything is explained: the
                # moments from before the trace are those the optimizer replaces.
                peak = self.daemon.cli_json("breakdown", str(info["session"]))
                at = {k: v["bytes"] for k, v in peak["categories"].items()}
                self.assertLessEqual(at.get("UNKNOWN", 0), 0.05 * peak["tracked_bytes"], at)
                # Its optimizer state is the dump's, plus the moments of at most one parameter
                # (the largest: 10,000 x 1,024 fp32) held twice while they are replaced.
                largest = 10000 * 1024 * 4
                self.assertGreaterEqual(at["OPTIMIZER_STATE"], cats["OPTIMIZER_STATE"]["bytes"])
                self.assertLessEqual(at["OPTIMIZER_STATE"],
                                     cats["OPTIMIZER_STATE"]["bytes"] + 2 * largest)
                # Each tensor at the peak names its block, whose history has its stack.
                top = self.daemon.cli_json("peak", str(info["session"]))["tensors"]
                state = next(t for t in top if t["category"] == "OPTIMIZER_STATE"
                             and t["name"].startswith("[frames:optimizer]"))
                life = self.daemon.cli_json("block", str(info["session"]),
                                            hex(state["address"]))["blocks"]
                self.assertEqual(len(life), 1)
                self.assertEqual(life[0]["category"], "OPTIMIZER_STATE")
                self.assertEqual(life[0]["size_bytes"], state["bytes"])
                self.assertFalse(life[0]["freed"])  # alive at the dump
                self.assertTrue(life[0]["frames"][0].startswith("step ("), life[0]["frames"])
                self.assertTrue(any("nsys_profile.py" in f for f in life[0]["frames"]))
                self.assertEqual([t["name"] for t in life[0]["tags"]], [state["name"]])
                r = self.daemon.cli("block", str(info["session"]), "0x10", check=False)
                self.assertEqual(r.returncode, 1)
                self.assertIn("held no block at 0x10", r.stderr)
                # One recorded step is one step (not the 24 layers' repetitions).
                steps = self.daemon.cli_json("steps", str(info["session"]))["steps"]
                self.assertEqual(len(steps), 1, [s["step"] for s in steps])

    def test_kineto_times_are_the_files(self):
        """Each step lasts what the CPU's ProfilerStep#N annotation says (not its GPU twin's),
        and each kernel's time is the file's to the nanosecond (integer microseconds at epoch
        time do not fit a double's nanoseconds)."""
        files = [p for p in real_files((".json.gz", ".json"))
                 if self.facts.get(os.path.relpath(p, REAL), {}).get("kind") == "chrome_trace(kineto)"]
        for path in files:
            with self.subTest(file=os.path.relpath(path, REAL)):
                with gzip.open(path, "rt") as f:
                    events = json.load(f, parse_float=decimal.Decimal)["traceEvents"]
                ns = lambda us: int(decimal.Decimal(us) * 1000)
                want_steps = {int(e["name"][13:]): ns(e["dur"]) for e in events
                              if e.get("name", "").startswith("ProfilerStep#")
                              and not e.get("cat", "").startswith("gpu_")}
                want_kernels = collections.Counter()
                for e in events:
                    if e.get("cat") in ("kernel", "Kernel") and e.get("ph") == "X":
                        want_kernels[e["name"]] += ns(e["dur"])
                sid = str(self.imported(path)["session"])
                steps = self.daemon.cli_json("steps", sid)["steps"]
                self.assertEqual({s["step"]: s["end_ts_ns"] - s["begin_ts_ns"] for s in steps},
                                 want_steps)
                got = {o["name"]: o["total_ns"] for o in self.daemon.cli_json("ops", sid)["ops"]
                       if o["kind"] == "kernel"}
                self.assertEqual(got, dict(want_kernels))

    def test_kineto_memory_is_explained(self):
        """A trace with module events: at its peak at most 10 % is UNKNOWN, and every block
        allocated in the trace has the op that allocated it."""
        files = [p for p in real_files((".json.gz", ".json"))
                 if self.facts.get(os.path.relpath(p, REAL), {}).get("meta", {}).get("with_modules")
                 and self.facts[os.path.relpath(p, REAL)].get("gpu_memory_events")]
        self.assertGreater(len(files), 0)
        for path in files:
            with self.subTest(file=os.path.relpath(path, REAL)):
                info = self.imported(path)
                peak = self.daemon.cli_json("peak", str(info["session"]))
                tracked = peak["breakdown"]["tracked_bytes"]
                unknown = peak["breakdown"]["categories"].get("UNKNOWN", {}).get("bytes", 0)
                self.assertLessEqual(unknown, 0.10 * tracked)
                no_op = sum(o["bytes"] for o in peak["ops"] if o["name"] == "(no op)")
                self.assertLessEqual(no_op, info["preexisting_bytes"])  # only what came before
                self.assertGreater(sum(o["bytes"] for o in peak["ops"] if o["name"] != "(no op)"),
                                   0)

    def test_kineto_traces(self):
        files = [p for p in real_files((".json.gz", ".json"))
                 if self.facts.get(os.path.relpath(p, REAL), {}).get("kind") == "chrome_trace(kineto)"]
        self.assertGreater(len(files), 0)
        for path in files:
            fact = self.facts[os.path.relpath(path, REAL)]
            with self.subTest(file=os.path.relpath(path, REAL)):
                info = self.imported(path)
                sid = str(info["session"])
                self.assertEqual(info["ops"], fact["cpu_op_events"])
                self.assertEqual(info["kernels"], fact["kernel_events"])
                ops = self.daemon.cli_json("ops", sid)["ops"]
                self.assertEqual(sum(o["calls"] for o in ops if o["kind"] == "kernel"),
                                 fact["kernel_events"])
                self.assertEqual(sum(o["calls"] for o in ops if o["kind"] == "op"),
                                 fact["cpu_op_events"])
                if fact.get("gpu_memory_events"):
                    peak = self.daemon.cli_json("breakdown", sid)["tracked_bytes"]
                    if "gpu_max_total_allocated" in fact:
                        self.assertEqual(peak, fact["gpu_max_total_allocated"])
                        self.assertEqual(info["stated_peak_bytes"], fact["gpu_max_total_allocated"])
                        self.assertEqual(info["reserved_bytes"], fact["gpu_max_total_reserved"])
                        # The peak query reports the reserved bytes at the peak too.
                        reserved = self.daemon.cli_json("breakdown", sid)["reserved_bytes"]
                        self.assertTrue(peak <= reserved <= fact["gpu_max_total_reserved"])
                        # And so does each step's peak in `steps`.
                        for st in self.daemon.cli_json("steps", sid)["steps"]:
                            self.assertTrue(st["peak"]["tracked_bytes"]
                                            <= st["peak"]["reserved_bytes"]
                                            <= fact["gpu_max_total_reserved"], st["step"])
                    else:  # the 2021 schema: deltas only
                        self.assertEqual(peak - info["preexisting_bytes"],
                                         fact["gpu_replayed_peak_delta_bytes"])
                # The Chrome trace export carries every kernel and op.
                exported = os.path.join(self.daemon.dir, "export-%s.json" % sid)
                self.daemon.cli("export", sid, "-o", exported)
                with open(exported) as f:
                    cats = [e.get("cat") for e in json.load(f)["traceEvents"]]
                self.assertEqual(cats.count("kernel"), fact["kernel_events"])
                self.assertEqual(cats.count("op"), fact["cpu_op_events"])
                if fact.get("meta", {}).get("with_modules"):
                    self.assertGreater(info["modules"], 0)
                    self.assertEqual(sum(o["calls"] for o in ops if o["kind"] == "module"),
                                     info["modules"])
                steps = fact.get("ProfilerStep_events", 0)
                if steps:
                    self.assertGreater(self.daemon.cli_json("sessions")["sessions"][-1]["steps"], 0)

    def test_other_files_are_refused_clearly(self):
        for path in real_files((".json.gz", ".raw.gz", ".csv")):
            fact = self.facts.get(os.path.relpath(path, REAL), {})
            if fact.get("kind") == "chrome_trace(kineto)":
                continue
            with self.subTest(file=os.path.relpath(path, REAL)):
                before = len(self.daemon.cli_json("sessions")["sessions"])
                r = self.daemon.cli("import", path, check=False)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn("nothing stored", r.stderr)
                self.assertEqual(len(self.daemon.cli_json("sessions")["sessions"]), before)


class ImportBadInputTest(unittest.TestCase):
    def test_bad_files_store_nothing(self):
        daemon = Daemon()
        try:
            with open(os.path.join(CORPUS, "pickle", "snapshot_p4.pickle"), "rb") as f:
                data = f.read()
            cases = {
                "truncated.pickle": (data[: len(data) // 2], "pickle"),
                "global.pickle": (b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os"
                                  b"\x8c\x06system\x93.", "refers to a global"),
                "reduce.pickle": (b"\x80\x02cos\nsystem\nq\x00.", "refers to a global"),
                "notgzip.json.gz": (b"{\"traceEvents\": []}", "not gzip"),
                "badgzip.json.gz": (gzip.compress(b"{\"traceEvents\": [")[:-6], "gzip"),
                "notatrace.json": (b"{\"hello\": 1}", "no traceEvents"),
                "notjson.json": (b"{\"traceEvents\": [", "not valid JSON"),
                "absurd.json": (json.dumps({"traceEvents": [
                    {"name": "[memory]", "ph": "i", "ts": 1, "args": {
                        "Device Type": 1, "Device Id": 0, "Bytes": 1 << 62}}]}).encode(),
                    "absurd"),
                "empty.json": (b"{\"traceEvents\": []}", "no memory or op events"),
                # Random, but the same every run and not starting as JSON would ('{' or '['
                # sends it to the trace importer: "not valid JSON", 2 runs in 256 with urandom).
                "random.bin": (b"\xff" + random.Random(20261205).randbytes(4095),
                               "not a PyTorch memory snapshot"),
                "deep.pickle": (b"\x80\x02" + b"]" * 300000 + b"a" * 299999 + b".",
                                "nested deeper than 10000 levels"),
            }
            for name, (content, message) in cases.items():
                with self.subTest(file=name):
                    path = os.path.join(daemon.dir, name)
                    with open(path, "wb") as f:
                        f.write(content)
                    r = daemon.cli("import", path, check=False)
                    self.assertNotEqual(r.returncode, 0, r.stdout)
                    self.assertIn(message, r.stderr)
            # A small gzip that inflates past --max-size; a file over it is not even read.
            bomb = os.path.join(daemon.dir, "bomb.json.gz")
            with open(bomb, "wb") as f:
                f.write(gzip.compress(b" " * (8 << 20)))
            r = daemon.cli("import", bomb, "--max-size", "4MiB", check=False)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("inflates to more than 4.00 MiB (raise the limit with --max-size)",
                          r.stderr)
            r = daemon.cli("import", bomb, "--max-size", "1KiB", check=False)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("is larger than 1.00 KiB", r.stderr)
            r = daemon.cli("import", bomb, "--max-size", "lots", check=False)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(daemon.cli_json("sessions")["sessions"], [])
            r = daemon.cli("import", os.path.join(daemon.dir, "missing.pickle"), check=False)
            self.assertEqual(r.returncode, 2)
        finally:
            daemon.cleanup()


if __name__ == "__main__":
    unittest.main()
