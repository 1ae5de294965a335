"""Plans can never stop the job: plans that are valid JSON but wrong, applied with `tidemark
apply` to a running training whose model breaks the chain's assumptions (a layer that cannot run
under a checkpoint, modules it does not have), are refused before anything changes or turned off
after the first step they ran in, with the module's own forward run instead; a segment of sibling
children that are not a chain runs a checkpoint per child, said in a note; a segment of its
two-argument blocks is applied; the job exits 0 with the losses of an unplanned run, digit for
digit, and plan-check shows each refusal with its reason."""
import json
import os
import re
import subprocess
import unittest

from tidemark_env import BIN, DaemonTestCase, PYTHON, SOURCE, plan_doc

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan_target_train.py")
ARGS = ("--steps", "70", "--sleep", "0.15")

# (segments, what the refusal says)
WRONG_PLANS = [
    ([{"mode": "recompute", "modules": ["Net.blocks.7"]}], "no module Net.blocks.7"),
    ([{"mode": "recompute", "modules": ["TinyGPT.blocks.1"]}], "no module TinyGPT.blocks.1"),
    ([{"mode": "recompute", "modules": ["Net.fussy"]}],
     "Net.fussy failed under the plan (RuntimeError: Fussy cannot run under a checkpoint)"),
    ([{"mode": "recompute", "modules": ["Net.blocks.2", "Net.blocks.2"]}], "appears twice"),
]


# The start of a script run in a process of its own (the torch under test), with tidemark's
# Python package from the checkout.
IN_PROCESS = r"""import sys, torch
sys.path.insert(0, sys.argv[1])
import tidemark
"""


# Four blocks (the script's class Block) in a chain, and a loss.
CHAIN_NET = r"""
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(4)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()
"""


# The script's Net trained `steps` steps with SGD under a plan of `segments` (None: no plan):
# (the model, the losses, the applied plan or None).
PLANNED_TRAINING = r"""
def planned_training(segments, steps):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    applied = tidemark.apply_plan(model, {"format": "tidemark-plan", "version": 2,
                                          "segments": segments}) if segments else None
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(8, 16))
        loss.backward()
        opt.step()
        losses.append("%.10f" % loss.item())
    return model, losses, applied
"""


def run_in_process(test, code):
    r = subprocess.run([PYTHON, "-c", code, os.path.join(SOURCE, "python")],
                       capture_output=True, text=True, timeout=120)
    test.assertEqual(r.returncode, 0, r.stdout + r.stderr)
    return r


def losses(text):
    return re.findall(r"^step \d+ loss (\S+)$", text, re.M)


