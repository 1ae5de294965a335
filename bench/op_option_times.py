"""What op-level options' re-runs cost, predicted against measured, for bench/run.sh: the
examples' GPT (torch 2) recorded storing everything with op scopes (`tidemark run --ops`); then
one training per kind of plan, each recomputing the same blocks (all but the last) one way:

  whole      each block recomputed whole
  matmul     each block under its "keep matmul outputs" option (policy "matmul")
  keep K     each block under its "keep K of M matmul outputs" option (policy "matmul:OP#N,...")

Each plan's recomputation measured by plan-check (the planned steps' recorded recompute phases,
median step) beside what the chain predicts for it, from the recording alone and calibrated by
the trainings' recorded re-runs (`--rerun-times-from`): by the whole-block training; by it and
the training of one op-level kind (the first "keep K"); by every other training.

    python3 bench/op_option_times.py BIN PYTHON [--layers N] [--steps N] [--markdown]
"""
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from op_options import recorded_gpt  # noqa: E402  (the same recording)


def kinds(stage):
    """{kind: option name or None (whole)} for one stage's op-level options."""
    out = {"whole": None}
    for o in stage.get("options", []):
        policy = o.get("policy", "")
        if policy == "matmul":
            out["matmul"] = o["name"]
        elif policy.startswith("matmul:"):
            out["keep " + o["name"].split()[1]] = o["name"]  # "keep 3 of 6 matmul outputs"
    return out


def predicted_ns(chain, planned, kind):
    total = 0
    for s in chain["stages"]:
        if s["name"] not in planned:
            continue
        name = planned[s["name"]][kind]
        if name is None:
            total += s.get("rerun_ns") or s["forward_ns"]
        else:
            total += next(o for o in s["options"] if o["name"] == name)["recompute_ns"]
    return total


def main():
    args, b, source, chain = recorded_gpt(steps=10)
    try:
        # Every block but the last; the kinds all of them have.
        planned = {s["name"]: kinds(s) for s in chain["stages"][:-1]}
        common = set.intersection(*(set(k) for k in planned.values()))
        order = ["whole", "matmul"] + sorted((k for k in common if k.startswith("keep ")),
                                             key=lambda k: -int(k.split()[1]))
        order = [k for k in order if k in common]
        template = b.plan(source, os.path.join(b.work, "store-all.json"), "--budget", "1TiB")
        sessions, measured = {}, {}
        for kind in order:
            plan = copy.deepcopy(template)
            plan["segments"] = []
            for s in chain["stages"]:
                name = planned.get(s["name"], {}).get(kind) if s["name"] in planned else "store"
                if name == "store":
                    plan["segments"].append({"mode": "store", "modules": [s["name"]]})
                elif name is None:
                    plan["segments"].append({"mode": "recompute", "modules": [s["name"]]})
                else:
                    o = next(o for o in s["options"] if o["name"] == name)
                    plan["segments"].append({"mode": "selective", "modules": [s["name"]],
                                             "option": name, "policy": o["policy"],
                                             "recompute": []})
            plan["predicted"]["extra_ns"] = predicted_ns(chain, planned, kind)
            path = os.path.join(b.work, "plan-%s.json" % kind.replace(" ", ""))
            with open(path, "w") as f:
                json.dump(plan, f)
            b.train(plan=path, repeats=1)
            sessions[kind] = b.last_session
            measured[kind] = b.cli_json("plan-check", b.last_session)["plans"][0][
                "measured_extra_ns"]
        one = next((k for k in order if k.startswith("keep ")), order[-1])
        sources = [("the recording", None), ("whole", [sessions["whole"]]),
                   ("whole + " + one, [sessions["whole"], sessions[one]])]
        chains = [(label, chain if s is None else
                   b.cli_json("chain", source, "--rerun-times-from", ",".join(s)))
                  for label, s in sources]
        print("GPT (%d blocks, torch 2), blocks 0-%d recomputed each way: their recomputation "
              "per step (ms), measured against predicted from" % (len(chain["stages"]),
                                                                len(planned) - 1))
        heads = ["plan", "measured"] + [label for label, _ in chains] + ["every other training"]
        if args.markdown:
            print("| " + " | ".join(heads) + " |")
            print("|" + "---|" * len(heads))
        else:
            print("  ".join("%-22s" % h for h in heads))
        for kind in order:
            others = [sessions[k] for k in order if k != kind]
            cells = [predicted_ns(c, planned, kind) for _, c in chains]
            cells.append(predicted_ns(b.cli_json("chain", source, "--rerun-times-from",
                                                 ",".join(others)), planned, kind))
            m = measured[kind]
            row = [kind, "%.1f" % (m / 1e6)] + ["%.1f (%+.0f %%)" % (x / 1e6, 100.0 * (x - m) / m)
                                                 for x in cells]
            if args.markdown:
                print("| " + " | ".join(row) + " |")
            else:
                print("  ".join("%-22s" % c for c in row))
    finally:
        b.close()


if __name__ == "__main__":
    main()
