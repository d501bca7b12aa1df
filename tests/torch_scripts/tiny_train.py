"""A tiny torch.compile training loop for the PyTorch warm-up tests: Linear + ReLU + Linear, AdamW, batch 4.

``--steps N`` (default 3) optimizer steps; ``--exit-before-step`` ends before the first step (a
script that never reaches its step must fail the warm-up). Prints the first step's seconds.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--exit-before-step", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)
    if args.exit_before_step:
        return
    for step in range(args.steps):
        start = time.perf_counter()
        batch = torch.randn(4, 8)
        loss = compiled(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            print(f"first step {time.perf_counter() - start:.2f}s", flush=True)


if __name__ == "__main__":
    main()