class PlanSafetyTest(DaemonTestCase):
    def planned_run(self, args, live_steps, while_live):
        """The script with args, without tidemark (its losses), then under `tidemark run` with
        while_live(session) called once it has live_steps steps: the job must exit 0 with the
        same losses, every step, every digit. Returns the session."""
        r = subprocess.run([PYTHON, SCRIPT, *args], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = losses(r.stdout)
        self.assertGreater(len(expected), 0)
        job = subprocess.Popen([os.path.join(BIN, "tidemark"), "--server", self.daemon.address,
                                "run", "--", PYTHON, SCRIPT, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            sid = self.daemon.wait_live_steps(live_steps, timeout=120)
            while_live(sid)
            out, err = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
        self.assertEqual(job.returncode, 0, err)
        self.assertEqual(losses(out), expected)
        return sid

    def test_wrong_plans_never_stop_the_job(self):
        def apply_plans(sid):
            # Sibling children that are not a chain (the second is called with something other
            # than the first's output): each under a checkpoint of its own, said in a note.
            path = os.path.join(self.daemon.dir, "siblings.json")
            with open(path, "w") as f:
                json.dump(plan_doc([{"mode": "recompute",
                                     "modules": ["Net.blocks.1.first", "Net.blocks.1.second"]}]), f)
            r = self.daemon.cli("apply", str(sid), path, "--wait", "60", check=False)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("note: applied; but in step", r.stdout)
            self.assertIn("Net.blocks.1.first..Net.blocks.1.second is not a chain in this model "
                          "(Net.blocks.1.second was called with something other than "
                          "Net.blocks.1.first's output", r.stdout)
            for i, (segments, reason) in enumerate(WRONG_PLANS):
                path = os.path.join(self.daemon.dir, "wrong%d.json" % i)
                with open(path, "w") as f:
                    json.dump(plan_doc(segments), f)
                r = self.daemon.cli("apply", str(sid), path, "--wait", "60", check=False)
                self.assertEqual(r.returncode, 1, "plan %d: %s%s" % (i, r.stdout, r.stderr))
                self.assertIn(reason, r.stderr, "plan %d" % i)
            # Two-argument blocks (x, mask), each given the same mask: a chain all the same,
            # whose segment is applied and stays on to the end, the losses unchanged.
            path = os.path.join(self.daemon.dir, "right.json")
            with open(path, "w") as f:
                json.dump(plan_doc([{"mode": "recompute",
                                     "modules": ["Net.blocks.0", "Net.blocks.1"]}]), f)
            r = self.daemon.cli("apply", str(sid), path, "--wait", "60", check=False)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        sid = self.planned_run(ARGS, 2, apply_plans)
        check = self.daemon.cli_json("plan-check", str(sid))["plans"]
        self.assertEqual([p["state"] for p in check],
                         ["applied"] + ["refused"] * len(WRONG_PLANS) + ["applied"])
        self.assertIn("is not a chain in this model", check[0]["message"])
        for p, (_, reason) in zip(check[1:], WRONG_PLANS):
            self.assertIn(reason, p["message"])
        self.assertNotIn("not a chain", check[-1]["message"])

    def test_a_branch_off_the_recorded_path_is_said(self):
        """A model that runs 3 of its 6 blocks in its first 30 steps and all 6 after (a branch
        that goes deeper later): a plan made from its first steps is a plan for 3 blocks. It is
        applied; once the job takes the deep path, plan-check says that the steps run blocks the
        plan does not list and its prediction may not hold (the plan stays on; the losses are
        unchanged)."""
        def apply_shallow_plan(sid):
            path = os.path.join(self.daemon.dir, "shallow.json")
            self.daemon.cli("plan", str(sid), "--budget", "90%", "--out", path)
            with open(path) as f:
                plan = json.load(f)
            self.assertEqual([m for seg in plan["segments"] for m in seg["modules"]],
                             ["Net.blocks.%d" % i for i in range(3)])
            r = self.daemon.cli("apply", str(sid), path, "--wait", "60", check=False)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        sid = self.planned_run(("--steps", "45", "--sleep", "0.15", "--blocks", "6",
                                "--deep-from", "30"), 3, apply_shallow_plan)
        check = self.daemon.cli_json("plan-check", str(sid))["plans"]
        self.assertEqual([p["state"] for p in check], ["applied"])
        self.assertRegex(check[0]["message"],
                         r"^applied; but in step \d+ its forward took another path than the "
                         r"step the plan was made from: it ran Net.blocks.3, Net.blocks.4, "
                         r"Net.blocks.5, which the plan does not list; the predicted peak may "
                         r"not hold")
        self.assertLess(check[0]["from_step"], 30)
        text = self.daemon.cli("plan-check", str(sid)).stdout
        self.assertIn("  note: applied; but in step", text)

    def test_plan_off_when_inputs_outgrow_it(self):
        """A plan made at batch 8 (each segment says the input it was made for) applied to a
        training at batch 16: the recomputed segments' inputs are twice as large, the predicted
        peak cannot hold, so the plan turns itself off with the reason and the step runs
        unplanned (losses equal); at batch 8 and 6 the plan stays on (losses equal too)."""
        code = IN_PROCESS + r"""

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.2)
    def forward(self, x):
        return x + self.drop(torch.relu(self.lin(x)))

""" + CHAIN_NET + r"""
def train(batch, plan):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    applied = tidemark.apply_plan(model, plan) if plan else None
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = model(torch.randn(batch, 16))
        loss.backward()
        opt.step()
        losses.append("%.10f" % loss.item())
    return losses, applied.failed if applied else None

made_for = 8 * 16 * 4  # the blocks' input at batch 8, float32
plan = {"format": "tidemark-plan", "version": 1, "segments": [
    {"mode": "store", "modules": ["Net.blocks.0"], "input_bytes": made_for},
    {"mode": "recompute", "modules": ["Net.blocks.1"], "input_bytes": made_for},
    {"mode": "recompute", "modules": ["Net.blocks.2", "Net.blocks.3"], "input_bytes": made_for}]}
for batch in (8, 6, 16):
    plain, _ = train(batch, None)
    planned, failed = train(batch, plan)
    assert planned == plain, (batch, plain, planned)
    assert (failed is None) == (batch <= 8), (batch, failed)
    print("batch", batch, failed)
"""
        r = run_in_process(self, code)
        self.assertIn("batch 16 Net.blocks.1 got an input of 1024 bytes; the plan was made for 512",
                      r.stdout)

    def test_recomputation_keeps_running_state(self):
        """A recomputed block runs its forward twice in training mode; its BatchNorm layers
        (exponential and cumulative averages) must update their statistics once per step, as
        without the plan: the losses, the evaluation loss after training and every entry of the
        state dict equal the unplanned run's exactly, for a one-block segment, a three-block
        chain, a selective segment that recomputes a BatchNorm layer, and a nested segment
        (torch 2.1 on; blocks 0 and 3 re-run twice: in the outer re-run and their own). A buffer
        the forward only reads (a mask) is there too. torch 1.13 refuses the nested plan
        (PlanError naming the torch it needs) with the model unchanged. Offloaded blocks (their
        saved tensors through host memory: on this CPU they stay where they are) keep them too."""
        code = IN_PROCESS + r"""

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.bn_cma = torch.nn.BatchNorm1d(16, momentum=None)
        self.register_buffer("mask", torch.ones(16))
    def forward(self, x):
        return x + self.bn_cma(torch.relu(self.bn(self.lin(x)))) * self.mask

""" + CHAIN_NET + r"""
""" + PLANNED_TRAINING + r"""
def train(segments):
    model, losses, applied = planned_training(segments, 5)
    model.eval()
    ev = "%.10f" % model(torch.randn(8, 16, generator=torch.Generator().manual_seed(1))).item()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return losses, ev, state, applied.failed if applied else None

plain = train(None)
for segs in ([{"mode": "recompute", "modules": ["Net.blocks.1"]}],
             [{"mode": "recompute", "modules": ["Net.blocks.0", "Net.blocks.1", "Net.blocks.2"]}],
             [{"mode": "selective", "modules": ["Net.blocks.3"],
               "recompute": ["Net.blocks.3.bn"]}],
             [{"mode": "recompute", "modules": ["Net.blocks.%d" % i for i in range(4)],
               "inner": [{"mode": "recompute", "modules": ["Net.blocks.0", "Net.blocks.1"],
                          "inner": [{"mode": "recompute", "modules": ["Net.blocks.0"]},
                                    {"mode": "store", "modules": ["Net.blocks.1"]}]},
                         {"mode": "store", "modules": ["Net.blocks.2"]},
                         {"mode": "recompute", "modules": ["Net.blocks.3"]}]}],
             [{"mode": "offload", "modules": ["Net.blocks.0", "Net.blocks.1"]},
              {"mode": "recompute", "modules": ["Net.blocks.2"]}]):
    if "inner" in segs[0] and tuple(map(int, torch.__version__.split(".")[:2])) < (2, 1):
        model = Net()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        forwards = [m.forward for m in model.blocks]
        try:
            tidemark.apply_plan(model, {"format": "tidemark-plan", "version": 2,
                                        "segments": segs})
            raise AssertionError("a nested plan was applied on torch " + torch.__version__)
        except tidemark.PlanError as e:
            refusal = str(e)
        assert "torch 2.1 or newer" in refusal, refusal
        assert [m.forward for m in model.blocks] == forwards
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
        print("ok refused:", refusal)
        continue
    got = train(segs)
    assert got[3] is None, got[3]
    assert got[0] == plain[0], (segs, plain[0], got[0])
    assert got[1] == plain[1], (segs, plain[1], got[1])
    for k, v in plain[2].items():
        assert torch.equal(v, got[2][k]), (segs, k)
    print("ok", [s["modules"] for s in segs])
"""
        r = run_in_process(self, code)
        self.assertEqual(r.stdout.count("ok"), 5, r.stdout)

    def test_a_plan_inside_the_jobs_own_checkpoints(self):
        """A job that runs every block under a checkpoint of its own (non-reentrant), with a
        plan that checkpoints a part of one block and another block whole: torch 2's
        checkpoint stops re-running a block once it has what the backward needs, by an
        exception through whatever runs inside it, the plan's wrappers too, which must let it
        through (caught as a failure, the job's backward broke: "target_frame.early_stop is
        set"). The job trains with the losses of an unplanned run; on torch 2 the plan stays
        on."""
        code = IN_PROCESS + r"""
from torch.utils.checkpoint import checkpoint

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 16)
    def forward(self, x):
        return x + self.out(torch.tanh(self.lin(x)))

""" + CHAIN_NET.replace("x = b(x)", "x = checkpoint(b, x, use_reentrant=False)") + r"""
""" + PLANNED_TRAINING + r"""
def train(segments):
    _, losses, applied = planned_training(segments, 4)
    return losses, applied.failed if applied else None

plain = train(None)
got = train([{"mode": "selective", "modules": ["Net.blocks.1"], "recompute": ["Net.blocks.1.lin"]},
             {"mode": "recompute", "modules": ["Net.blocks.2"]}])
assert got[0] == plain[0], (plain[0], got[0])
if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 1):
    assert got[1] is None, got[1]
print("ok", got[1])
"""
        r = run_in_process(self, code)
        self.assertIn("ok", r.stdout)

    def test_a_failed_plan_gives_the_model_its_own_checkpointing_back(self):
        """A model that checkpoints its own blocks behind a switch (as `transformers` layers do)
        has the switch turned off on the plan's blocks while the plan runs; a plan that turns
        itself off (a block that cannot run under the plan's checkpoint) turns it on again, so
        the job goes on as it ran before the plan, not storing what it recomputed."""
        code = IN_PROCESS + r"""
import inspect
from torch.utils.checkpoint import checkpoint

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.gradient_checkpointing = True
        self.fussy = False
    def run(self, x):
        return x + torch.tanh(self.lin(x))
    def forward(self, x):
        if self.gradient_checkpointing:
            return checkpoint(self.run, x, use_reentrant=False)
        if self.fussy and any(f.function == "checkpoint" for f in inspect.stack(0)):
            raise RuntimeError("this block cannot run under the plan's checkpoint")
        return self.run(x)
""" + CHAIN_NET + r"""
model = Net()
model.blocks[1].fussy = True
applied = tidemark.apply_plan(model, {"format": "tidemark-plan", "version": 2, "segments": [
    {"mode": "recompute", "modules": ["Net.blocks.1"]}]}, warn=False)
assert model.blocks[1].gradient_checkpointing is False
assert model.blocks[0].gradient_checkpointing is True  # not the plan's
model(torch.randn(8, 16)).backward()
assert applied.failed is not None and "cannot run" in applied.failed, applied.failed
assert model.blocks[1].gradient_checkpointing is True
applied.remove()
assert all(b.gradient_checkpointing is True for b in model.blocks)
print("ok")
"""
        r = run_in_process(self, code)
        self.assertIn("ok", r.stdout)

    def test_a_plan_the_script_applies_is_checked(self):
        """Under `tidemark run`, plans a training script applies itself (tidemark.apply_plan)
        are the session's plans for plan-check as if `tidemark apply` had sent them: of a plan
        with a segment over each of two stacks, the segment over the layers of a T5-like stack
        (the first layer makes a bias the others are handed) is a chain once its first step has
        shown where the layers' arguments come from, and the one over a stack whose residual is
        added outside its blocks runs a checkpoint per block from step 1, said in the note
        (naming that segment only), measured; a second plan applied before step 4 over a module
        that refuses to run under a checkpoint turns itself off in that step, refused with the
        reason. The script is told of both (PlanWarning on its stderr), and its losses are
        those of the same script without plans, every digit."""
        code = IN_PROCESS + r"""
import inspect
import json

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.3)
    def forward(self, x, bias=None):
        bias = torch.tanh(self.lin.bias).mean() if bias is None else bias
        return x + self.drop(torch.relu(self.lin(x))) + bias, bias

class Fussy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
    def forward(self, x):
        if any(f.function == "checkpoint" for f in inspect.stack(0)):
            raise RuntimeError("Fussy cannot run under a checkpoint")
        return self.lin(x)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(4)])
        self.res = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])
        self.fussy = Fussy()
    def forward(self, x):
        bias = None
        for b in self.blocks:
            x, bias = b(x, bias)
        for r in self.res:
            x = x + torch.relu(r(x))
        return self.fussy(x).pow(2).mean()

def plan(*segments):
    return dict(json.loads(sys.argv[3]), segments=list(segments))

planned = sys.argv[2] == "planned"
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if planned:
    tidemark.apply_plan(model, plan(
        {"mode": "recompute", "modules": ["Net.blocks.0", "Net.blocks.1", "Net.blocks.2"]},
        {"mode": "recompute", "modules": ["Net.res.0", "Net.res.1", "Net.res.2"]}))
g = torch.Generator().manual_seed(1)
for step in range(1, 7):
    if planned and step == 4:
        tidemark.apply_plan(model, plan({"mode": "recompute", "modules": ["Net.fussy"]}))
    loss = model(torch.randn(8, 16, generator=g))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step %d loss %.10f" % (step, loss.item()), flush=True)
"""
        python_dir = os.path.join(SOURCE, "python")
        doc = json.dumps(plan_doc([]))  # a plan document, its segments the script's
        plain = subprocess.run([PYTHON, "-c", code, python_dir, "plain", doc],
                               capture_output=True, text=True, timeout=120)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        r = self.daemon.run(PYTHON, "-c", code, python_dir, "planned", doc)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(losses(r.stdout), losses(plain.stdout))
        self.assertEqual(len(losses(r.stdout)), 6)
        self.assertIn("PlanWarning: the plan runs, but Net.res.0..Net.res.2 is not a chain in "
                      "this model", r.stderr)
        self.assertNotIn("Net.blocks.0..", r.stderr)
        self.assertIn("PlanWarning: the plan was turned off: Net.fussy failed under the plan "
                      "(RuntimeError: Fussy cannot run under a checkpoint)", r.stderr)
        sid = self.daemon.newest_session()["id"]
        self.daemon.wait_analyzed(sid)
        check = self.daemon.cli_json("plan-check", str(sid))["plans"]
        self.assertEqual([(p["state"], p["from_step"]) for p in check],
                         [("applied", 1), ("refused", 0)])
        self.assertTrue(check[0]["message"].startswith(
            "applied; but in step 1 Net.res.0..Net.res.2 is not a chain in this model "
            "(Net.res.1 was called with something other than Net.res.0's output"),
            check[0]["message"])
        self.assertNotIn("Net.blocks.0..", check[0]["message"])
        self.assertEqual(check[0]["steps_measured"], 6)
        self.assertGreater(check[0]["measured_peak_bytes"], 0)
        self.assertIn("Net.fussy failed under the plan (RuntimeError: Fussy cannot run under a "
                      "checkpoint); the plan was turned off", check[1]["message"])
        text = self.daemon.cli("plan-check", str(sid)).stdout
        self.assertIn("applied from step 1, 6 steps measured", text)
        self.assertIn("  note: applied; but in step 1 Net.res.0..Net.res.2", text)

    def test_chain_values_are_the_models_own_in_process(self):
        """tidemark.apply_plan without the daemon, a three-block segment of four blocks: a
        model that is a chain keeps the losses of the unplanned model to the digit with the
        segment run as one chain (one checkpoint a step, no note), also one whose blocks all get
        the same mask beside their input (a transformer's layers) and one whose blocks return a
        tuple of which the loop passes on the first element (`h = layer(h, mask)[0]`, as many
        `transformers` layers do); one that hands each later block a bias the first one returns
        (a T5 stack) is a chain from its second step on, once its first has shown where the
        blocks' arguments come from. A model that is not a chain there — it changes the first
        block's output in place before the second block, or passes the second a mask the first
        did not get — keeps them too, the plan on: the segment's blocks each run under a
        checkpoint of their own from then on (7 block forwards a step, as for the chain: 4 and
        3 re-runs; three checkpoints), said once in a note and a PlanWarning."""
        code = IN_PROCESS + r"""
import warnings
import torch.utils.checkpoint

CALLS = [0]
CHECKPOINTS = [0]
checkpoint = torch.utils.checkpoint.checkpoint

def counted(*args, **kwargs):
    CHECKPOINTS[0] += 1
    return checkpoint(*args, **kwargs)

torch.utils.checkpoint.checkpoint = counted

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.3)
    def forward(self, x, mask=None, bias=None):
        CALLS[0] += 1
        h = x + self.drop(torch.relu(self.lin(x)))
        h = h if mask is None else h * mask
        if self.how == "tuple":
            return h, h.detach().sum()
        if self.how == "t5":
            bias = torch.tanh(self.lin.bias).mean() if bias is None else bias
            return h + bias, bias
        return h

class Net(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(4)])
        for b in self.blocks:
            b.how = how
        self.how = how
    def forward(self, x):
        how = self.how
        mask = (x > -1).float() if how in ("mask", "shared", "tuple") else None
        if how == "t5":
            bias = None
            for b in self.blocks:
                x, bias = b(x, None, bias)
            return x.pow(2).mean()
        h = self.blocks[0](x, mask) if how in ("shared", "tuple") else self.blocks[0](x)
        if how == "tuple":
            h = h[0]
        if how == "inplace":
            h.mul_(0.5)
        for b in self.blocks[1:]:
            h = b(h, mask) if mask is not None else b(h)
            if how == "tuple":
                h = h[0]
        return h.pow(2).mean()

def train(how, plan):
    torch.manual_seed(0)
    model = Net(how)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    applied = tidemark.apply_plan(model, plan) if plan else None
    losses, calls = [], []
    for _ in range(4):
        CALLS[0] = CHECKPOINTS[0] = 0
        opt.zero_grad()
        loss = model(torch.randn(8, 16))
        loss.backward()
        opt.step()
        losses.append("%.10f" % loss.item())
        calls.append((CALLS[0], CHECKPOINTS[0]))
    return losses, calls, applied

plan = {"format": "tidemark-plan", "version": 1, "segments": [
    {"mode": "recompute", "modules": ["Net.blocks.0", "Net.blocks.1", "Net.blocks.2"]}]}
for how in ("chain", "shared", "tuple", "inplace", "mask", "t5"):
    plain, plain_calls, _ = train(how, None)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        planned, calls, applied = train(how, plan)
    assert planned == plain, (how, plain, planned)
    assert applied.failed is None, (how, applied.failed)
    assert plain_calls == [(4, 0)] * 4, (how, plain_calls)
    warned = [str(w.message) for w in said if issubclass(w.category, tidemark.PlanWarning)]
    if how in ("chain", "shared", "tuple", "t5"):
        assert calls[1:] == [(7, 1)] * 3, (how, calls)
        assert applied.notes == [] and warned == [], (how, applied.notes, warned)
    else:
        assert calls[1:] == [(7, 3)] * 3, (how, calls)
        assert len(applied.notes) == 1 and warned == ["the plan runs, but " + applied.notes[0]], (
            how, applied.notes, warned)
        assert "Net.blocks.0..Net.blocks.2 is not a chain in this model" in applied.notes[0]
    print(how, "notes:", " | ".join(applied.notes) or "none")
"""
        r = run_in_process(self, code)
        for how in ("chain", "shared", "tuple", "t5"):
            self.assertIn(how + " notes: none", r.stdout)
        self.assertIn("inplace notes: Net.blocks.0..Net.blocks.2 is not a chain in this model "
                      "(Net.blocks.1 was called with something other than Net.blocks.0's output "
                      "and Net.blocks.0's other arguments, or with them changed in place)",
                      r.stdout)
        self.assertIn("mask notes: Net.blocks.0..Net.blocks.2 is not a chain", r.stdout)


if __name__ == "__main__":
    unittest.main()
