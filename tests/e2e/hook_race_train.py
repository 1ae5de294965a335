"""A small training whose adapter hooks meet what a detach and a bug would do to them (for
test_adapter_invisible): at step 1 the adapter's optimizer hook fails, at step 2 its own naming
of modules inside its module hooks; from inside step 3's forward (the adapter's saved-tensor hooks
on) every call of the adapter into the agent fails (steps 3 and 4 run through every wrapper and
hook the adapter puts in the job's way: a DataLoader, a checkpoint, saved tensors packed and
unpacked, a backward, gradient clipping, a module and an optimizer made inside the step); at
step 5 the model's output, a dict, turns the adapter off (tidemark.attach.stop(), as the agent's
detach thread does) while the forward hook reads it, between its reads of the phase stack. Prints
each step's loss; without tidemark the same script trains the same steps. With HOOK_RACE_KILL_AFTER=N
the job kills itself (SIGKILL: no exit of the agent's, no goodbye) a second and a half after step N;
with HOOK_RACE_FAIL_LAST=1 as well, an adapter hook fails a second and a half after step N (what
its failure does: counted by the agent, said on stderr), the last thing the job does before it is
killed 2 s later: nothing recorded after the failure."""
import os
import signal
import time

import torch
import torch.utils.checkpoint
import torch.utils.data

STEPS = 7


def adapter_instance():
    try:
        from tidemark import adapter
    except ImportError:
        return None
    inst = adapter._instance
    return inst if inst is not None and inst.enabled else None


class Output(dict):
    stop_now = False

    def values(self):
        if Output.stop_now:
            Output.stop_now = False
            from tidemark import attach
            attach.stop()
        return super().values()


class BrokenAgent:
    """An agent every call of which fails."""

    def __getattr__(self, name):
        def broken(*args, **kwargs):
            raise RuntimeError("the agent's %s broken on purpose" % name)

        return broken


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)
        self.at_forward = None

    def forward(self, x):
        if self.at_forward is not None:
            self.at_forward()
        h = torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=False)
        return Output(y=self.b(torch.relu(h)))


def main():
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8 * STEPS, 16), torch.randn(8 * STEPS, 4))
    batches = iter(torch.utils.data.DataLoader(data, batch_size=8))
    inst = adapter_instance()
    print("adapter", "on" if inst is not None else "off", flush=True)

    def broken(*args):
        raise RuntimeError("broken on purpose")

    agent = inst.agent if inst is not None else None
    for step in range(STEPS):
        # Instance attributes over the adapter's methods: its optimizer hook fails at step 1, its
        # module hooks at step 2; its agent at steps 3 (from inside the forward) and 4.
        if inst is not None and step == 1:
            inst._optimizer_end = broken
        if inst is not None and step == 2:
            del inst._optimizer_end
            inst._scope_of = broken
        if inst is not None and step == 3:
            del inst._scope_of

            def break_agent():
                inst.agent = BrokenAgent()
                net.at_forward = None

            net.at_forward = break_agent
        if inst is not None and step == 5:
            inst.agent = agent
            Output.stop_now = True
        x, target = next(batches)
        if step in (3, 4):  # made inside a step (the adapter notes modules and optimizers made)
            extra = torch.nn.Linear(4, 4)
            torch.optim.SGD(extra.parameters(), lr=0.1)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x)["y"], target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        opt.step()
        print("train step %d loss %.6f" % (step, loss.item()), flush=True)
        if str(step) == os.environ.get("HOOK_RACE_KILL_AFTER"):
            time.sleep(1.5)  # the agent's batches of the step sent, as a job's next steps would
            if inst is not None and os.environ.get("HOOK_RACE_FAIL_LAST") == "1":
                inst._hook_failed("last hook", RuntimeError("broken on purpose"))
                time.sleep(2)
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
