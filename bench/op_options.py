"""What the op-level options that keep some of a block's matrix products buy, for bench/run.sh:
the examples' GPT (torch 2) recorded storing everything with op scopes (`tidemark run --ops`);
the least recomputation the optimal plans predict at budgets across the range (least feasible
budget to storing everything), with the chain's options as recorded and with the "matmul:OP#N"
options (docs/plan-format.md) left out; then the halfway plan with them, applied to the same
training: its predicted and measured peak.

    python3 bench/op_options.py BIN PYTHON [--layers N] [--steps N] [--markdown]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from advisor_comparison import Bench  # noqa: E402  (the same daemon and trainings)


def least_extra(points, budget):
    fits = [p["extra_ns"] for p in points if p["budget_bytes"] <= budget]
    return min(fits) if fits else None


def recorded_gpt(steps):
    """BIN PYTHON [--layers N] [--steps N] [--markdown] read, the examples' GPT trained storing
    everything with op scopes: (args, the Bench, its session, its chain); the Bench is the
    caller's to close."""
    p = argparse.ArgumentParser()
    p.add_argument("bin")
    p.add_argument("python")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    b = Bench(args.bin, args.python, "gpt", args.layers, args.steps)
    try:
        b.train(repeats=1, record=("--ops",))
        return args, b, b.last_session, b.cli_json("chain", b.last_session)
    except BaseException:
        b.close()
        raise


def main():
    args, b, source, chain = recorded_gpt(steps=6)
    try:
        some = sum(1 for s in chain["stages"] for o in s.get("options", [])
                   if o.get("policy", "").startswith("matmul:"))
        curves = {}
        for label, keep in (("as recorded", lambda o: True),
                            ("without some-call options",
                             lambda o: not o.get("policy", "").startswith("matmul:"))):
            profile = json.loads(json.dumps(chain))
            for s in profile["stages"]:
                s["options"] = [o for o in s.get("options", []) if keep(o)]
            path = os.path.join(b.work, "profile-%d.json" % len(curves))
            with open(path, "w") as f:
                json.dump(profile, f)
            curves[label] = b.cli_json("pareto", "--profile", path)["points"]
        with_, without = curves["as recorded"], curves["without some-call options"]
        lo, hi = with_[0]["budget_bytes"], with_[-1]["budget_bytes"]
        print("GPT (%d blocks, torch 2): %d options keep some of a block's matrix products; "
              "least recomputation (ms) at equal budgets" % (len(chain["stages"]), some))
        fmt = "| %s | %s | %s | %s | %s |" if args.markdown else "%-22s %16s %14s %14s %8s"
        print(fmt % ("budget (of the range)", "budget MiB", "without (ms)", "with (ms)", "ratio"))
        if args.markdown:
            print("|---|---|---|---|---|")
        for tenth in range(1, 10):
            budget = lo + (hi - lo) * tenth // 10
            a, w = least_extra(without, budget), least_extra(with_, budget)
            print(fmt % ("%d %%" % (tenth * 10), "%.2f" % (budget / 2**20),
                         "-" if a is None else "%.2f" % (a / 1e6),
                         "-" if w is None else "%.2f" % (w / 1e6),
                         "-" if not a or w is None else "%.3f" % (w / a)))
        # The halfway plan, applied.
        plan_path = os.path.join(b.work, "half.json")
        plan = b.plan(source, plan_path, "--budget", str((lo + hi) // 2))
        used = [s.get("policy") for s in plan["segments"] if s.get("policy")]
        peak, _ = b.train(plan=plan_path, repeats=1, record=("--ops",))
        predicted = plan["predicted"]["peak_bytes"]
        print("halfway plan (%s): predicted peak %.2f MiB, measured %.2f MiB (%+.2f %%)"
              % (", ".join(used) or "no op-level option", predicted / 2**20, peak / 2**20,
                 100.0 * (peak - predicted) / predicted))
    finally:
        b.close()


if __name__ == "__main__":
    main()
