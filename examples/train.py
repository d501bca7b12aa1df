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
from typing import Any

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

    join_process_group(jax)

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
        "process": jax.process_index(),
        "processes": jax.process_count(),
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


def join_process_group(jax: Any) -> None:
    """Join the training Job's process group when it has more than one process (multi-host).

    The variables are the ones the operator gives a multi-host warm-up Job, so the warm-up runs
    this script exactly as training does (docs/multihost.md): ``JAX_COORDINATOR_ADDRESS``
    (process 0's ``host:port``, read by JAX itself), ``COMPILECACHE_NUM_PROCESSES`` and the
    process id, ``COMPILECACHE_PROCESS_ID`` or else the Indexed Job's ``JOB_COMPLETION_INDEX``.
    """
    processes = int(os.environ.get("COMPILECACHE_NUM_PROCESSES") or 1)
    if processes > 1:
        process_id = os.environ.get("COMPILECACHE_PROCESS_ID") or os.environ["JOB_COMPLETION_INDEX"]
        jax.distributed.initialize(num_processes=processes, process_id=int(process_id))


if __name__ == "__main__":
    sys.exit(main())
