#!/usr/bin/env bash
# Benchmarks, measured side by side in one run and reported as ratios (never run by the tests):
#   1. the agent's overhead on the example's training step (torch 1.13 and torch 2; with the
#      adapter's hooks all in Python, TIDEMARK_NATIVE_HOOKS=0; with op scopes on torch 2; with a
#      capture schedule that summarizes all steps but the first; with the Python stacks of
#      allocations of 64 KiB or more, --stacks), beside
#      torch.profiler(profile_memory, record_shapes) and memray (native)
#  1b. the same on a dispatch-bound GPT (train_step_time.py --size dispatch: a GPU step's host
#      side when the step is launch-bound), tidemark run (also with the adapter's hooks all in
#      Python) and the agent alone (--no-adapter)
#   2. the hook cost per recorded event on an allocation-heavy program, beside heaptrack's; then
#      bursts from 8 threads (tests/agent/burst_program.cpp) plain, under tidemark lossless and
#      --lossy, and under heaptrack (lossless too): wall time, what was lost, and how long the
#      daemon took to store a handed-off run after the job's exit (each run starts once it has)
#   3. a 10M-event session: ingest through the real Ingest API beside the raw SQLite insert rate,
#      the analysis pass, and 2000-bucket timeline queries (full range and zoomed); then the
#      analysis of a session as large whose blocks are tensors in device segments (a GPU job's);
#      then sessions of SCALE_SIZES events (default 10M 100M 300M, a step marked every
#      SCALE_STEP_EVENTS events, default 20,000: a longer run has more steps, not longer ones;
#      analysed as their events come), each into a fresh daemon:
#      ingest rate, the daemon's peak memory, analysis time, query latency, store bytes per event,
#      and the ratios of the largest to the smallest; then live sessions 2 hours long by their
#      timestamps at LIVE_SIZES events (default 10M 100M), 500 steps each, queried while live at
#      their start and at their end (peak, steps, timeline, zoomed timeline, a step's breakdown);
#      then a live session of STEPS_EVENTS events (default 20M) with a step every 20 events (a
#      million steps) under a 256 MiB budget: the same queries and the daemon's peak memory;
#      then sessions of REBUILD_SIZES events (default 10M) left live by a daemon that stops, and
#      resumed on a new one: how long until it answers again (its live analysis built again from
#      the store), beside the ingest's time
#   4. the optimal chain planner: a 200-block chain's whole Pareto curve, beside the 1 s target,
#      and the plan for one budget (the solve cut at the budget) as a ratio of it; long chains
#      (200, 1,000, 10,000 stages) on the grid solver: time, proven epsilon, and on 200 stages
#      the shift measured against the exact curve
#   5. the GUI's timeline repaint on the 10M-event session of 3, beside the 16 ms target
#   6. a load run: 16 native burst jobs and 8 trainings against one fresh daemon at once, all
#      lossless: sessions whole, the daemon's peak memory, query latency while ingesting
#   7. the job query on a 64-rank job (a session per rank), beside sessions and one rank's peak
#   8. the PostgreSQL store beside SQLite (bench/postgres_bench.py, a real server of its own):
#      the session of 3 into each (ingest, analysis, queries, ratios), 8 ranks at once into one
#      SQLite daemon and through two daemons into one PostgreSQL, the job query of 7 on it
#   9. the advisor beside checkpoint-all, Chen's sqrt(n) and Megatron-style selective (attention)
#      recomputation on the examples' GPT and the `transformers` GPT-2 (8 blocks each), measured
#      live under torch 2: each method's peak and step time, tidemark's plan at that peak and at
#      that extra time (bench/advisor_comparison.py; the tables of docs/advisor-comparison.md);
#      the GPT under torch.compile: torch.compile's activation memory budget against
#      tidemark's plans applied to the same compiled model; nested plans below checkpoint-all
#      on a 32-block GPT
#  10. recomputation time, predicted against measured: the optimal plans for 50/70/90 % on the
#      examples' GPT and convnet under torch 2, the time the planned steps spent recomputing
#      (their recorded recompute phases) beside the advisor's prediction (bench/recompute_time.py);
#      the GPT's plans with and without the op-level options that keep some of a block's matrix
#      products (bench/op_options.py); op-level options' re-run times predicted against
#      measured, from the recording and calibrated (bench/op_option_times.py)
# Usage: bash bench/run.sh [ROUNDS] [EVENTS]   (after scripts/build.sh)
#        SECTIONS="1 2" bash bench/run.sh        (some sections only)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/${BUILD_DIR:-build}/bin
LIB=$PWD/${BUILD_DIR:-build}/lib/libtidemark_agent.so
ROUNDS=${1:-2000000}
EVENTS=${2:-10000000}
SCALE_SIZES=${SCALE_SIZES:-10000000 100000000 300000000}
SCALE_STEP_EVENTS=${SCALE_STEP_EVENTS:-20000}
LIVE_SIZES=${LIVE_SIZES:-10000000 100000000}
REBUILD_SIZES=${REBUILD_SIZES:-10000000}
STEPS_EVENTS=${STEPS_EVENTS:-20000000}
WORK=$(mktemp -d -t tidemark-bench-XXXXXX)
PY=/usr/bin/python3

