"""Train the Flax example (``examples/workloads/flax_mlp.py``) for ``--steps`` steps.

Every ``--epoch-steps`` steps (an "epoch") it evaluates on a held-out batch with
``eval_step``, a program of its own that the first steps never compile. The training
entrypoint the exact warm mode runs as it is:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
      compilecache warm --cache-dir ./cache --script examples/train_flax.py --steps auto -- --steps 1000

runs it until its budget (``--budget``, 120 s) has passed after the first step, so the
first epoch's evaluation is in the cache too; ``--steps 2`` would stop it after two calls of
``train_step``, before any evaluation. Run as training, it uses nothing of compilecache: the cache
is JAX's own environment variables (``compilecache env``). ``--json`` prints one
object: seconds to the first step's result, and cache requests/hits (jax.monitoring).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a file: import the workload from the repository root, where `examples` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"


def main(argv: list[str] | None = None) -> int:
    """Initialise, run ``--steps`` steps, report start-up cost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--epoch-steps", type=int, default=5, help="evaluate after every this many steps")
    parser.add_argument("--no-donate", action="store_true", help="jit the step without donation (a trap)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import jax

    counts = {REQUESTS: 0, HITS: 0}
    jax.monitoring.register_event_listener(lambda event, **_: counts.__setitem__(event, counts.get(event, 0) + 1))

    from examples.workloads.flax_mlp import (
        Config,
        make_batch,
        make_create_state,
        make_eval_step,
        make_mesh,
        make_train_step,
    )

    config = Config.from_env()
    mesh = make_mesh()
    state = make_create_state(config, mesh)()
    step = make_train_step(donate=not args.no_donate)
    evaluate = make_eval_step()
    held_out = make_batch(config, mesh, 2**31)  # a seed no training step uses
    first_step = None
    loss = eval_loss = None
    evaluations = 0
    for index in range(args.steps):
        x, y = make_batch(config, mesh, index)
        state, loss = step(state, x, y)
        if first_step is None:
            jax.block_until_ready(loss)
            first_step = time.perf_counter() - start
        if (index + 1) % args.epoch_steps == 0:  # the end of an epoch
            eval_loss = float(evaluate(state, *held_out))
            evaluations += 1
    result = {
        "first_step_seconds": round(first_step or 0.0, 4),
        "steps": args.steps,
        "loss": float(loss) if loss is not None else None,
        "evaluations": evaluations,
        "eval_loss": eval_loss,
        "devices": jax.device_count(),
        "requests": counts[REQUESTS],
        "hits": counts[HITS],
    }
    print(json.dumps(result) if args.json else f"first step after {result['first_step_seconds']}s; {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
