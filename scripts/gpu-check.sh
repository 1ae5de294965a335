#!/usr/bin/env bash
# The one script for a machine with a GPU and PyTorch (CUDA). It uses the build it finds in
# build/ (carried there) or builds one, starts tidemarkd, and runs the example's checkpointed GPT
# on the GPU three times with the same seed: without tidemark (torch's own peaks and step times),
# under `tidemark run` (the agent: host hooks, the adapter, CUPTI through CUDA's injection), and
# under torch.profiler (its kernel count; CUPTI takes one subscriber, so not at the same time as
# the agent). Then it prints a table: the agent's device peaks against
# torch.cuda.max_memory_reserved / max_memory_allocated, the kernels, the step time overhead, and
# the agent's breakdown; then a capture schedule, offload and nested plans, the training step's
# time on a GPU-bound and a host-bound model, and the tests labelled gpu. Exit 0 when the agent's
# allocated peak (torch's tensors, through libtidemark_torch.so) and reserved peak are within 1 %
# of torch's, and the gpu tests pass.
#
#   bash scripts/gpu-check.sh            STEPS=6 PYTHON=python3 DEVICE=cuda (defaults)
#
# BUILD_DIR names a build (default build/) or a carried copy of one: bin/tidemark, bin/tidemarkd
# and lib/libtidemark_agent.so are all it needs (their libraries found by the loader or by their
# RUNPATH; scripts/carry-build.sh makes such a copy). The adapter is taken from this checkout's
# python/ unless TIDEMARK_PYTHON_DIR says otherwise.
#
# DEVICE=cpu runs the same plumbing without a GPU (the torch figures are then absent).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-6}
DEVICE=${DEVICE:-cuda}
BIN=$PWD/${BUILD_DIR:-build}/bin
if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-check: torch sees no CUDA device (python: $PYTHON)" >&2
  exit 2
fi
if ! "$BIN/tidemark" --version >/dev/null 2>&1; then
  echo "gpu-check: no runnable build in ${BUILD_DIR:-build}/; building" >&2
  bash scripts/build.sh
fi
export TIDEMARK_PYTHON_DIR=${TIDEMARK_PYTHON_DIR:-$PWD/python}
WORK=$(mktemp -d -t tidemark-gpu-check-XXXXXX)
source scripts/start-tidemarkd.sh
start_tidemarkd "$WORK"
# torch's tensor view must be built for the torch that runs here (the carried build's may be for
# another): built from the one source file with torch's headers, beside the agent under the name
# the adapter looks for (so the e2e test below finds it too), unless one is there already.
if TORCH_INFO=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__), int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__)') \
   && command -v g++ >/dev/null; then
  read -r TORCH_DIR TORCH_ABI TORCH_VERSION <<<"$TORCH_INFO"
  REPORTER=$BIN/../lib/libtidemark_torch-$TORCH_VERSION.so
  if [ -f "$REPORTER" ]; then
    export TIDEMARK_TORCH_REPORTER=$REPORTER
    echo "gpu-check: torch's tensor view for torch $TORCH_VERSION found in the build"
  elif g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI="$TORCH_ABI" \
       -DTIDEMARK_TORCH_VERSION="\"$TORCH_VERSION\"" -isystem "$TORCH_DIR/include" \
       agent/torch/memory_reporter.cpp -L"$TORCH_DIR/lib" -lc10 -ltorch_cpu \
       -Wl,-rpath,"$TORCH_DIR/lib" -o "$REPORTER" 2>"$WORK/reporter-build.log"; then
    export TIDEMARK_TORCH_REPORTER=$REPORTER
    echo "gpu-check: torch's tensor view built for torch $TORCH_VERSION"
  else
    echo "gpu-check: could not build torch's tensor view (see below); allocated will be n/a" >&2
    tail -5 "$WORK/reporter-build.log" >&2
  fi
fi
ARGS=(examples/train.py --device "$DEVICE" --steps "$STEPS" --checkpoint 1,3,5 --seed 1)

