#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts tidemarkd with its SQLite store, runs the
# example's checkpointed GPT training under `tidemark run`, and prints the session, its memory
# breakdown at the peak, what is live there by module and tensor, and each step's peak.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BIN=$PWD/${BUILD_DIR:-build}/bin
DEMO=$(mktemp -d -t tidemark-demo-XXXXXX)
STEPS=${STEPS:-4}

"$BIN/tidemarkd" --listen 127.0.0.1:0 --no-unix --db "$DEMO/tidemark.db" \
  --port-file "$DEMO/port" 2>"$DEMO/tidemarkd.log" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -f "$DEMO/port" ] && break; sleep 0.1; done
export TIDEMARK_SERVER=127.0.0.1:$(cat "$DEMO/port")
echo "== tidemarkd on $TIDEMARK_SERVER, store $DEMO/tidemark.db"

echo "== tidemark run -- python3 examples/train.py --steps $STEPS"
"$BIN/tidemark" run --name demo -- /usr/bin/python3 examples/train.py --steps "$STEPS"

echo; echo "== tidemark sessions"
"$BIN/tidemark" sessions
SESSION=$("$BIN/tidemark" sessions --json | /usr/bin/python3 -c \
  'import json,sys; print(json.load(sys.stdin)["sessions"][-1]["id"])')
echo; echo "== tidemark breakdown $SESSION   (the peak of the whole run)"
"$BIN/tidemark" breakdown "$SESSION"
echo; echo "== tidemark peak $SESSION --top 6   (what is live at the peak)"
"$BIN/tidemark" peak "$SESSION" --top 6 | sed -n '/^MODULE/,$p'
echo; echo "== tidemark steps $SESSION   (each step's peak)"
"$BIN/tidemark" steps "$SESSION"
