"""A toy training script: ``--steps N`` steps, each asking the toy runtime for its own program.

Like a training loop whose shapes change per step, step ``k`` needs the program ``step_k``; the
warm-up runs the first steps of it (``workloads[].steps``), a longer training then misses the rest.
"""

from __future__ import annotations

import argparse

from toyframework import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
for step in range(1, parser.parse_args().steps + 1):
    runtime.program(f"step_{step}")
    runtime.step()
