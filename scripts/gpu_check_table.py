"""The table of scripts/gpu-check.sh: the runs' logs and the agent's store, side by side."""
import re
import sqlite3
import statistics
import sys

work, session = sys.argv[1], int(sys.argv[2])


def log(name):
    with open("%s/%s.log" % (work, name)) as f:
        return f.read()


def step_ms(text):
    times = [float(t) for t in re.findall(r"^step \d+ loss \S+ \((\d+) ms\)", text, re.M)]
    return statistics.median(times[1:] or times) if times else float("nan")


def torch_peaks(text):
    m = re.search(r"max_memory_allocated (\d+), max_memory_reserved (\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


db = sqlite3.connect("file:%s/tidemark.db?mode=ro" % work, uri=True)
# The agent's device peak: device blocks replayed in order (they are the caching allocator's
# segments: what it reserved from the driver).
events = []
for address, size, alloc_seq, free_seq in db.execute(
        "SELECT address, size_bytes, alloc_seq, free_seq FROM allocation "
        "WHERE session_id = ? AND memory_kind = 2", (session,)):
    events.append((alloc_seq, size))
    if free_seq is not None:
        events.append((free_seq, -size))
live = peak_reserved = 0
for _, delta in sorted(events):
    live += delta
    peak_reserved = max(peak_reserved, live)
names = dict(db.execute("SELECT iid, value FROM string WHERE session_id = ?", (session,)))
kernels = copies = 0
for (name_id,) in db.execute("SELECT name_id FROM scope WHERE session_id = ? AND kind = 2",
                             (session,)):
    if names.get(name_id, "").startswith(("[memcpy", "[memset")):
        copies += 1
    elif names.get(name_id, "") != "[synchronize]":
        kernels += 1
dropped = [v for (v,) in db.execute(
    "SELECT c.value FROM counter c JOIN string s ON s.session_id = c.session_id AND "
    "s.iid = c.name_id WHERE c.session_id = ? AND s.value = 'cupti_dropped_records' "
    "ORDER BY c.seq", (session,))]

plain, agent, profiler = log("plain"), log("agent"), log("profiler")
allocated, reserved = torch_peaks(plain)
agent_allocated, agent_reserved_torch = torch_peaks(agent)
m = re.search(r"torch.profiler: (\d+) GPU kernels, (\d+) copies", profiler)
prof_kernels, prof_copies = (int(m.group(1)), int(m.group(2))) if m else (None, None)


def row(what, agent_value, torch_value, unit=""):
    if agent_value is None or torch_value in (None, 0):
        diff = "n/a"
    else:
        diff = "%+.2f %%" % (100.0 * (agent_value - torch_value) / torch_value)
    fmt = lambda v: "n/a" if v is None else ("{:,}".format(v) + unit)
    print("%-34s %20s %20s %10s" % (what, fmt(agent_value), fmt(torch_value), diff))


print()
print("%-34s %20s %20s %10s" % ("", "tidemark", "torch", "diff"))
row("peak reserved (bytes)", peak_reserved, agent_reserved_torch or reserved)
row("peak allocated (bytes)", None, agent_allocated or allocated)
print("    (tensor-level view of the CUDA caching allocator: not built yet)")
row("GPU kernels (%d steps)" % len(re.findall(r"^step ", agent, re.M)), kernels, prof_kernels)
row("copies and fills", copies, prof_copies)
print("%-34s %20s" % ("CUPTI records dropped", dropped[-1] if dropped else 0))
print("%-34s %17.1f ms %17.1f ms %+9.1f %%" % (
    "median step time (agent / plain)", step_ms(agent), step_ms(plain),
    100.0 * (step_ms(agent) - step_ms(plain)) / step_ms(plain)))
torch_reserved = agent_reserved_torch or reserved
ok = torch_reserved and abs(peak_reserved - torch_reserved) <= 0.01 * torch_reserved
print("\nreserved within 1 %% of torch's: %s" % ("yes" if ok else "NO"))
sys.exit(0 if ok else 1)