# The daemon leads a session of its own, as users' daemons do (`tidemark` starts one so, the
# README says to): the kernel's autogroups then weigh it against the jobs as a group of its own.
setsid "$BIN/tidemarkd" --listen 127.0.0.1:0 --no-unix --db "$WORK/bench.db" \
  --port-file "$WORK/port" 2>"$WORK/tidemarkd.log" &
DAEMON=$!
DAEMON0=  # section 2b's second daemon, while it runs
trap 'kill $DAEMON $DAEMON0 2>/dev/null; wait $DAEMON 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do [ -f "$WORK/port" ] && break; sleep 0.1; done
SERVER=127.0.0.1:$(cat "$WORK/port")
SECTIONS=" ${SECTIONS:-1 1b 2 3 4 5 6 7 8 9 10} "
want() { [[ "$SECTIONS" == *" $1 "* ]]; }
minof() { $PY -c "import sys; v=[float(x) for x in sys.argv[1:] if x]; print(min(v))" "$@"; }
field() { $PY -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }

# step_time_table "label|command" ...: each command run 6 times, interleaved (the step script
# prints its JSON last); the fastest steady step of each, wall and CPU time, against the first's.
step_time_table() {
  local -A WALL=() CPU=()
  local c label cmd out rows=()
  for _ in 1 2 3 4 5 6; do
    for c in "$@"; do
      label=${c%%|*}; cmd=${c#*|}
      out=$($cmd 2>/dev/null | grep '^{' | tail -1)
      WALL[$label]=$(minof "${WALL[$label]:-}" "$(echo "$out" | field min_step_s)")
      CPU[$label]=$(minof "${CPU[$label]:-}" "$(echo "$out" | field min_step_cpu_s)")
    done
  done
  for c in "$@"; do label=${c%%|*}; rows+=("$label|${WALL[$label]}|${CPU[$label]}"); done
  $PY - "${rows[@]}" <<'PYEOF'
import sys
rows = [r.split("|") for r in sys.argv[1:]]
base_w, base_c = float(rows[0][1]), float(rows[0][2])
print("%-40s %10s %8s %10s %8s" % ("", "wall (ms)", "ratio", "cpu (ms)", "ratio"))
for label, w, c in rows:
    w, c = float(w), float(c)
    print("%-40s %10.2f %8.3f %10.2f %8.3f" % (label, w * 1e3, w / base_w, c * 1e3, c / base_c))
PYEOF
}

if want 1; then
echo "== 1. training step of examples/tiny_gpt.py: the fastest steady step of 6 interleaved runs"
echo "   each, wall time and the process's CPU time (all threads, the agent's collector and sender"
echo "   included); under Debian's torch 1.13 and the torch 2 environment's"
export OPENBLAS_NUM_THREADS=1
TORCH2=${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python
for TPY in $PY $TORCH2; do
  [ -x "$TPY" ] || { echo "($TPY missing: scripts/install-deps.sh makes it)"; continue; }
  TV=$($TPY -c "import torch; print(torch.__version__)")
  HAS_MEMRAY=$($TPY -c "import memray" 2>/dev/null && echo 1 || echo 0)
  echo "-- torch $TV ($TPY)"
  CONFIGS=("plain|$TPY bench/train_step_time.py"
           "tidemark run (agent + adapter)|$BIN/tidemark --server $SERVER run --quiet -- $TPY bench/train_step_time.py"
           "tidemark run, hooks in Python|env TIDEMARK_NATIVE_HOOKS=0 $BIN/tidemark --server $SERVER run --quiet -- $TPY bench/train_step_time.py"
           "tidemark run --every 12 (summaries)|$BIN/tidemark --server $SERVER run --quiet --every 12 -- $TPY bench/train_step_time.py"
           "tidemark run --stacks (Python stacks)|$BIN/tidemark --server $SERVER run --quiet --stacks -- $TPY bench/train_step_time.py")
  if [ "${TV%%.*}" -ge 2 ]; then
    CONFIGS+=("tidemark run --ops (op scopes)|$BIN/tidemark --server $SERVER run --quiet --ops -- $TPY bench/train_step_time.py")
  fi
  CONFIGS+=("torch.profiler(profile_memory, shapes)|$TPY bench/train_step_time.py --profiler")
  if [ "$HAS_MEMRAY" = 1 ]; then
    CONFIGS+=("memray run --native|$TPY -m memray run --native -q -f -o $WORK/memray.bin bench/train_step_time.py")
  fi
  step_time_table "${CONFIGS[@]}"
done

echo
fi

if want 1b; then
TORCH2=${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python
echo "== 1b. the same with a dispatch-bound model (train_step_time.py --size dispatch: width 16,"
echo "   8 tokens, batch 1, 60 steps; a GPU step's host side when the step is launch-bound),"
echo "   torch 2, the fastest steady step of 6 interleaved runs each"
if [ -x "$TORCH2" ]; then
  STEP="$TORCH2 bench/train_step_time.py --size dispatch --steps 60"
  DCONFIGS=("plain|$STEP"
            "tidemark run (agent + adapter)|$BIN/tidemark --server $SERVER run --quiet -- $STEP"
            "tidemark run, hooks in Python|env TIDEMARK_NATIVE_HOOKS=0 $BIN/tidemark --server $SERVER run --quiet -- $STEP"
            "tidemark run --no-adapter (agent)|$BIN/tidemark --server $SERVER run --quiet --no-adapter -- $STEP")
  step_time_table "${DCONFIGS[@]}"
else
  echo "($TORCH2 missing: scripts/install-deps.sh makes it)"
fi
echo
fi

if want 2; then
echo "== 2. hook cost: $ROUNDS posix_memalign+free pairs (bench/hook_cost.cpp)"
base=$("$BIN/bench_hook_cost" "$ROUNDS" | field ns_per_alloc_free)
with=$(TIDEMARK_SERVER=$SERVER TIDEMARK_QUIET=1 LD_PRELOAD=$LIB \
       "$BIN/bench_hook_cost" "$ROUNDS" | field ns_per_alloc_free)
ht="n/a"
if command -v heaptrack >/dev/null; then
  ht=$(cd "$WORK" && heaptrack "$BIN/bench_hook_cost" "$ROUNDS" 2>/dev/null | grep ns_per_alloc_free \
       | field ns_per_alloc_free)
fi
$PY - "$base" "$with" "$ht" <<'PYEOF'
import sys
base, with_, ht = sys.argv[1:]
base, with_ = float(base), float(with_)
print("%-40s %12s %14s" % ("", "ns per pair", "added per event"))
print("%-40s %12.1f %14s" % ("plain", base, "-"))
print("%-40s %12.1f %14.1f" % ("tidemark agent (2 events per pair)", with_, (with_ - base) / 2))
if ht != "n/a":
    ht = float(ht)
    print("%-40s %12.1f %14.1f" % ("heaptrack (2 events per pair)", ht, (ht - base) / 2))
    print("hook cost per event, tidemark / heaptrack: %.3f" % ((with_ - base) / (ht - base)))
PYEOF

echo
echo "== 2b. bursts: 8 threads, bursts of up to 40,000 aligned blocks each (tests/agent/burst_program.cpp):"
echo "   the bursts' own time (the job held up) and the whole run's wall time (the recording"
echo "   delivered to tidemarkd, or handed to it in a file at exit; written by heaptrack), best of 3"
echo "   interleaved. Every run starts on a quiet machine: after the daemon has stored and analysed"
echo "   the runs before it (on this machine's 2 cores that work would be timed as the next run's);"
echo "   how long it took after the job's exit is its own column, and so is the processor time"
echo "   of the job's own 8 threads (the program's own work and the hooks'). tidemarkd --nice 0:"
echo "   a second daemon that neither pauses while the jobs want the processors nor lowers its"
echo "   niceness (the default --nice 10 does both: server/ingest/cpu_yield.h)"
BURST="$BIN/tidemark_burst_program 40000"
burst() {  # "<bursts' seconds> <job threads' processor seconds> <wall seconds>" of a run of "$@"
          # (the program's JSON on stdout)
  $PY -c "
import json, subprocess, sys, time
t = time.perf_counter()
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout
wall = time.perf_counter() - t
line = [l for l in out.decode().splitlines() if l.startswith('{')][-1]  # heaptrack talks too
print(json.loads(line)['elapsed_s'], json.loads(line)['threads_cpu_s'], wall)" "$@"
}
stored_after() {  # seconds until every burst session is stored and analysed (by both daemons)
  $PY - "$BIN/tidemark" "$SERVER" "$SERVER0" <<'PYEOF'
import json, subprocess, sys, time
t = time.perf_counter()
for server in sys.argv[2:]:
    for _ in range(1200):
        out = subprocess.run([sys.argv[1], "--server", server, "sessions", "--json"],
                             stdout=subprocess.PIPE, check=True).stdout
        if all(x['state'] != 'live' and x['analyzed'] for x in json.loads(out)['sessions']
               if 'burst_program' in x['command_line']):
            break
        time.sleep(0.05)
print("%.3f" % (time.perf_counter() - t))
PYEOF
}
# The same daemon with --nice 0, beside it: no pauses while the jobs want the processors
# (server/ingest/cpu_yield.h), and the niceness it was started with.
setsid "$BIN/tidemarkd" --nice 0 --listen 127.0.0.1:0 --no-unix --db "$WORK/bench0.db" \
  --port-file "$WORK/port0" 2>"$WORK/tidemarkd0.log" &
DAEMON0=$!
for _ in $(seq 100); do [ -f "$WORK/port0" ] && break; sleep 0.1; done
SERVER0=127.0.0.1:$(cat "$WORK/port0")
declare -A job cpu wall stored
for _ in 1 2 3; do
  for kind in plain lossless nopause lossy heaptrack; do
    case $kind in
      plain) r=$(burst $BURST) ;;
      lossless) r=$(burst "$BIN/tidemark" --server "$SERVER" run --quiet -- $BURST) ;;
      nopause) r=$(burst "$BIN/tidemark" --server "$SERVER0" run --quiet -- $BURST) ;;
      lossy) r=$(burst "$BIN/tidemark" --server "$SERVER" run --quiet --lossy -- $BURST) ;;
      heaptrack) command -v heaptrack >/dev/null || continue
                 r=$(cd "$WORK" && burst heaptrack -o "$WORK/burst-ht" $BURST) ;;
    esac
    read -r b c w <<<"$r"
    job[$kind]=$(minof "${job[$kind]:-}" "$b")
    cpu[$kind]=$(minof "${cpu[$kind]:-}" "$c")
    wall[$kind]=$(minof "${wall[$kind]:-}" "$w")
    s=$(stored_after)
    stored[$kind]=$(minof "${stored[$kind]:-}" "$s")
  done
