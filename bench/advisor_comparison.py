"""The advisor beside the standard recomputation methods, for bench/run.sh, measured live: the
examples' GPT (examples/train.py) trained under `tidemark run` with each method applied as a plan
(tidemark.apply_plan, the same seed), its peak and step time measured from the recording; then
tidemark's own plan for that method's measured peak as the budget, measured the same way.

Methods (all eager, each a plan document, docs/plan-format.md):
  store-all       no recomputation
  checkpoint-all  every block recomputed (what `checkpoint` around each block does)
  sqrt-n          Chen et al.'s segments of about sqrt(n) blocks, each recomputed whole
  selective-attn  Megatron-style selective recomputation: every block's attention recomputed,
                  the rest of the block stored
Each row: the method's measured peak and median step time; tidemark's plan at that peak as its
budget: its measured peak and median step time, and its time over the method's.

    python3 bench/advisor_comparison.py BIN PYTHON [LAYERS] [STEPS] [--markdown]

PYTHON: the interpreter (its torch) the training runs under. Peaks: the median of the steps'
peaks after the first; step times: the median of the steps after the first (the first creates
the optimizer state). CPU times on a busy machine vary by several percent between runs.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "train.py")


class Bench:
    def __init__(self, bin_dir, python, layers, steps):
        self.tidemark = os.path.join(bin_dir, "tidemark")
        self.python, self.layers, self.steps = python, layers, steps
        self.work = tempfile.mkdtemp(prefix="tidemark-bench-advisor-")
        port_file = os.path.join(self.work, "port")
        self.daemon = subprocess.Popen(
            [os.path.join(bin_dir, "tidemarkd"), "--listen", "127.0.0.1:0", "--no-unix", "--db",
             os.path.join(self.work, "store.db"), "--port-file", port_file],
            stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.1)
        self.server = "127.0.0.1:" + open(port_file).read().strip()

    def close(self):
        self.daemon.terminate()
        self.daemon.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    def cli(self, *args):
        r = subprocess.run([self.tidemark, "--server", self.server, *args], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit("tidemark %s: %s" % (" ".join(args), r.stderr.strip()))
        return r.stdout

    def cli_json(self, *args):
        return json.loads(self.cli(*args, "--json"))

    def train(self, plan=None):
        """(session, median steady peak bytes, median steady step ns) of one training."""
        args = [self.tidemark, "--server", self.server, "run", "--quiet", "--", self.python,
                TRAIN, "--model", "gpt", "--layers", str(self.layers), "--steps",
                str(self.steps), "--checkpoint", ""]
        if plan:
            args += ["--plan", plan]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("training failed: %s" % r.stderr[-2000:])
        sid = max(s["id"] for s in self.cli_json("sessions")["sessions"])
        for _ in range(1200):  # until the daemon has stored its analysis
            if any(s["id"] == sid and s["analyzed"] for s in self.cli_json("sessions")["sessions"]):
                break
            time.sleep(0.1)
        sid = str(sid)
        steps = self.cli_json("steps", sid)["steps"][1:]
        peak = statistics.median(s["peak"]["tracked_bytes"] for s in steps)
        step_ns = statistics.median(s["end_ts_ns"] - s["begin_ts_ns"] for s in steps)
        return sid, int(peak), int(step_ns)

    def plan(self, source, out, *args):
        self.cli("plan", source, *args, "--out", out)
        with open(out) as f:
            return json.load(f)


def selective_attention_plan(template, path):
    """Every block stored but its attention, which is recomputed (Megatron's selective
    recomputation), written from the store-all plan's document."""
    plan = dict(template)
    plan["strategy"] = "selective-attn"
    plan["segments"] = [{"mode": "selective", "modules": [m], "option": "recompute attn",
                         "recompute": [m + ".attn"]}
                        for seg in template["segments"] for m in seg["modules"]]
    with open(path, "w") as f:
        json.dump(plan, f)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    bin_dir, python = args[0], args[1]
    layers = int(args[2]) if len(args) > 2 else 8
    steps = int(args[3]) if len(args) > 3 else 6
    b = Bench(bin_dir, python, layers, steps)
    try:
        base, base_peak, base_ns = b.train()
        plans = {}
        for strategy in ("checkpoint-all", "sqrt-n"):
            plans[strategy] = os.path.join(b.work, strategy + ".json")
            b.plan(base, plans[strategy], "--strategy", strategy, "--budget", "100%")
        store_all = b.plan(base, os.path.join(b.work, "store-all.json"), "--strategy",
                           "store-all", "--budget", "100%")
        plans["selective-attn"] = os.path.join(b.work, "selective-attn.json")
        selective_attention_plan(store_all, plans["selective-attn"])
        rows = [("store-all", base_peak, base_ns, None)]
        for method, path in plans.items():
            _, peak, ns = b.train(path)
            ours = os.path.join(b.work, "tidemark-at-" + method + ".json")
            plan = b.plan(base, ours, "--budget", str(peak))
            _, our_peak, our_ns = b.train(ours)
            segs = " ".join(s["mode"][:3] + "(" + ",".join(m.rsplit(".", 1)[-1]
                                                           for m in s["modules"]) + ")"
                            for s in plan["segments"] if s["mode"] != "store")
            rows.append((method, peak, ns, (our_peak, our_ns, segs)))
    finally:
        b.close()
    mib = lambda n: n / 1048576.0
    if markdown:
        print("| method | peak (MiB) | step (ms) | tidemark at that peak: peak (MiB) | step (ms) "
              "| time ratio | tidemark's plan (recomputed) |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("%-16s %10s %10s   %-28s %10s %7s  %s" % (
            "method", "peak MiB", "step ms", "tidemark at that peak:", "step ms", "ratio",
            "tidemark's plan (recomputed)"))
    for method, peak, ns, ours in rows:
        if ours is None:
            cells = ("-", "-", "-", "(nothing)")
        else:
            cells = ("%.2f" % mib(ours[0]), "%.1f" % (ours[1] / 1e6), "%.3f" % (ours[1] / ns),
                     ours[2] or "(nothing)")
        if markdown:
            print("| %s | %.2f | %.1f | %s | %s | %s | %s |" % ((method, mib(peak), ns / 1e6)
                                                                 + cells))
        else:
            print("%-16s %10.2f %10.1f   %-28s %10s %7s  %s" % (
                method, mib(peak), ns / 1e6, "peak " + cells[0] + " MiB", cells[1], cells[2],
                cells[3]))


if __name__ == "__main__":
    main()
