"""Trains a model of many small parameters whose gradients are set to None before every backward,
so that a backward replacing them is running most of the time: what an attach that read `.grad`
from its own thread raced with. Prints "step N loss L" each step (the same digits on every run
with the same arguments). Knows nothing of tidemark.

    python3 gradient_churn_train.py [--steps N] [--params P] [--stop-file F]

--stop-file: the run ends after the step in which F exists (or after N steps).
"""
import argparse
import os

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--params", type=int, default=2000)
    parser.add_argument("--stop-file")
    args = parser.parse_args()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8)) for _ in range(args.params)]
    model = torch.nn.ParameterList(params)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8)
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = sum((p * x).sum() ** 2 for p in model) / len(params)
        loss.backward()
        opt.step()
        print("step %d loss %.6f" % (step, loss.item()), flush=True)
        if args.stop_file and os.path.exists(args.stop_file):
            break


if __name__ == "__main__":
    main()