done
# What the last lossless and lossy runs kept (sessions are listed in the order they ran), once
# the daemon has stored what their agents handed over at exit (docs/architecture.md).
kept=$($PY - "$BIN/tidemark" "$SERVER" "$SERVER0" <<'PYEOF'
import json, subprocess, sys, time
def bursts(server):
    for _ in range(600):
        out = subprocess.run([sys.argv[1], "--server", server, "sessions", "--json"],
                             stdout=subprocess.PIPE, check=True).stdout
        s = [x for x in json.loads(out)['sessions'] if 'burst_program' in x['command_line']]
        if all(x['state'] != 'live' for x in s[-2:]):
            return s
        time.sleep(0.5)
    return s
s, s0 = bursts(sys.argv[2]), bursts(sys.argv[3])
print(s[-2]['events_dropped'], s[-1]['events_dropped'], s[-2]['events_stored'],
      s0[-1]['events_dropped'])
PYEOF
)
kill $DAEMON0; wait $DAEMON0 2>/dev/null || true; DAEMON0=
$PY - "${job[plain]}" "${wall[plain]}" "${job[lossless]}" "${wall[lossless]}" "${job[lossy]}" \
  "${wall[lossy]}" "${job[heaptrack]:-0}" "${wall[heaptrack]:-0}" $kept \
  "${stored[lossless]}" "${stored[lossy]}" "${job[nopause]}" "${wall[nopause]}" \
  "${stored[nopause]}" "${cpu[plain]}" "${cpu[lossless]}" "${cpu[nopause]}" "${cpu[lossy]}" \
  "${cpu[heaptrack]:-0}" <<'PYEOF'
