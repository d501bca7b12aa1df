"""Train a PyTorch classifier, the twin of the Flax example, with ``torch.compile``: the PyTorch example.

The model is ``examples/workloads/flax_mlp.py``'s (Linear → relu → LayerNorm → Linear, softmax
cross-entropy, AdamW); the model and the optimizer step are each compiled with ``torch.compile``,
as a real training script compiles them. The training entrypoint the PyTorch warm-up runs as it is:

    compilecache warm --framework pytorch --cache-dir ./cache --script examples/pytorch/train.py --steps 2

stops it after two optimizer steps (forward, backward and the optimizer each compiled, the
backward graph included: Inductor writes it only once backward ran). Run as training, it uses
nothing of compilecache: Inductor's cache is torch's own environment (``compilecache env
--framework pytorch``, or the webhook). ``--json`` prints one object: seconds to the first
step's result, and torch's FX graph and AOTAutograd cache hits and misses.

Size: ``TORCH_WIDTH``, ``TORCH_FEATURES``, ``TORCH_BATCH`` (tiny by default, so that a cold
compile on a 2-core CPU takes seconds, not minutes). Threads: ``OMP_NUM_THREADS``, which
enters Inductor's key on CPU: warm-up and training must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Config:
    """Model and batch size (the Flax example's defaults); every field changes the compiled graphs."""

    width: int = 32
    features: int = 16
    classes: int = 8
    batch: int = 8
    learning_rate: float = 1e-3

    @classmethod
    def from_env(cls) -> Config:
        """``TORCH_*`` variables, else the defaults."""
        env = os.environ
        return cls(
            width=int(env.get("TORCH_WIDTH", cls.width)),
            features=int(env.get("TORCH_FEATURES", cls.features)),
            batch=int(env.get("TORCH_BATCH", cls.batch)),
        )


def cache_counts() -> dict[str, int]:
    """torch's own cache counters in this process: FX graph (Inductor) and AOTAutograd lookups."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {
        "fxgraph_hits": int(inductor["fxgraph_cache_hit"]),
        "fxgraph_misses": int(inductor["fxgraph_cache_miss"]),
        "autograd_hits": int(aot["autograd_cache_hit"]),
        "autograd_misses": int(aot["autograd_cache_miss"]),
    }


def main(argv: list[str] | None = None) -> int:
    """Build the model, run ``--steps`` optimizer steps, report the first step's cost and the cache counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import torch
    from torch import nn

    config = Config.from_env()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(config.features, config.width),
        nn.ReLU(),
        nn.LayerNorm(config.width),
        nn.Linear(config.width, config.classes),
    )
    # A tensor learning rate: changing it later recompiles nothing (torch's guidance for compiled optimizers).
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(config.learning_rate))
    compiled = torch.compile(model)
    loss_fn = nn.CrossEntropyLoss()

    @torch.compile
    def optimizer_step() -> None:
        optimizer.step()

    generator = torch.Generator().manual_seed(0)
    losses: list[float] = []
    first_step = 0.0
    for step in range(args.steps):
        x = torch.randn(config.batch, config.features, generator=generator)
        y = torch.randint(0, config.classes, (config.batch,), generator=generator)
        began = time.perf_counter()
        loss = loss_fn(compiled(x), y)
        loss.backward()
        optimizer_step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step == 0:
            first_step = time.perf_counter() - began

    result = {
        "config": asdict(config),
        "threads": torch.get_num_threads(),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "first_step_seconds": round(first_step, 4),
        "wall_seconds": round(time.perf_counter() - start, 4),
        **cache_counts(),
        "losses": [round(value, 4) for value in losses],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"first step {first_step:.2f}s, FX graph cache hits {result['fxgraph_hits']}/"
            f"{result['fxgraph_hits'] + result['fxgraph_misses']}, losses {result['losses']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
