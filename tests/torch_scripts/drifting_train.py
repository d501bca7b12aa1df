"""A training script whose second run compiles a graph its first run did not: verify must catch it.

``--marker PATH``: the first run creates the file; a run that finds it (verify's) also compiles
another function, as a script would whose code path depends on a file a previous run left. Kept
cheap: the optimizer step is eager, and each compiled function is one tiny forward graph.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker", required=True)
    args = parser.parse_args()
    marker = Path(args.marker)
    second = marker.exists()
    marker.touch()
    metric = torch.compile(lambda x: (x * 2).sum())
    metric(torch.ones(3))
    if second:
        other = torch.compile(lambda x: (x * 3).sum())
        other(torch.ones(3))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()


if __name__ == "__main__":
    main()