import sys
v = list(map(float, sys.argv[1:9]))
cpu = list(map(float, sys.argv[18:23]))  # the job's own threads' processor time
drop_lossless, drop_lossy, stored, drop_nopause = map(int, sys.argv[9:13])
later_lossless, later_lossy = map(float, sys.argv[13:15])
job0, wall0, later0 = map(float, sys.argv[15:18])
rows = [("plain", v[0], cpu[0], v[1], "-", "-"),
        ("tidemark run (lossless, default)", v[2], cpu[1], v[3], drop_lossless,
         "%.2f" % later_lossless),
        ("  the same, tidemarkd --nice 0", job0, cpu[2], wall0, drop_nopause, "%.2f" % later0),
        ("tidemark run --lossy", v[4], cpu[3], v[5], drop_lossy, "%.2f" % later_lossy)]
if v[6] > 0:
    rows.append(("heaptrack (lossless)", v[6], cpu[4], v[7], 0, "-"))
print("%-36s %10s %7s %12s %10s %7s %10s %12s" % ("", "bursts (s)", "ratio", "threads' cpu",
                                                  "wall (s)", "ratio", "dropped", "analysed +(s)"))
for name, job, threads, wall, dropped, later in rows:
    print("%-36s %10.3f %7.2f %12.3f %10.3f %7.2f %10s %12s"
          % (name, job, job / v[0], threads, wall, wall / v[1], dropped, later))
