# Sourced by demo.sh and gpu-check.sh: start_tidemarkd DIR starts $BIN/tidemarkd on a free
# loopback port with its store DIR/tidemark.db (log DIR/tidemarkd.log), stops it when the script
# exits, and exports TIDEMARK_SERVER for the CLI and the agent.
start_tidemarkd() {
  local dir=$1
  "$BIN/tidemarkd" --listen 127.0.0.1:0 --no-unix --db "$dir/tidemark.db" \
    --port-file "$dir/port" 2>"$dir/tidemarkd.log" &
  DAEMON=$!
  trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null || true' EXIT
  for _ in $(seq 100); do [ -f "$dir/port" ] && break; sleep 0.1; done
  if [ ! -f "$dir/port" ]; then
    echo "tidemarkd did not start:" >&2
    cat "$dir/tidemarkd.log" >&2
    exit 1
  fi
  export TIDEMARK_SERVER=127.0.0.1:$(cat "$dir/port")
}