echo "== 1/3 without tidemark"
"$PYTHON" "${ARGS[@]}" | tee "$WORK/plain.log" | tail -2
echo "== 2/3 under tidemark run"
"$BIN/tidemark" run --name gpu-check -- "$PYTHON" "${ARGS[@]}" 2>"$WORK/agent.err" \
  | tee "$WORK/agent.log" | tail -2
tail -3 "$WORK/agent.err"
echo "== 3/3 under torch.profiler"
"$PYTHON" "${ARGS[@]}" --torch-profiler | tee "$WORK/profiler.log" | tail -3

# The newest session's id, once its analysis is stored (a minute at most).
newest_analyzed_session() {
  local id
  id=$("$BIN/tidemark" sessions --json | "$PYTHON" -c \
    'import json,sys; print(json.load(sys.stdin)["sessions"][-1]["id"])')
  for _ in $(seq 300); do
    "$BIN/tidemark" sessions --json | "$PYTHON" -c "import json,sys; s=[x for x in json.load(sys.stdin)['sessions'] if x['id']==$id][0]; sys.exit(0 if s['analyzed'] else 1)" && break
    sleep 0.2
  done
  echo "$id"
}
SESSION=$(newest_analyzed_session)
echo; echo "== the agent's breakdown at the peak (session $SESSION)"
"$BIN/tidemark" breakdown "$SESSION"

STATUS=0
"$PYTHON" scripts/gpu_check_table.py "$WORK" "$SESSION" || STATUS=$?

# A capture schedule on the GPU: steps 2-3 in detail, the others summarized by the agent (the
# segments from CUPTI, the tensors from torch's view). Each step's peak beside the full
# recording's (session $SESSION), per device; informative (two runs may differ by a few bytes).
echo; echo "== capture schedule: tidemark run --steps 2-3 against the full recording"
"$BIN/tidemark" run --name gpu-check-steps --steps 2-3 -- "$PYTHON" "${ARGS[@]}" \
  >"$WORK/steps.log" 2>"$WORK/steps.err" || echo "gpu-check: the scheduled run failed" >&2
SCHEDULED=$(newest_analyzed_session)
DEVS="all"
[ "$DEVICE" = cuda ] && DEVS="all cuda:0"
for DEV in $DEVS; do
  "$BIN/tidemark" steps "$SESSION" --device "$DEV" --json >"$WORK/full-steps-$DEV.json" || continue
  "$BIN/tidemark" steps "$SCHEDULED" --device "$DEV" --json >"$WORK/sched-steps-$DEV.json" \
    || continue
  "$PYTHON" - "$WORK/full-steps-$DEV.json" "$WORK/sched-steps-$DEV.json" "$DEV" <<'PYEOF' || true
import json, sys
full = {s["step"]: s for s in json.load(open(sys.argv[1]))["steps"]}
sched = {s["step"]: s for s in json.load(open(sys.argv[2]))["steps"]}
print("device %s: %5s %9s %14s %14s %8s" % (sys.argv[3], "STEP", "DETAIL", "FULL PEAK", "SCHEDULED",
                                            "DIFF"))
for n in sorted(full):
    a = full[n]["peak"]["tracked_bytes"]
    s = sched.get(n)
    b = s["peak"]["tracked_bytes"] if s else -1
    print("%17d %9s %14d %14d %8d" % (n, "summary" if s and s["summarized"] else "full", a, b,
                                       b - a))
PYEOF
done

# Offloading on the GPU (informative): a store-all recording, a plan for 40 % that may offload
# blocks to host memory over a 16 GB/s link (and a nested one for 30 %), each applied to the same
# training; plan-check's figures: the predicted peak of torch's tensors (what the advisor models on
# a GPU) beside the highest measured in the steps under the plan, and the recomputation time.
echo; echo "== offload and nested plans on the GPU: predicted against measured (plan-check)"
PLAIN=(examples/train.py --device "$DEVICE" --steps "$STEPS" --checkpoint "" --seed 1)
"$BIN/tidemark" run --name gpu-check-store-all -- "$PYTHON" "${PLAIN[@]}" >/dev/null 2>&1 \
  || echo "gpu-check: the store-all run failed" >&2