if v[6] > 0:
    print("lossless, tidemark / heaptrack: bursts %.3f, wall %.3f (target <= 0.5); %d events stored"
          % (v[2] / v[6], v[3] / v[7], stored))
PYEOF
echo
fi

if want 3; then
echo "== 3. a session of $EVENTS events (bench/scale_bench.cpp)"
"$BIN/bench_scale" --server "$SERVER" --events "$EVENTS" --scratch "$WORK/raw.db" > "$WORK/scale.json"
SCALE_SESSION=$($PY -c "import json; print(json.load(open('$WORK/scale.json'))['session'])")
$PY - "$WORK/scale.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("ingest through the Ingest API   %10.0f events/s  (%.2f s)" % (r["ingest_events_per_s"], r["ingest_s"]))
print("raw SQLite, one row per event   %10.0f rows/s" % r["raw_sqlite_rows_per_s"])
print("ratio ingest / raw SQLite       %10.2f" % (r["ingest_events_per_s"] / r["raw_sqlite_rows_per_s"]))
print("analysis pass stored after      %10.2f s" % r["analysis_s"])
print("timeline, 2000 buckets, full    %10.1f ms median, %.1f ms worst of 20" % (r["timeline_full_ms_median"], r["timeline_full_ms_max"]))
print("timeline, 2000 buckets, zoomed  %10.1f ms median, %.1f ms worst of 20" % (r["timeline_zoom_ms_median"], r["timeline_zoom_ms_max"]))
PYEOF
# The same size of session as a GPU job records it with torch's tensor view: tensors inside
# device segments, which the analysis ties together (the reconciliation).
"$BIN/bench_scale" --server "$SERVER" --events "$EVENTS" --scratch "$WORK/raw.db" --tensors \
  > "$WORK/scale-tensors.json"
$PY - "$WORK/scale.json" "$WORK/scale-tensors.json" <<'PYEOF'
import json, sys
host, gpu = (json.load(open(p)) for p in sys.argv[1:3])
print("analysis, tensors in segments   %10.2f s  (ratio to host blocks %.2f)" % (gpu["analysis_s"], gpu["analysis_s"] / host["analysis_s"]))
PYEOF

# Sessions of growing length, each into a fresh daemon of its own (default memory budget), so
# that its peak memory (VmHWM) is the session's: cost against length, as ratios to the first.
echo
echo "   sessions of $SCALE_SIZES events, a step every $SCALE_STEP_EVENTS events, each in a fresh tidemarkd"
echo "   (--memory-budget 1GiB); analysis s: from the session's end until it is stored analysed"
for n in $SCALE_SIZES; do
  d="$WORK/scale-$n"
  mkdir -p "$d"
  "$BIN/tidemarkd" --listen 127.0.0.1:0 --no-unix --db "$d/store.db" --port-file "$d/port" \
    2>"$d/tidemarkd.log" &
  pid=$!
  for _ in $(seq 100); do [ -f "$d/port" ] && break; sleep 0.1; done
  "$BIN/bench_scale" --server "127.0.0.1:$(cat "$d/port")" --events "$n" --no-raw --progress \
    --step-events "$SCALE_STEP_EVENTS" > "$d/scale.json"
  hwm=$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$pid/status")
  kill "$pid"; wait "$pid" || true
  store=$(du -cb "$d"/store.db* | tail -1 | cut -f1)
  echo "$hwm $store" > "$d/memory"
  rm -f "$d"/store.db*
done
$PY - "$WORK" $SCALE_SIZES <<'PYEOF'
import json, sys
work, sizes = sys.argv[1], sys.argv[2:]
rows = []
for n in sizes:
    r = json.load(open("%s/scale-%s/scale.json" % (work, n)))
    hwm, store = map(int, open("%s/scale-%s/memory" % (work, n)).read().split())
    rows.append((int(n), r["ingest_events_per_s"], hwm / 2**20, r["analysis_s"],
                 r["timeline_full_ms_median"], r["timeline_zoom_ms_median"], r["peak_ms_median"],
                 store / int(n)))
head = ("events", "ingest ev/s", "peak RSS MiB", "analysis s", "timeline ms", "zoomed ms",
        "peak ms", "store B/ev")
print("%12s %12s %12s %11s %12s %10s %8s %11s" % head)
for row in rows:
    print("%12d %12.0f %12.1f %11.1f %12.1f %10.1f %8.2f %11.1f" % row)
