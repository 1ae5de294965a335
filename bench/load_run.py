"""The load run of bench/run.sh (section 6): native burst jobs and trainings against one fresh
tidemarkd at the same time, every one lossless by default. Reports whether every session is whole
(ended, nothing dropped, events sent = stored), the daemon's peak memory (VmHWM), and the latency
of `tidemark sessions` while the jobs stream in.

Usage: python3 bench/load_run.py BIN_DIR [--bursts 16] [--trainings 8] [--burst-size 5000]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin")
    p.add_argument("--bursts", type=int, default=16)
    p.add_argument("--trainings", type=int, default=8)
    p.add_argument("--burst-size", type=int, default=5000)
    p.add_argument("--python", default="/usr/bin/python3")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="tidemark-load-")
    port_file = os.path.join(work, "port")
    # In a session of its own, as `tidemark` starts the user's own daemon (cli/own_daemon.cpp)
    # and as a service manager would: with the kernel's autogroups, the daemon then shares the
    # CPU with the jobs as one group, not as one thread among their hundreds (started in the
    # jobs' session, it connected so late on 2 cores that 13 to 15 of the 16 burst jobs spooled).
    daemon = subprocess.Popen([os.path.join(a.bin, "tidemarkd"), "--listen", "127.0.0.1:0",
                               "--no-unix", "--db", os.path.join(work, "load.db"), "--port-file",
                               port_file], stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while not os.path.exists(port_file):
            time.sleep(0.05)
        with open(port_file) as f:
            server = "127.0.0.1:" + f.read().strip()
        tidemark = [os.path.join(a.bin, "tidemark"), "--server", server]
        jobs = []
        t0 = time.perf_counter()
        for _ in range(a.bursts):
            jobs.append(subprocess.Popen(
                tidemark + ["run", "--quiet", "--", os.path.join(a.bin, "tidemark_burst_program"),
                            str(a.burst_size)], stdout=subprocess.DEVNULL))
        for _ in range(a.trainings):
            jobs.append(subprocess.Popen(
                tidemark + ["run", "--quiet", "--", a.python, os.path.join(HERE, "train_step_time.py"),
                            "--steps", "3"], stdout=subprocess.DEVNULL,
                env=dict(os.environ, OPENBLAS_NUM_THREADS="1")))
        latencies = []
        while any(j.poll() is None for j in jobs):
            q = time.perf_counter()
            r = subprocess.run(tidemark + ["sessions", "--json"], capture_output=True, text=True)
            if r.returncode == 0:
                latencies.append((time.perf_counter() - q) * 1000)
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        failed = sum(1 for j in jobs if j.returncode != 0)
        # Sessions whose agents handed the end of their run over in a file end once the daemon
        # has stored it; a job whose handshake never reached the daemon gets its session once
        # the daemon has found its spool (a look every 2 s): up to 10 s more for those.
        pids = {j.pid for j in jobs}
        settled = None
        for _ in range(600):
            sessions = json.loads(subprocess.run(tidemark + ["sessions", "--json"],
                                                 capture_output=True, text=True,
                                                 check=True).stdout)["sessions"]
            if all(s["state"] != "live" for s in sessions):
                settled = settled or time.perf_counter()
                if pids <= {s["pid"] for s in sessions} or time.perf_counter() - settled > 10:
                    break
            else:
                settled = None
            time.sleep(0.5)
        stored = time.perf_counter() - t0
        def is_whole(s):
            return (s["state"] == "ended" and s["events_dropped"] == 0
                    and s["events_sent"] == s["events_stored"])
        whole = sum(1 for s in sessions if is_whole(s))
        events = sum(s["events_stored"] for s in sessions)
        print("%-44s %10s" % ("jobs (burst + training)", "%d + %d" % (a.bursts, a.trainings)))
        print("%-44s %10d" % ("jobs that failed", failed))
        print("%-44s %10s" % ("sessions whole (ended, 0 dropped, sent=stored)",
                              "%d / %d" % (whole, len(sessions))))
        # (`tidemark run` execs the job: its pid is the session's.) A job whose handshake never
        # reached the daemon before its exit gets its session from its spool, which the daemon
        # takes up; one still without a session here has its run in its spool, for `tidemark
        # upload`.
        recorded = {s["pid"] for s in sessions}
        print("%-44s %10d" % ("jobs without a session (spooled)",
                              sum(1 for j in jobs if j.pid not in recorded)))
        for s in sessions:
            if not is_whole(s):
                print("   not whole: session %s, %s, sent %s, stored %s, dropped %s: %s" % (
                    s["id"], s["state"], s["events_sent"], s["events_stored"],
                    s["events_dropped"], s["command_line"][:80]))
        print("%-44s %10d" % ("events stored", events))
        print("%-44s %10.1f" % ("wall time of the whole load (s)", wall))
        print("%-44s %10.1f" % ("every session stored after (s)", stored))
        print("%-44s %10.1f" % ("tidemarkd peak memory, VmHWM (MiB)",
                                status_kib(daemon.pid, "VmHWM") / 1024))
        if latencies:
            latencies.sort()
            print("%-44s %10s" % ("`tidemark sessions` while ingesting (ms)",
                                  "median %.0f, p90 %.0f, max %.0f of %d" % (
                                      statistics.median(latencies),
                                      latencies[int(0.9 * (len(latencies) - 1))],
                                      latencies[-1], len(latencies))))
        return 0 if failed == 0 and whole == len(sessions) == a.bursts + a.trainings else 1
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    sys.exit(main())
