"""The table of scripts/gpu-check.sh: the runs' logs and the agent's store, side by side.

    python3 scripts/gpu_check_table.py WORK_DIR SESSION

Its readers of the store (replayed_peak, counter_values) and of the runs' output (torch_peaks) are
used by tests/e2e/test_gpu_training.py too."""
import re
import sqlite3
import statistics
import sys


def replayed_peak(db, session, memory_kind):
    """The highest total of a session's blocks of one memory kind on the GPUs, in sequence order
    (None when it has none)."""
    events = []
    for size, alloc_seq, free_seq in db.execute(
            "SELECT size_bytes, alloc_seq, free_seq FROM allocation "
            "WHERE session_id = ? AND memory_kind = ? AND device >= 0", (session, memory_kind)):
        events.append((alloc_seq, size))
        if free_seq is not None:
            events.append((free_seq, -size))
    live = peak = 0
    for _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak if events else None


def counter_values(db, session, name):
    return [v for (v,) in db.execute(
        "SELECT c.value FROM counter c JOIN string s ON s.session_id = c.session_id AND "
        "s.iid = c.name_id WHERE c.session_id = ? AND s.value = ? ORDER BY c.seq",
        (session, name))]


def torch_peaks(text):
    """(max_memory_allocated, max_memory_reserved) as examples/train.py prints them."""
    m = re.search(r"max_memory_allocated (\d+), max_memory_reserved (\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def step_ms(text):
    """The median step time train.py printed, less the first step (it builds the optimizer's
    state)."""
    times = [float(t) for t in re.findall(r"^step \d+ loss \S+ \((\d+) ms\)", text, re.M)]
    return statistics.median(times[1:] or times) if times else float("nan")


def row(what, agent_value, torch_value, unit=""):
    if agent_value is None or torch_value in (None, 0):
        diff = "n/a"
    else:
        diff = "%+.2f %%" % (100.0 * (agent_value - torch_value) / torch_value)
    fmt = lambda v: "n/a" if v is None else ("{:,}".format(v) + unit)
    print("%-34s %20s %20s %10s" % (what, fmt(agent_value), fmt(torch_value), diff))


def within(agent_value, torch_value):
    return bool(torch_value) and agent_value is not None and \
        abs(agent_value - torch_value) <= 0.01 * torch_value


def main(work, session):
    def log(name):
        with open("%s/%s.log" % (work, name)) as f:
            return f.read()

    db = sqlite3.connect("file:%s/tidemark.db?mode=ro" % work, uri=True)
    # Device memory from the CUPTI callbacks (the caching allocator's segments and memory
    # outside torch), tensors from torch's memory reporter (what the caching allocator hands
    # out), and the reserved total torch's reporter passes with every tensor.
    peak_device = replayed_peak(db, session, 2)
    peak_tensors = replayed_peak(db, session, 3)
    reserved_counter = counter_values(db, session, "reserved_bytes")
    peak_reserved_counter = max(reserved_counter) if reserved_counter else None
    names = dict(db.execute("SELECT iid, value FROM string WHERE session_id = ?", (session,)))
    kernels = copies = 0
    for (name_id,) in db.execute("SELECT name_id FROM scope WHERE session_id = ? AND kind = 2",
                                 (session,)):
        if names.get(name_id, "").startswith(("[memcpy", "[memset")):
            copies += 1
        elif names.get(name_id, "") != "[synchronize]":
            kernels += 1
    dropped = counter_values(db, session, "cupti_dropped_records")

    plain, agent, profiler = log("plain"), log("agent"), log("profiler")
    allocated, reserved = torch_peaks(plain)
    agent_allocated, agent_reserved_torch = torch_peaks(agent)
    m = re.search(r"torch.profiler: (\d+) GPU kernels, (\d+) copies", profiler)
    prof_kernels, prof_copies = (int(m.group(1)), int(m.group(2))) if m else (None, None)

    print()
    print("%-34s %20s %20s %10s" % ("", "tidemark", "torch", "diff"))
    torch_reserved = agent_reserved_torch or reserved
    torch_allocated = agent_allocated or allocated
    row("peak allocated: tensors (bytes)", peak_tensors, torch_allocated)
    row("peak reserved: torch's count", peak_reserved_counter, torch_reserved)
    row("peak device memory: CUPTI", peak_device, torch_reserved)
    print("    (device memory = the caching allocator's segments + memory outside torch)")
    row("GPU kernels (%d steps)" % len(re.findall(r"^step ", agent, re.M)), kernels, prof_kernels)
    row("copies and fills", copies, prof_copies)
    print("%-34s %20s" % ("CUPTI records dropped", dropped[-1] if dropped else 0))
    print("%-34s %17.1f ms %17.1f ms %+9.1f %%" % (
        "median step time (agent / plain)", step_ms(agent), step_ms(plain),
        100.0 * (step_ms(agent) - step_ms(plain)) / step_ms(plain)))

    ok_allocated = within(peak_tensors, torch_allocated)
    ok_reserved = (within(peak_device, torch_reserved)
                   or within(peak_reserved_counter, torch_reserved))
    print("\nallocated within 1 %% of torch's: %s" % ("yes" if ok_allocated else "NO"))
    print("reserved within 1 %% of torch's: %s" % ("yes" if ok_reserved else "NO"))
    return 0 if ok_allocated and ok_reserved else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