first, last = rows[0], rows[-1]
print("%12s %12.2f %12.2f %11.2f %12.2f %10.2f %8.2f %11.2f   (targets: ingest >= 0.9, memory and "
      "queries <= 1.2)" % (("ratio %dM/%dM" % (last[0] // 10**6, first[0] // 10**6),) +
                           tuple(l / f for l, f in zip(last[1:], first[1:]))))
PYEOF

# Live sessions: the same queries at a tenth of the session and at its end, while it is live
# (answered by the ingest's live analysis), as ratios end / start.
echo
echo "   live sessions 2 hours long (by their timestamps), 500 steps, queried live (ms, median of 15;"
echo "   cold: the first query, which replays the events since the last step's end)"
for n in $LIVE_SIZES; do
  d="$WORK/live-$n"
  mkdir -p "$d"
  "$BIN/tidemarkd" --listen 127.0.0.1:0 --no-unix --db "$d/store.db" --port-file "$d/port" \
    2>"$d/tidemarkd.log" &
  pid=$!
  for _ in $(seq 100); do [ -f "$d/port" ] && break; sleep 0.1; done
  "$BIN/bench_scale" --server "127.0.0.1:$(cat "$d/port")" --events "$n" --no-raw --live-queries \
    --ns-per-event $((7200000000000 / n)) --step-events $((n / 500)) > "$d/live.json"
  awk '/VmHWM/ {print $2 * 1024}' "/proc/$pid/status" > "$d/memory"
  kill "$pid"; wait "$pid" || true
  rm -f "$d"/store.db*
done
$PY - "$WORK" $LIVE_SIZES <<'PYEOF'
import json, sys
work, sizes = sys.argv[1], sys.argv[2:]
queries = ("cold", "peak", "steps", "timeline", "zoom", "breakdown")
print("%12s %-6s %12s" % ("events", "when", "peak RSS MiB") + "".join("%11s" % q for q in queries))
for n in sizes:
    r = json.load(open("%s/live-%s/live.json" % (work, n)))
    hwm = int(open("%s/live-%s/memory" % (work, n)).read()) / 2**20
    start = [r["live_start_%s_ms" % q] for q in queries]
    end = [r["live_end_%s_ms" % q] for q in queries]
    print("%12d %-6s %12s" % (r["live_start_events"], "start", "") + "".join("%11.2f" % v for v in start))
    print("%12d %-6s %12.1f" % (r["live_end_events"], "end", hwm) + "".join("%11.2f" % v for v in end))
    print("%12s %-6s %12s" % ("", "ratio", "") + "".join("%11.2f" % (e / s) for e, s in zip(end, start))
          + "   (target <= 1.2; every query <= 50 ms)")
PYEOF

# A live session of many steps (one every 20 events: a million at 20M events) under a 256 MiB
# budget: the daemon holds the steps of its last commits only, whatever their number.
echo
echo "   a live session of $STEPS_EVENTS events, a step every 20 (tidemarkd --memory-budget 256MiB),"
echo "   queried live (ms, median of 15), and the daemon's peak memory"
d="$WORK/steps"
mkdir -p "$d"
"$BIN/tidemarkd" --memory-budget 256MiB --listen 127.0.0.1:0 --no-unix --db "$d/store.db" \
  --port-file "$d/port" 2>"$d/tidemarkd.log" &
pid=$!
for _ in $(seq 100); do [ -f "$d/port" ] && break; sleep 0.1; done
"$BIN/bench_scale" --server "127.0.0.1:$(cat "$d/port")" --events "$STEPS_EVENTS" --no-raw \
  --live-queries --step-events 20 > "$d/live.json"
awk '/VmHWM/ {print $2 * 1024}' "/proc/$pid/status" > "$d/memory"
kill "$pid"; wait "$pid" || true
rm -f "$d"/store.db*
$PY - "$d" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1] + "/live.json"))
hwm = int(open(sys.argv[1] + "/memory").read()) / 2**20
queries = ("peak", "steps", "timeline", "zoom", "breakdown")
print("%12s %10s %12s" % ("events", "steps", "peak RSS MiB") + "".join("%11s" % q for q in queries))
for when in ("start", "end"):
    n = r["live_%s_events" % when]
    print("%12d %10d %12s" % (n, n // 20, "%.1f" % hwm if when == "end" else "")
          + "".join("%11.2f" % r["live_%s_%s_ms" % (when, q)] for q in queries))
print("%12s %10s %12s" % ("", "ratio", "") + "".join(
    "%11.2f" % (r["live_end_%s_ms" % q] / r["live_start_%s_ms" % q]) for q in queries)
      + "   (peak RSS under 256 + 64 MiB; steps: one page of 4,096)")
PYEOF

# A live session whose daemon stops (SIGTERM) and a new one starts on the same store: the agent
# resumes it; the new daemon builds its live analysis again from the store. Past the blocks a
# query may load whole, the session answers once that is done.
echo
echo "   sessions left live by a stopped tidemarkd, resumed on a new one: seconds until the peak is"
echo "   answered again (its live analysis built again from the store; past the 2.7M blocks a query"
echo "   loads whole at the default budget, it is refused until then), beside the ingest's"
for n in $REBUILD_SIZES; do
  d="$WORK/rebuild-$n"
  mkdir -p "$d"
  for run in 1 2; do
    rm -f "$d/port"
    "$BIN/tidemarkd" --listen 127.0.0.1:0 --no-unix --db "$d/store.db" --port-file "$d/port" \
      2>>"$d/tidemarkd.log" &
    pid=$!
    for _ in $(seq 100); do [ -f "$d/port" ] && break; sleep 0.1; done
    if [ "$run" = 1 ]; then
      "$BIN/bench_scale" --server "127.0.0.1:$(cat "$d/port")" --events "$n" --no-raw \
        --step-events $((n / 500)) --leave-live > "$d/left.json"
    else
      "$BIN/bench_scale" --server "127.0.0.1:$(cat "$d/port")" \
        --resume "$($PY -c "import json; print(json.load(open('$d/left.json'))['session'])")" \
        > "$d/resumed.json"
    fi
    kill "$pid"; wait "$pid" || true
  done
  rm -f "$d"/store.db*
done
$PY - "$WORK" $REBUILD_SIZES <<'PYEOF'
import json, sys
work, sizes = sys.argv[1], sys.argv[2:]
print("%12s %10s %12s %16s %10s" % ("events", "ingest s", "answered s", "refused before", "ev/s"))
for n in sizes:
    left = json.load(open("%s/rebuild-%s/left.json" % (work, n)))
    back = json.load(open("%s/rebuild-%s/resumed.json" % (work, n)))
    print("%12d %10.1f %12.1f %16d %10.0f" % (int(n), left["ingest_s"], back["answered_s"],
                                             back["refused_before"], int(n) / back["answered_s"]))
PYEOF

echo
fi

if want 4; then
echo "== 4. the optimal chain planner on 200 blocks (bench/pareto_bench.cpp), target 1 s; long chains on the grid"
"$BIN/bench_pareto" 200 > "$WORK/pareto.json"
"$BIN/bench_pareto" --plans 200 > "$WORK/pareto_plans.json"
$PY - "$WORK/pareto.json" "$WORK/pareto_plans.json" <<'PYEOF'
import json, sys
print("%-15s %10s %8s %14s %22s" % ("chain", "solve (s)", "/ 1 s", "curve points", "plans + simulations (s)"))
whole = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    whole[r["chain"]] = r["solve_s"]
    print("%-15s %10.3f %8.3f %14d %22.3f" % (r["chain"], r["solve_s"], r["solve_s"] / 1.0,
                                            r["curve_points"], r["plans_and_simulations_s"]))
print("   the plan for one budget (tidemark plan: the solve cut at the budget), budgets 10/50/90 %")
print("   of the way from the least feasible one to storing everything, as a ratio of the whole solve")
print("%-15s %10s %10s %10s" % ("chain", "10 %", "50 %", "90 %"))
plans = {}
for line in open(sys.argv[2]):
    r = json.loads(line)
    plans.setdefault(r["chain"], []).append(r["plan_s"] / whole[r["chain"]])
for chain, ratios in plans.items():
    print("%-15s %10.3f %10.3f %10.3f" % (chain, *ratios))
PYEOF
echo "   nested plans (bench_pareto --nested N): the whole nested curve beside the one-level one, and the"
echo "   least feasible budget above static of each (nested / one level: what nesting saves)"
for n in 32 48 64; do "$BIN/bench_pareto" --nested $n; done > "$WORK/pareto_nested.json"
$PY - "$WORK/pareto_nested.json" <<'PYEOF'
import json, sys
print("%-15s %7s %12s %12s %14s %14s %8s" % ("chain", "stages", "nested (s)", "1-level (s)",
      "least nested", "least 1-level", "ratio"))
for line in open(sys.argv[1]):
    r = json.loads(line)
    a, b = r["nested_least_above_static"], r["one_level_least_above_static"]
    print("%-15s %7d %12.3f %12.4f %11.1f MiB %11.1f MiB %8.3f" % (r["chain"], r["blocks"],
          r["nested_solve_s"], r["one_level_solve_s"], a / 2**20, b / 2**20, a / b))
PYEOF
echo "   long chains: the grid solver's whole curve (best of 3) beside the targets (1,000 stages 1 s,"
echo "   10,000 stages 10 s); the plans' and the bound's grid values, the curve's points, epsilon"
echo "   (proven, as a share of the budget range; target <= 0.5 %) and, on 200 stages, the shift"
echo "   actually needed to put the grid's curve under the exact one"
for n in 200 1000 10000; do "$BIN/bench_pareto" --grid $n; done > "$WORK/pareto_grid.json"
$PY - "$WORK/pareto_grid.json" <<'PYEOF'
import json, sys
print("%-15s %7s %10s %8s %8s %8s %8s %10s %12s %12s" % ("chain", "stages", "solve (s)",
      "/ target", "grid", "bound", "points", "epsilon", "measured", "exact (s)"))
for line in open(sys.argv[1]):
    r = json.loads(line)
    target = 1.0 if r["blocks"] <= 1000 else 10.0
    measured = ("%11.3f%%" % (100.0 * r["measured_shift_bytes"] / r["range_bytes"])
                if r["measured_shift_bytes"] >= 0 else "%12s" % "-")
    exact = "%12.3f" % r["exact_solve_s"] if r["exact_solve_s"] >= 0 else "%12s" % "-"
    print("%-15s %7d %10.3f %8.3f %8d %8d %8d %9.3f%% %s %s" % (r["chain"], r["blocks"],
          r["grid_solve_s"], r["grid_solve_s"] / target, r["grid_points"], r["bound_points"],
          r["curve_points"], 100.0 * r["epsilon_share"], measured, exact))
PYEOF

echo
fi

if want 5; then
echo "== 5. the GUI's timeline (bench/gui_repaint.cpp) on session $SCALE_SESSION ($EVENTS events), target 16 ms"
QT_QPA_PLATFORM=offscreen "$BIN/bench_gui_repaint" --server "$SERVER" --open "$SCALE_SESSION" \
  > "$WORK/gui.json" 2>/dev/null
$PY - "$WORK/gui.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("buckets drawn                   %10d" % r["buckets"])
print("repaint, full range             %10.2f ms median, %.2f ms worst of 50 (/ 16 ms: %.2f)"
      % (r["repaint_full_ms_median"], r["repaint_full_ms_max"], r["repaint_full_ms_median"] / 16))
print("repaint, zoomed to a tenth      %10.2f ms median, %.2f ms worst of 50 (/ 16 ms: %.2f)"
      % (r["repaint_zoom_ms_median"], r["repaint_zoom_ms_max"], r["repaint_zoom_ms_median"] / 16))
print("timeline fetch (full / zoomed)  %10.1f ms / %.1f ms" % (r["fetch_full_ms"], r["fetch_zoom_ms"]))
PYEOF
fi

if want 6; then
echo
echo "== 6. load: 16 burst jobs (8 threads, bursts of 5,000) + 8 trainings of bench/train_step_time.py"
echo "   against one fresh tidemarkd at once (bench/load_run.py)"
$PY bench/load_run.py "$BIN" || echo "   (some session was not whole: see above)"
fi

if want 7; then
echo
echo "== 7. the job query on a 64-rank job (bench/job_query.py; median of 9, CLI start included)"
$PY bench/job_query.py "$BIN" 64 9
fi

if want 8; then
echo
echo "== 8. the PostgreSQL store beside SQLite (bench/postgres_bench.py; a server on this machine,"
echo "   fsync on, commits not waiting for it: as SQLite's WAL with synchronous=NORMAL)"
$PY bench/postgres_bench.py "$BIN" "$EVENTS"
fi

if want 9; then
echo
echo "== 9. the advisor beside the standard methods on the examples' GPT and the transformers GPT-2,"
echo "   8 blocks each, torch 2, measured live (bench/advisor_comparison.py; peaks: medians of the"
echo "   steps after the first; times: the fastest)"
for M in "" --gpt2 --compiled; do
  $PY bench/advisor_comparison.py "$BIN" "${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python" 8 10 $M
done
# Nested plans below checkpoint-all's peak, on a chain long enough for nesting to pay.
$PY bench/advisor_comparison.py "$BIN" "${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python" 32 6 --nested
fi

if want 10; then
echo
echo "== 10. recomputation time, predicted (from the forwards; calibrated by recorded re-runs)"
echo "   against measured (bench/recompute_time.py; the steady steps' recompute phases: the median"
echo "   and the mean step, the median of 3 trainings of 20 steps), torch 2"
for M in gpt convnet; do
  $PY bench/recompute_time.py "$BIN" "${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python" --model $M \
    --steps 20
done
echo
echo "== 10b. op-level options that keep some of a block's matrix products (bench/op_options.py):"
echo "   the least recomputation predicted at equal budgets without and with them; the halfway"
echo "   plan applied, predicted against measured peak"
$PY bench/op_options.py "$BIN" "${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python"
echo
echo "== 10c. op-level options' re-runs, measured against predicted from the recording and"
echo "   calibrated by recorded re-runs (bench/op_option_times.py)"
$PY bench/op_option_times.py "$BIN" "${TIDEMARK_VENV:-/opt/tidemark-venv}/bin/python"
fi
