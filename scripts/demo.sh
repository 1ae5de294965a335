#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts tidemarkd with its SQLite store, runs the
# example's checkpointed GPT training under `tidemark run`, and prints the session, its memory
# breakdown at the peak, what is live there by module and tensor, and each step's peak. Then the
# advisor: the chain model of the recorded step, the Pareto curve, a plan for 70 % of the
# store-all peak; the plan is applied to a second, running training at a step boundary
# (`tidemark apply`) and `tidemark plan-check` compares the prediction with the steps that ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BIN=$PWD/${BUILD_DIR:-build}/bin
DEMO=$(mktemp -d -t tidemark-demo-XXXXXX)
STEPS=${STEPS:-4}

source scripts/start-tidemarkd.sh
start_tidemarkd "$DEMO"
echo "== tidemarkd on $TIDEMARK_SERVER, store $DEMO/tidemark.db"

echo "== tidemark run -- python3 examples/train.py --steps $STEPS"
"$BIN/tidemark" run --name demo -- /usr/bin/python3 examples/train.py --steps "$STEPS"

# The session once it has ended: an agent that ends far ahead of the daemon hands the rest over
# in a file, stored just after the job's exit.
SESSION=$(/usr/bin/python3 - "$BIN/tidemark" <<'PYEOF'
import json, subprocess, sys, time
for _ in range(600):
    s = json.loads(subprocess.run([sys.argv[1], "sessions", "--json"], stdout=subprocess.PIPE,
                                  check=True).stdout)["sessions"][-1]
    if s["state"] != "live":
        break
    time.sleep(0.2)
print(s["id"])
PYEOF
)
echo; echo "== tidemark sessions"
"$BIN/tidemark" sessions
echo; echo "== tidemark breakdown $SESSION   (the peak of the whole run)"
"$BIN/tidemark" breakdown "$SESSION"
echo; echo "== tidemark peak $SESSION --top 6   (what is live at the peak)"
"$BIN/tidemark" peak "$SESSION" --top 6 | sed -n '/^MODULE/,$p'
echo; echo "== tidemark steps $SESSION   (each step's peak)"
"$BIN/tidemark" steps "$SESSION"

echo; echo "== tidemark chain $SESSION   (the advisor's model of the last step, checked against it)"
"$BIN/tidemark" chain "$SESSION"
echo; echo "== tidemark pareto $SESSION   (least recomputation for every budget)"
"$BIN/tidemark" pareto "$SESSION" --points 10
echo; echo "== tidemark plan $SESSION --budget 70% --out plan.json"
"$BIN/tidemark" plan "$SESSION" --budget 70% --out "$DEMO/plan.json"

LIVE_STEPS=${LIVE_STEPS:-12}
# The plan goes in once 4 steps have run: plan-check's "before" is then the median of steps 2-4
# (step 1 builds the optimizer's state), not of one or two steps still warming up.
echo; echo "== the same training, no checkpointing of its own, $LIVE_STEPS steps; the plan applied live"
"$BIN/tidemark" run --name demo-live -- /usr/bin/python3 examples/train.py --steps "$LIVE_STEPS" \
  --checkpoint "" > "$DEMO/live.out" 2>&1 &
JOB=$!
LIVE=""
for _ in $(seq 600); do
  LIVE=$("$BIN/tidemark" sessions --json | /usr/bin/python3 -c '
import json, sys
live = [s for s in json.load(sys.stdin)["sessions"] if s["state"] == "live" and s["steps"] >= 4]
print(live[-1]["id"] if live else "")')
  [ -n "$LIVE" ] && break
  sleep 0.2
done
if [ -z "$LIVE" ]; then echo "demo: the live training did not start" >&2; cat "$DEMO/live.out" >&2; exit 1; fi
echo "== tidemark apply $LIVE plan.json"
"$BIN/tidemark" apply "$LIVE" "$DEMO/plan.json"
wait $JOB
cat "$DEMO/live.out"
echo; echo "== tidemark plan-check $LIVE   (predicted against measured)"
"$BIN/tidemark" plan-check "$LIVE"
echo
echo "== the recording stays in $DEMO/tidemark.db once this demo's daemon stops; open it with"
echo "   $BIN/tidemark-gui --db $DEMO/tidemark.db --open $SESSION"
echo "   $BIN/tidemark --db $DEMO/tidemark.db breakdown $SESSION"
