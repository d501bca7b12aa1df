"""A "training job": a few steps of the example transformer, reporting compile time and cache hits.

It imports nothing of compilecache's runtime: the cache is configured by JAX's
own environment variables (``compilecache env --cache-dir DIR``), exactly as
in a training pod. ``--json`` prints one JSON object for the demo and bench.

    eval "$(compilecache env --cache-dir ./demo-cache | sed 's/^/export /')"
    python examples/train.py --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

# Run as a file (python examples/train.py) or a module; either way import the
# workload from the repository root, where `examples` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
# Wraps XLA compile-or-load-from-cache for each program: cold = compile, warm = load.
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def main(argv: list[str] | None = None) -> int:
    """Run ``--steps`` training steps and print what start-up cost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, help="default: $MODEL_LAYERS or 2")
    parser.add_argument("--width", type=int, help="default: $MODEL_WIDTH or 64")
    parser.add_argument("--sharded", action="store_true", help="data-parallel over all devices")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import jax

    counts: dict[str, int] = defaultdict(int)
    durations: dict[str, float] = defaultdict(float)
    jax.monitoring.register_event_listener(lambda event, **_: counts.__setitem__(event, counts[event] + 1))
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **_: durations.__setitem__(event, durations[event] + secs)
    )

    from examples.workloads.transformer import ModelConfig, make_init, make_train_step

    overrides: dict[str, object] = {}
    if args.layers is not None:
        overrides["layers"] = args.layers
    if args.width is not None:
        overrides["width"] = args.width
    if args.sharded:
        overrides["sharded"] = True
    config = ModelConfig.from_env(**overrides)

    params, opt, batch = make_init(config)()
    step = make_train_step(config)
    first = time.perf_counter()
    params, opt, loss = step(params, opt, batch)
    loss.block_until_ready()
    first_step = time.perf_counter() - first
    losses = [float(loss)]
    for _ in range(args.steps - 1):
        params, opt, loss = step(params, opt, batch)
        losses.append(float(loss))

    result = {
        "config": asdict(config),
        "devices": jax.device_count(),
        "cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
        "compile_seconds": round(durations[BACKEND_COMPILE], 4),
        "first_step_seconds": round(first_step, 4),
        "wall_seconds": round(time.perf_counter() - start, 4),
        "requests": counts[REQUESTS],
        "hits": counts[HITS],
        "misses": counts[REQUESTS] - counts[HITS],
        "losses": [round(value, 4) for value in losses],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"compile/load {result['compile_seconds']:.2f}s, first step {first_step:.2f}s, "
            f"cache hits {result['hits']}/{result['requests']}, losses {result['losses']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
