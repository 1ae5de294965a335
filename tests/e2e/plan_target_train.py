"""A training whose model breaks the chain advisor's assumptions, for tests of plans that are valid
JSON but wrong: its blocks take two arguments (x, mask), each block's children are siblings that
are not a chain (attention-like and MLP-like halves with residuals), a module refuses to run
under a checkpoint, and dropout everywhere (so any change to the random draws shows in the
losses). Prints every step's loss. Knows nothing of tidemark.

    python3 plan_target_train.py --steps 60 --sleep 0.2
"""
import argparse
import inspect
import time

import torch


class Half(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(torch.relu(self.lin(x)))


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.first = Half(d)
        self.second = Half(d)

    def forward(self, x, mask):
        h = x + self.first(x) * mask
        return h + self.second(h * 0.5)


class Fussy(torch.nn.Module):
    """A layer of a user's that cannot run inside torch.utils.checkpoint (it says so)."""

    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        if any(f.function == "checkpoint" for f in inspect.stack(0)):
            raise RuntimeError("Fussy cannot run under a checkpoint")
        return self.lin(x)


class Net(torch.nn.Module):
    def __init__(self, d=32, n=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(d) for _ in range(n)])
        self.fussy = Fussy(d)
        self.head = torch.nn.Linear(d, 1)

        self.depth = n  # how many of the blocks the forward runs

    def forward(self, x):
        mask = (x > -1.5).float()
        for b in self.blocks[:self.depth]:
            x = b(x, mask)
        return self.head(self.fussy(x))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--deep-from", type=int, default=0, metavar="STEP",
                   help="before this step the forward runs only the first half of the blocks "
                        "(a branch that goes deeper later; 0: all blocks always)")
    args = p.parse_args()
    torch.manual_seed(3)
    model = Net(n=args.blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(4)
    for step in range(args.steps):
        model.depth = args.blocks // 2 if step < args.deep_from else args.blocks
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step %d loss %.10f" % (step, loss.item()), flush=True)
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
