"""The job query on a job of many ranks, for bench/run.sh: RANKS processes (the native allocation
program of the agent tests, a session each) recorded under `tidemark run` as the ranks of one job
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then `tidemark job` and, beside it, `tidemark
sessions` and one rank's `tidemark peak` (each a CLI process: its start is in every figure),
median of REPEATS.

    python3 bench/job_query.py BIN [RANKS] [REPEATS] [STORE]

STORE: the daemon's store (tidemarkd --store; default a SQLite file of its own).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    bin_dir = sys.argv[1]
    ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    tidemark = os.path.join(bin_dir, "tidemark")
    work = tempfile.mkdtemp(prefix="tidemark-bench-job-")
    port_file = os.path.join(work, "port")
    store = sys.argv[4] if len(sys.argv) > 4 else os.path.join(work, "job.db")
    daemon = subprocess.Popen([os.path.join(bin_dir, "tidemarkd"), "--listen", "127.0.0.1:0",
                               "--no-unix", "--store", store, "--port-file", port_file],
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.1)
        server = "127.0.0.1:" + open(port_file).read().strip()
        t = time.perf_counter()
        for r in range(ranks):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r % 8), WORLD_SIZE=str(ranks),
                       MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
            subprocess.run([tidemark, "--server", server, "run", "--quiet", "--",
                            os.path.join(bin_dir, "tidemark_alloc_program")], env=env,
                           stdout=subprocess.DEVNULL, check=True)
        recorded = time.perf_counter() - t

        def timed(*args):
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = subprocess.run([tidemark, "--server", server, *args, "--json"],
                                     stdout=subprocess.PIPE, check=True).stdout
                runs.append(time.perf_counter() - t0)
            return statistics.median(runs) * 1e3, json.loads(out)

        job_ms, job = timed("job", "10.0.0.1:29500")
        assert len(job["ranks"]) == ranks, len(job["ranks"])
        sessions_ms, _ = timed("sessions")
        peak_ms, _ = timed("peak", str(job["ranks"][0]["session"]["id"]))
        print("%d ranks recorded in %.1f s (a process each)" % (ranks, recorded))
        print("%-44s %8.1f ms" % ("tidemark job (%d ranks: peak and steps of each)" % ranks,
                                  job_ms))
        print("%-44s %8.1f ms" % ("tidemark sessions (%d sessions)" % ranks, sessions_ms))
        print("%-44s %8.1f ms" % ("tidemark peak (one rank)", peak_ms))
        print("job / (ranks x one rank's peak): %.2f" % (job_ms / (ranks * peak_ms)))
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
