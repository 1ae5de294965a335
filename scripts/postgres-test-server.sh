#!/usr/bin/env bash
# A real PostgreSQL server for the tests (Debian's postgresql package): made with initdb in a
# temporary directory, listening on a Unix socket there only, stopped and removed at the end.
#
#   scripts/postgres-test-server.sh start URI_FILE [ADDR]
#       starts one; writes its admin URI to URI_FILE. With ADDR it also listens on that IPv4
#       address (tests/e2e/test_two_hosts.py: a network namespace's end of a veth link), and
#       takes clients of ADDR's /24 without a password; the URI names it.
#   scripts/postgres-test-server.sh stop URI_FILE    stops the one URI_FILE names, removes it
#   scripts/postgres-test-server.sh halt URI_FILE    stops it, keeping its data (a server down)
#   scripts/postgres-test-server.sh resume URI_FILE  starts a halted one again
#
# The tests make a database of their own on it for each case (tests/support/postgres_test_db.*).
# Run as root, the server runs as the `postgres` user the package made (initdb refuses root).
# Its settings are for tests: fsync off (a crash loses nothing a test needs); POSTGRES_FSYNC=on
# keeps it (bench/postgres_bench.py: against SQLite's write-ahead log, which syncs too). Commits
# do not wait for their log flush either way (synchronous_commit off, as SQLite's
# synchronous=NORMAL in WAL mode: a crash of the machine may lose the last commits, never the
# database).
set -euo pipefail
cmd=${1:-}
uri_file=${2:-}
listen=${3:-}
if [[ -z "$cmd" || -z "$uri_file" ]]; then
  echo "usage: $0 start|stop|halt|resume URI_FILE" >&2
  exit 2
fi
uri_file=$(realpath -m "$uri_file")
cd /  # the server's user may not be allowed into the caller's directory
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [[ -z "$bin" || ! -x "$bin/initdb" ]]; then
  echo "postgres-test-server: PostgreSQL's server is not installed (apt-get install postgresql;" \
       "scripts/install-deps.sh does it)" >&2
  exit 1
fi
as_server() {
  if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
port=54329

case "$cmd" in
start)
  dir=$(mktemp -d /tmp/tidemark-pg.XXXXXX)
  [[ $(id -u) == 0 ]] && chown postgres: "$dir"
  as_server "$bin/initdb" -D "$dir/data" -U tidemark --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    exit 1
  }
  if [[ -n "$listen" ]]; then
    echo "host all all ${listen%.*}.0/24 trust" >>"$dir/data/pg_hba.conf"
  fi
  options="-k $dir -c listen_addresses='$listen' -p $port -c fsync=${POSTGRES_FSYNC:-off} -c synchronous_commit=off -c max_connections=200"
  echo "$options" >"$dir/options"
  as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$options" \
    start >/dev/null || {
    cat "$dir/server.log" >&2
    exit 1
  }
  as_server "$bin/createdb" -h "$dir" -p "$port" -U tidemark tidemark
  if [[ -n "$listen" ]]; then
    echo "postgresql://tidemark@$listen:$port/tidemark?sslmode=disable" >"$uri_file"
    echo "$dir" >"$uri_file.dir"
  else
    echo "postgresql://tidemark@/tidemark?host=$dir&port=$port" >"$uri_file"
  fi
  echo "postgres-test-server: started in $dir ($(cat "$uri_file"))"
  ;;
stop | halt | resume)
  [[ -f "$uri_file" ]] || exit 0
  if [[ -f "$uri_file.dir" ]]; then
    dir=$(cat "$uri_file.dir")
  else
    dir=$(sed -e 's/.*host=\([^&]*\).*/\1/' "$uri_file")
  fi
  case "$dir" in /tmp/tidemark-pg.*) ;; *) echo "postgres-test-server: not one of ours: $dir" >&2; exit 1 ;; esac
  if [[ "$cmd" == halt ]]; then
    as_server "$bin/pg_ctl" -D "$dir/data" -w -m fast stop >/dev/null
    exit 0
  elif [[ "$cmd" == resume ]]; then
    as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$(cat "$dir/options")" \
      start >/dev/null
    exit 0
  fi
  rm -f "$uri_file" "$uri_file.dir"
  as_server "$bin/pg_ctl" -D "$dir/data" -w -m fast stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  echo "postgres-test-server: stopped and removed $dir"
  ;;
*)
  echo "usage: $0 start|stop|halt|resume URI_FILE" >&2
  exit 2
  ;;
esac
