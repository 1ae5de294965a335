"""Recomputation time, predicted against measured, for bench/run.sh: the examples' GPT or convnet
(examples/train.py) recorded storing everything under `tidemark run`, then trained under the
optimal plans for 50, 70 and 90 % budgets (tidemark.apply_plan). For each plan: the extra time
the advisor predicts (docs/chain-model.md: the recomputed blocks' re-run times) and the time the
planned steps spent recomputing, read from the recording (the outermost recompute phases of each
steady step, the median step, the median of 3 trainings) — what plan-check reports for a plan
applied to a live job, not a difference of step times.

Two predictions per budget:
  forward     the plan made from the store-all recording: a re-run is predicted from the blocks'
              recorded forwards (medians over the steady steps)
  calibrated  the plan made at the same budget from the same recording with
              `--rerun-times-from` the 3 trainings under the first plan: re-runs predicted from
              the blocks' recorded re-runs there, pooled (and from their forwards times the
              re-run/forward ratio for blocks that plan did not re-run)

    python3 bench/recompute_time.py BIN PYTHON [--model gpt|convnet] [--steps N] [--markdown]
"""
import os
import sqlite3
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from advisor_comparison import Bench  # noqa: E402  (the same daemon and trainings)

REPEATS = 3


def recompute_ns_per_step(store, session):
    """The time each steady step (after the first) spent in its outermost recompute phases."""
    con = sqlite3.connect("file:%s?mode=ro" % store, uri=True)
    try:
        steps = con.execute("SELECT step, begin_seq, end_seq FROM step WHERE session_id = ? AND "
                            "end_seq IS NOT NULL ORDER BY step", (session,)).fetchall()
        phases = con.execute("SELECT thread_id, begin_seq, end_seq, begin_ts_ns, end_ts_ns FROM "
                             "phase WHERE session_id = ? AND phase = 3 AND end_seq IS NOT NULL "
                             "ORDER BY begin_seq", (session,)).fetchall()
    finally:
        con.close()
    out = []
    for step, begin, end in steps[1:]:
        total, covered = 0, {}
        for thread, b, e, bt, et in phases:
            if b < begin or e > end or b < covered.get(thread, -1):
                continue  # another step's, or nested in one counted
            total += et - bt
            covered[thread] = e
        out.append(total)
    return out


def typical(values):
    """The mean, stalls beyond 4x the median left out (as the advisor's time model takes a
    block's runs): what a step costs on average, which the training's length multiplies."""
    cut = 4 * statistics.median(values)
    return statistics.mean(v for v in values if v <= cut)


def measure(b, store, path, sessions=None):
    """Over REPEATS trainings of the plan: the median of their median steps' recomputation, the
    least and most of those, and the median of their steps' typical recomputation; the
    trainings' sessions appended to `sessions`."""
    medians, means = [], []
    for _ in range(REPEATS):
        b.train_once(path)
        per_step = recompute_ns_per_step(store, int(b.last_session))
        medians.append(statistics.median(per_step))
        means.append(typical(per_step))
        if sessions is not None:
            sessions.append(b.last_session)
    return (statistics.median(medians), min(medians), max(medians), statistics.median(means))


def main():
    argv = sys.argv[1:]
    markdown = "--markdown" in argv
    model = argv[argv.index("--model") + 1] if "--model" in argv else "gpt"
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 10
    bin_dir, python = argv[0], argv[1]
    b = Bench(bin_dir, python, model, 6, steps)
    store = os.path.join(b.work, "store.db")
    rows = []
    try:
        b.train_once(None)
        base = b.last_session
        for pct in (50, 70, 90):
            path = os.path.join(b.work, "plan-%d.json" % pct)
            plan = b.plan(base, path, "--budget", "%d%%" % pct)
            planned = []  # the job under this plan: its re-runs recorded
            rows.append(("forward", pct, plan["predicted"]["extra_ns"],
                          *measure(b, store, path, planned)))
            path = os.path.join(b.work, "plan-%d-calibrated.json" % pct)
            plan = b.plan(base, path, "--budget", "%d%%" % pct, "--rerun-times-from",
                          ",".join(planned))
            rows.append(("calibrated", pct, plan["predicted"]["extra_ns"],
                         *measure(b, store, path)))
    finally:
        b.close()
    if markdown:
        print("| budget | prediction | predicted ms | median step ms (runs' range) | "
              "median / predicted | mean step ms | mean / predicted |")
        print("|---|---|---|---|---|---|---|")
    for kind, pct, predicted, measured, low, high, mean in rows:
        ratio = measured / predicted if predicted else float("nan")
        mean_ratio = mean / predicted if predicted else float("nan")
        if markdown:
            print("| %d %% | %s | %.1f | %.1f (%.1f–%.1f) | %.2f | %.1f | %.2f |"
                  % (pct, kind, predicted / 1e6, measured / 1e6, low / 1e6, high / 1e6, ratio,
                     mean / 1e6, mean_ratio))
        else:
            print("%s %d%% %s: recompute per step predicted %.1f ms, median step %.1f ms "
                  "(%.1f-%.1f), ratio %.2f; mean step %.1f ms, ratio %.2f"
                  % (model, pct, kind, predicted / 1e6, measured / 1e6, low / 1e6, high / 1e6,
                     ratio, mean / 1e6, mean_ratio))


if __name__ == "__main__":
    main()
