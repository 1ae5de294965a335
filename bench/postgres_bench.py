"""The PostgreSQL store beside the SQLite one, for bench/run.sh (section 8). A real PostgreSQL
server (scripts/postgres-test-server.sh, with fsync on) on this machine, a database per figure:

  1. one session of EVENTS events through the real Ingest API (bench_scale), into a daemon on
     SQLite and into one on PostgreSQL: ingest rate, analysis time, peak and timeline query
     latency, and each figure's ratio PostgreSQL / SQLite;
  2. 8 ranks recording at once (8 bench_scale clients of EVENTS/8 events): into one daemon on
     SQLite, and through two daemons (4 each) into one PostgreSQL: the events stored per second
     by all of them together (total events / the last one's ingest time), and the ratio;
  3. the job query on a 64-rank job (bench/job_query.py) with its daemon on PostgreSQL.

    python3 bench/postgres_bench.py BIN [EVENTS]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)


def start_daemon(bin_dir, work, name, store):
    port_file = os.path.join(work, "port-" + name)
    log = open(os.path.join(work, "tidemarkd-%s.log" % name), "w")
    proc = subprocess.Popen([os.path.join(bin_dir, "tidemarkd"), "--listen", "127.0.0.1:0",
                             "--no-unix", "--store", store, "--name", name, "--port-file",
                             port_file], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, "127.0.0.1:" + open(port_file).read().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("tidemarkd %s did not start: %s" % (name, open(log.name).read()))


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=120)


def bench_scale(bin_dir, server, events):
    return subprocess.Popen([os.path.join(bin_dir, "bench_scale"), "--server", server, "--events",
                             str(events), "--no-raw"], stdout=subprocess.PIPE, text=True)


def result(proc):
    out, _ = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError("bench_scale failed (%d)" % proc.returncode)
    return json.loads(out.strip().splitlines()[-1])


def new_database(admin, name):
    subprocess.run(["psql", admin, "-qc", "CREATE DATABASE " + name], check=True)
    head, _, query = admin.partition("?")
    return head[:head.index("/", head.index("://") + 3) + 1] + name + "?" + query


def main():
    bin_dir = sys.argv[1]
    events = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000
    work = tempfile.mkdtemp(prefix="tidemark-bench-pg-")
    uri_file = os.path.join(work, "postgres.uri")
    server = os.path.join(SOURCE, "scripts", "postgres-test-server.sh")
    subprocess.run(["bash", server, "start", uri_file], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, POSTGRES_FSYNC="on"))
    try:
        admin = open(uri_file).read().strip()
        # 1. One session, each store.
        one = {}
        for backend in ("sqlite", "postgresql"):
            store = (os.path.join(work, "one.db") if backend == "sqlite"
                     else new_database(admin, "one_session"))
            proc, address = start_daemon(bin_dir, work, "one-" + backend, store)
            try:
                one[backend] = result(bench_scale(bin_dir, address, events))
            finally:
                stop([proc])
        print("-- one session of %d events (the same for both)" % events)
        print("%-32s %12s %12s %8s" % ("", "SQLite", "PostgreSQL", "ratio"))
        rows = [("ingest (events/s)", "ingest_events_per_s", "%12.0f"),
                ("analysis at the end (s)", "analysis_s", "%12.2f"),
                ("peak query (ms, median)", "peak_ms_median", "%12.1f"),
                ("timeline, 2000 buckets (ms)", "timeline_full_ms_median", "%12.1f"),
                ("timeline, zoomed (ms)", "timeline_zoom_ms_median", "%12.1f")]
        for label, key, fmt in rows:
            a, b = one["sqlite"][key], one["postgresql"][key]
            print("%-32s " % label + fmt % a + " " + fmt % b + " %8.2f" % (b / a if a else 0))

        # 2. Eight ranks at once.
        per_rank = events // 8
        rates = {}
        for backend in ("sqlite", "postgresql"):
            if backend == "sqlite":
                daemons = [start_daemon(bin_dir, work, "ranks-sqlite", os.path.join(work, "r.db"))]
            else:
                store = new_database(admin, "eight_ranks")
                daemons = [start_daemon(bin_dir, work, "ranks-pg-" + n, store) for n in "ab"]
            try:
                clients = [bench_scale(bin_dir, daemons[i % len(daemons)][1], per_rank)
                           for i in range(8)]
                results = [result(c) for c in clients]
            finally:
                stop([p for p, _ in daemons])
            rates[backend] = 8 * per_rank / max(r["ingest_s"] for r in results)
        print("-- 8 ranks of %d events at once (SQLite: one daemon; PostgreSQL: two daemons, 4 "
              "ranks each)" % per_rank)
        print("%-32s %12.0f %12.0f %8.2f" % ("stored by all (events/s)", rates["sqlite"],
                                             rates["postgresql"],
                                             rates["postgresql"] / rates["sqlite"]))
        sys.stdout.flush()
        # 3. The job query, the daemon on PostgreSQL.
        print("-- the job query on a 64-rank job, the daemon's store on PostgreSQL")
        subprocess.run([sys.executable, os.path.join(HERE, "job_query.py"), bin_dir, "64", "9",
                        new_database(admin, "job_query")], check=True)
    finally:
        subprocess.run(["bash", server, "stop", uri_file], stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
