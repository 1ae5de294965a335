"""A small training whose adapter hooks meet what a detach and a bug would do to them (for
test_adapter_invisible): at step 1 the adapter's optimizer hook fails, at step 2 its own naming
of modules inside its module hooks; at step 3 the model's output, a dict, turns the adapter off
(tidemark.attach.stop(), as the agent's detach thread does) while the forward hook reads it,
between its reads of the phase stack. Prints each step's loss; without tidemark the same script
trains the same steps."""
import torch


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


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return Output(y=self.b(torch.relu(self.a(x))))


def main():
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, target = torch.randn(8, 16), torch.randn(8, 4)
    inst = adapter_instance()
    print("adapter", "on" if inst is not None else "off", flush=True)
    def broken(*args):
        raise RuntimeError("broken on purpose")

    for step in range(5):
        # Instance attributes over the adapter's methods: its optimizer hook fails at step 1, its
        # module hooks at step 2.
        if inst is not None and step == 1:
            inst._optimizer_end = broken
        if inst is not None and step == 2:
            del inst._optimizer_end
            inst._scope_of = broken
        if inst is not None and step == 3:
            del inst._scope_of
            Output.stop_now = True
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x)["y"], target)
        loss.backward()
        opt.step()
        print("train step %d loss %.6f" % (step, loss.item()), flush=True)


if __name__ == "__main__":
    main()
