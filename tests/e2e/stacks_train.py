"""A small training whose large allocations are made at lines marked `# at: NAME`, for
`tidemark run --stacks` (test_stacks.py): two calls deep, in a model's forward, on a thread the
script starts, in backward (a gradient), and one below the threshold. Prints the losses, then one JSON line: each kept
tensor's address. --own-profiler: the script has a profiler of its own before torch comes;
--own-thread-profiler: one for the threads it starts."""
import json
import sys
import threading

if "--own-profiler" in sys.argv:
    sys.setprofile(lambda frame, event, arg: None)
if "--own-thread-profiler" in sys.argv:
    threading.setprofile(lambda frame, event, arg: None)

import torch  # noqa: E402


def make(n):
    return torch.ones(n)  # at: make


def nested(n):
    return make(n)  # at: nested


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.scale = torch.nn.Parameter(torch.ones(1 << 17))  # its gradient: 512 KiB in backward

    def forward(self, x):
        return torch.tanh(self.lin(x))  # at: forward


def on_thread(out):
    out.append(nested(1 << 17))  # at: thread


def main():
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(1024, 64)
    for step in range(3):
        y = net(x)  # at: main-forward
        loss = (y * y).mean() + (net.scale * 1e-3).sum()
        loss.backward()  # at: main-backward
        grad = net.scale.grad.data_ptr()
        opt.step()
        opt.zero_grad()
        print("step %d loss %.8f" % (step + 1, loss.item()))
    big = nested(1 << 18)  # at: main-nested
    small = make(100)
    out = []
    t = threading.Thread(target=on_thread, args=(out,))
    t.start()
    t.join()
    print(json.dumps({"nested": big.data_ptr(), "forward": y.data_ptr(), "small": small.data_ptr(),
                      "thread": out[0].data_ptr(), "grad": grad}))


main()  # at: module
