"""The advisor beside the standard recomputation methods, for bench/run.sh, measured live: the
examples' GPT or the `transformers` GPT-2 (examples/train.py) trained under `tidemark run` with each method applied as a plan
(tidemark.apply_plan, the same seed), its peak and step time measured from the recording; then
tidemark's own plan for that method's measured peak as the budget, measured the same way.

Methods (all eager, each a plan document, docs/plan-format.md):
  store-all       no recomputation
  checkpoint-all  every block recomputed (what `checkpoint` around each block does)
  sqrt-n          Chen et al.'s segments of about sqrt(n) blocks, each recomputed whole
  selective-attn  Megatron-style selective recomputation: every block's attention recomputed,
                  the rest of the block stored
Each row: the method's measured peak and median step time; then tidemark's plan with that peak as
its budget (its measured peak and step time, its time over the method's), and tidemark's plan
for the least budget whose predicted extra time is at most the method's (its measured peak over
the method's, its step time): both predicted by tidemark's time model, so that the plans are
matched like with like; for selective-attn, which the model does not predict here, the method's
measured extra time over store-all.

    python3 bench/advisor_comparison.py BIN PYTHON [LAYERS] [STEPS] [--gpt2] [--compiled]
                                        [--nested] [--markdown]
    (default 8 blocks, 10 steps; --gpt2: the `transformers` GPT-2 of examples/train.py)

--nested: only checkpoint-all and, below its peak, tidemark's nested plans (`--nested`, at the
least budget one fits and half-way up to checkpoint-all's measured peak), measured the same way,
on a deep, narrow GPT (NESTED_SHAPE: nesting pays where the blocks' inputs add up to more than
one block's activations; run it with 32 blocks).

--compiled: the model trained under torch.compile (whole model, examples/train.py --compile),
against torch.compile's own recomputation, its activation memory budget
(torch._functorch.config.activation_memory_budget) at 0.5, 0.2 and 0: each budget's measured
peak and step time; then tidemark's plans, made from an eager store-all recording with op scopes
(`tidemark run --ops`: op-level options; a compiled model's recording has no module scopes
inside the compiled region) and applied to the same compiled model (their checkpoints become
regions of the compiled graph), measured compiled. The compiled model's activations differ from
the eager ones the plan predicts (fused ops save other tensors), so "tidemark at <= that peak"
lowers its budget by what it measured over the method's peak and tries again (at most 3 plans;
the row says how many it took, and "over" where the last one still measured above the peak).

PYTHON: the interpreter (its torch) the training runs under. Each plan is trained 3 times. Peaks:
the median of the steps' peaks after the first (the first creates the optimizer state); step
times: the fastest of those steps in the 3 runs (noise on a shared CPU only adds time; still,
step times vary by several percent between runs).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPEATS = 3  # trainings of each plan: the fastest steady step of all, the median peak
COMPILED_REPEATS = 3  # under torch.compile too (a training compiles: ~15-40 s on a CPU)
COMPILE_BUDGETS = (0.5, 0.2, 0.0)  # torch.compile's activation_memory_budget
# --nested: a deep, narrow GPT whose kept block inputs add up to more than one block's
# activations (test_advisor's nested case), where nesting can go below checkpoint-all.
NESTED_SHAPE = ("--seq-len", "32", "--d-model", "64", "--batch", "64")
HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "train.py")


class Bench:
    def __init__(self, bin_dir, python, model, layers, steps):
        self.tidemark = os.path.join(bin_dir, "tidemark")
        self.python, self.model, self.layers, self.steps = python, model, layers, steps
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

    def train(self, plan=None, extra=(), repeats=REPEATS, record=()):
        """(median steady peak bytes, fastest steady step ns) of `repeats` trainings (extra:
        more arguments of examples/train.py; record: of `tidemark run`)."""
        peaks, times = [], []
        for _ in range(repeats):
            peak, step_ns = self.train_once(plan, extra, record)
            peaks.append(peak)
            times.append(step_ns)
        return int(statistics.median(peaks)), min(times)

    def train_once(self, plan, extra=(), record=()):
        args = [self.tidemark, "--server", self.server, "run", "--quiet", *record, "--",
                self.python,
                TRAIN, "--model", self.model, "--layers", str(self.layers), "--steps",
                str(self.steps), "--checkpoint", "", *extra]
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
        self.last_session = str(sid)
        steps = self.cli_json("steps", self.last_session)["steps"][1:]
        peak = statistics.median(s["peak"]["tracked_bytes"] for s in steps)
        # The fastest steady step, as section 1 times the training (this machine's noise only
        # ever adds time).
        return int(peak), min(s["end_ts_ns"] - s["begin_ts_ns"] for s in steps)

    def plan(self, source, out, *args):
        self.cli("plan", source, *args, "--out", out)
        with open(out) as f:
            return json.load(f)

    def plan_if_feasible(self, source, out, *args):
        """The plan, or None where the budget has none (tidemark plan's exit 4)."""
        doc = self.plan_document(source, out, *args)
        return doc if doc["feasible"] else None

    def plan_document(self, source, out, *args):
        """The plan document, also where it does not fit (it names the least budget then)."""
        r = subprocess.run([self.tidemark, "--server", self.server, "plan", source, *args,
                            "--out", out], capture_output=True, text=True)
        if r.returncode not in (0, 4):
            raise SystemExit("tidemark plan: %s" % r.stderr.strip())
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


def describe(plan):
    """rec(3,4): blocks 3 and 4 recomputed as one segment; sel(1): block 1's child recomputed;
    ops(2): block 2's op-level option (its matrix products' outputs kept, the rest re-run)."""
    return " ".join(("ops" if s.get("policy") else s["mode"][:3]) + "(" +
                    ",".join(m.rsplit(".", 1)[-1] for m in s["modules"]) + ")"
                    for s in plan["segments"] if s["mode"] != "store") or "(nothing)"


def compiled_rows(b):
    """(compiled store-all peak and step, rows) for --compiled (see the module's doc)."""
    compiled = ["--compile"]
    # Eager, storing everything, with op scopes: the recording the plans are made from (its
    # blocks have the op-level option that keeps their matrix products' outputs and re-runs the
    # rest, the kind of choice torch.compile's partitioner makes).
    b.train(repeats=1, record=["--ops"])
    base = b.last_session
    curve = b.cli_json("pareto", base)["points"]
    base_peak, base_ns = b.train(extra=compiled, repeats=COMPILED_REPEATS)
    rows = []
    for budget in COMPILE_BUDGETS:
        peak, ns = b.train(extra=compiled + ["--activation-memory-budget", str(budget)],
                           repeats=COMPILED_REPEATS)
        # tidemark at <= the method's peak: measured compiled, the budget lowered by the
        # overshoot until it fits (3 plans at most).
        at_peak, target = None, peak
        for attempt in range(1, 4):
            path = os.path.join(b.work, "tidemark-at-peak-%s-%d.json" % (budget, attempt))
            plan = b.plan_if_feasible(base, path, "--budget", str(target), "--margin", "0")
            if plan is None:
                break
            p_peak, p_ns = b.train(path, compiled, COMPILED_REPEATS)
            at_peak = (p_peak, p_ns, describe(plan) + (" (plan %d)" % attempt if attempt > 1
                                                        else ""))
            if p_peak <= peak * 1.005:
                break
            if attempt == 3:
                at_peak = at_peak[:2] + (at_peak[2] + " (over)",)
            target -= p_peak - peak
        # tidemark at the method's step time: the least budget whose plan the model predicts
        # to add no more than the method measured over compiled store-all.
        extra = max(0, ns - base_ns)
        fits = [pt for pt in curve if pt["extra_ns"] <= extra]
        least = min(pt["budget_bytes"] for pt in fits) if fits else curve[-1]["budget_bytes"]
        path = os.path.join(b.work, "tidemark-at-time-%s.json" % budget)
        plan_t = b.plan(base, path, "--budget", str(least), "--margin", "0")
        t_peak, t_ns = b.train(path, compiled, COMPILED_REPEATS)
        rows.append(("compile budget %g" % budget, peak, ns,
                     at_peak or (0, 0, "(no plan fits)"), (t_peak, t_ns, describe(plan_t))))
    return base_peak, base_ns, rows


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    model = "gpt2" if "--gpt2" in sys.argv else "gpt"
    bin_dir, python = args[0], args[1]
    layers = int(args[2]) if len(args) > 2 else 8
    steps = int(args[3]) if len(args) > 3 else 10
    b = Bench(bin_dir, python, model, layers, steps)
    if "--nested" in sys.argv:
        try:
            b.train(extra=NESTED_SHAPE)
            base = b.last_session
            ckpt_all = os.path.join(b.work, "checkpoint-all.json")
            b.plan(base, ckpt_all, "--strategy", "checkpoint-all", "--budget", "100%")
            peak, ns = b.train(ckpt_all, NESTED_SHAPE)
            nested = nested_rows(b, base, peak, NESTED_SHAPE)
        finally:
            b.close()
        print("the examples' GPT, %d blocks, %s: checkpoint-all measured peak %.2f MiB, step "
              "%.1f ms" % (layers, " ".join(NESTED_SHAPE), peak / 1048576.0, ns / 1e6))
        report_nested(nested, markdown)
        return
    if "--compiled" in sys.argv:
        try:
            base_peak, base_ns, rows = compiled_rows(b)
        finally:
            b.close()
        report(model, layers, python, "compiled", base_peak, base_ns, rows, markdown)
        return
    try:
        base_peak, base_ns = b.train()
        base = b.last_session
        plans = {}
        predicted = {}  # the methods' extra time as tidemark's time model predicts it
        for strategy in ("checkpoint-all", "sqrt-n"):
            plans[strategy] = os.path.join(b.work, strategy + ".json")
            doc = b.plan(base, plans[strategy], "--strategy", strategy, "--budget", "100%")
            predicted[strategy] = doc["predicted"]["extra_ns"]
        store_all = b.plan(base, os.path.join(b.work, "store-all.json"), "--strategy",
                           "store-all", "--budget", "100%")
        plans["selective-attn"] = os.path.join(b.work, "selective-attn.json")
        selective_attention_plan(store_all, plans["selective-attn"])
        curve = b.cli_json("pareto", base)["points"]
        rows = []
        for method, path in plans.items():
            peak, ns = b.train(path)
            # tidemark at the method's measured peak (as the budget) ...
            at_peak = os.path.join(b.work, "tidemark-at-peak-" + method + ".json")
            plan = b.plan(base, at_peak, "--budget", str(peak))
            p_peak, p_ns = b.train(at_peak)
            # ... and at its extra time: the least budget whose optimal plan is predicted to add
            # no more than the method, both by tidemark's time model (the method's measured extra
            # time where the model has no prediction of it: selective-attn).
            extra = predicted.get(method, max(0, ns - base_ns))
            fits = [pt for pt in curve if pt["extra_ns"] <= extra]
            budget = min(pt["budget_bytes"] for pt in fits) if fits else curve[-1]["budget_bytes"]
            at_time = os.path.join(b.work, "tidemark-at-time-" + method + ".json")
            plan_t = b.plan(base, at_time, "--budget", str(budget), "--margin", "0")
            t_peak, t_ns = b.train(at_time)
            rows.append((method, peak, ns, (p_peak, p_ns, describe(plan)),
                         (t_peak, t_ns, describe(plan_t))))
    finally:
        b.close()
    report(model, layers, python, "eager", base_peak, base_ns, rows, markdown)


def nested_rows(b, base, checkpoint_all_peak, shape=()):
    """Below checkpoint-all's measured peak, the least any one-level plan reaches: tidemark's
    nested plans (--nested) at their least feasible budget and half-way up to that peak, each
    (budget, predicted peak, predicted extra, measured peak, step, plan)."""
    probe = b.plan_document(base, os.path.join(b.work, "nested-probe.json"), "--nested",
                            "--budget", "1")
    least = probe["min_feasible_budget_bytes"]
    rows = []
    for budget in sorted({least, (least + checkpoint_all_peak) // 2}):
        if budget >= checkpoint_all_peak:
            continue
        path = os.path.join(b.work, "nested-%d.json" % budget)
        plan = b.plan_if_feasible(base, path, "--nested", "--budget", str(budget), "--margin",
                                  "0")
        if plan is None:
            continue
        peak, ns = b.train(path, shape)
        rows.append((budget, plan["predicted"]["peak_bytes"], plan["predicted"]["extra_ns"],
                     peak, ns, describe_nested(plan["segments"])))
    return rows


def describe_nested(segments):
    """rec(0..3: rec(0,1) 2 3): a segment's re-run as its inner segments say."""
    out = []
    for s in segments:
        if s["mode"] == "store":
            continue
        idx = [m.rsplit(".", 1)[-1] for m in s["modules"]]
        inner = s.get("inner")
        if inner:
            parts = [("rec(%s)" % ",".join(m.rsplit(".", 1)[-1] for m in i["modules"])
                      if i["mode"] == "recompute" else
                      " ".join(m.rsplit(".", 1)[-1] for m in i["modules"])) for i in inner]
            out.append("rec(%s..%s: %s)" % (idx[0], idx[-1], " ".join(parts)))
        else:
            out.append(s["mode"][:3] + "(" + ",".join(idx) + ")")
    return " ".join(out) or "(nothing)"


def report_nested(rows, markdown):
    if not rows:
        return
    mib = lambda n: n / 1048576.0
    print("below checkpoint-all's peak: tidemark's nested plans (--nested)")
    head = ("budget MiB", "predicted peak MiB", "measured peak MiB", "predicted extra ms",
            "step ms", "plan")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for budget, p_peak, p_extra, peak, ns, plan in rows:
        cells = ("%.2f" % mib(budget), "%.2f" % mib(p_peak), "%.2f" % mib(peak),
                 "%.1f" % (p_extra / 1e6), "%.1f" % (ns / 1e6), plan)
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))


def report(model, layers, python, how, base_peak, base_ns, rows, markdown):
    mib = lambda n: n / 1048576.0
    print("%s (%s), store-all (no recomputation): peak %.2f MiB, step %.1f ms; %d blocks, "
          "torch %s" % ("the transformers GPT-2" if model == "gpt2" else "the examples' GPT",
                        how, mib(base_peak), base_ns / 1e6, layers, torch_version(python)))
    head = ("method", "peak MiB", "step ms", "tidemark at <= that peak: peak MiB", "step ms",
            "time ratio", "plan", "tidemark at that step time: peak MiB", "step ms",
            "peak ratio", "plan")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for method, peak, ns, at_peak, at_time in rows:
        cells = (method, "%.2f" % mib(peak), "%.1f" % (ns / 1e6), "%.2f" % mib(at_peak[0]),
                 "%.1f" % (at_peak[1] / 1e6), "%.3f" % (at_peak[1] / ns) if at_peak[1] else "-",
                 at_peak[2],
                 "%.2f" % mib(at_time[0]), "%.1f" % (at_time[1] / 1e6),
                 "%.3f" % (at_time[0] / peak), at_time[2])
        if markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("%-15s peak %7s MiB, step %6s ms | tidemark at its peak: %7s MiB, %6s ms "
                  "(time x%s) %s | at its time: %7s MiB (peak x%s), %6s ms %s"
                  % (cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6],
                     cells[7], cells[9], cells[8], cells[10]))


def torch_version(python):
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


if __name__ == "__main__":
    main()