BASE=$(newest_analyzed_session)
for CASE in "offload 40% --offload 16GB/s" "nested 30% --nested"; do
  read -r NAME BUDGET FLAG VALUE <<<"$CASE"
  PLAN_FILE=$WORK/plan-$NAME.json
  "$BIN/tidemark" plan "$BASE" --budget "$BUDGET" $FLAG $VALUE --out "$PLAN_FILE" >/dev/null \
    || { echo "gpu-check: no $NAME plan for $BUDGET" >&2; continue; }
  "$BIN/tidemark" run --name "gpu-check-$NAME" -- "$PYTHON" "${PLAIN[@]}" --plan "$PLAN_FILE" \
    >"$WORK/$NAME.log" 2>&1 || { echo "gpu-check: the $NAME run failed" >&2; continue; }
  RUN=$(newest_analyzed_session)
  "$BIN/tidemark" plan-check "$RUN" --json >"$WORK/$NAME-check.json" || continue
  "$PYTHON" - "$PLAN_FILE" "$WORK/$NAME-check.json" "$NAME" <<'PYEOF' || true
import json, sys
plan = json.load(open(sys.argv[1]))
modes = sorted({s["mode"] for s in plan["segments"]} |
               {"nested" for s in plan["segments"] if "inner" in s})
for p in json.load(open(sys.argv[2]))["plans"]:
    predicted, measured = int(p["predicted_peak_bytes"]), int(p.get("measured_peak_bytes", 0))
    print("%-8s plan (%s), %s: peak predicted %d, measured %d (%+.2f %%); extra time predicted "
          "%.2f ms, measured %.2f ms" % (sys.argv[3], ", ".join(modes), p["state"], predicted,
          measured, 100.0 * (measured - predicted) / max(predicted, 1),
          int(p.get("predicted_extra_ns", 0)) / 1e6, int(p.get("measured_extra_ns", 0)) / 1e6))
PYEOF
done

# The training step's time under tidemark where the device's work outweighs the host's (the wide
# GPT: the host runs ahead and what the hooks add is hidden) and where the host's dispatch is the
# step (the example's GPT on a fast GPU). Informative: the fastest and the median step of two
# interleaved runs each (bench/train_step_time.py, every step timed to the device's end).
echo; echo "== step time: plain against tidemark run (fastest / median of the steady steps, ms)"
SIZES=("wide 14" "example 60")
[ "$DEVICE" = cuda ] || SIZES=("example 12")  # the wide GPT takes a minute a step on a CPU
for SIZE in "${SIZES[@]}"; do
  read -r NAME N <<<"$SIZE"
  for ROUND in 1 2; do
    for MODE in plain tidemark; do
      CMD=("$PYTHON" bench/train_step_time.py --device "$DEVICE" --size "$NAME" --steps "$N")
      [ "$MODE" = tidemark ] &&
        CMD=("$BIN/tidemark" run --quiet --name "gpu-check-$NAME" -- "${CMD[@]}")
      "${CMD[@]}" 2>/dev/null | tail -1 | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
print("%-8s %-9s round %s: %8.2f %8.2f" % (sys.argv[1], sys.argv[2], sys.argv[3],
      r["min_step_s"] * 1e3, r["median_step_s"] * 1e3))' "$NAME" "$MODE" "$ROUND" \
        || echo "gpu-check: the $NAME step timing under $MODE failed" >&2
    done
  done
done

# The tests that need a device (ctest label gpu), where the build tree and ctest are here; with a
# carried build (no ctest tree), the one such test run directly.
if command -v ctest >/dev/null && [ -f "${BUILD_DIR:-build}/CTestTestfile.cmake" ]; then
  echo; echo "== ctest -L gpu"
  TIDEMARK_GPU_PYTHON=$PYTHON ctest --test-dir "${BUILD_DIR:-build}" -L gpu --output-on-failure \
    || STATUS=1
else
  echo; echo "== tests/e2e/test_gpu_training.py"
  (cd tests/e2e && TIDEMARK_BIN=$BIN TIDEMARK_SOURCE=$PWD/../.. TIDEMARK_GPU_PYTHON=$PYTHON \
     TIDEMARK_TORCH_PYTHON=$(command -v "$PYTHON") \
     "$PYTHON" test_gpu_training.py -v) || STATUS=1
fi
exit $STATUS
