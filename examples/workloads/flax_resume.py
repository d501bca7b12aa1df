"""A Flax training script that resumes from its own checkpoint: the restart the warm-up must cover.

A fresh start builds its ``TrainState`` with ``TrainState.create``, whose ``step`` is the Python
int 0: JAX traces it weak-typed (``int32[] weak_type=True``). A restart restores the state from a
checkpoint (``flax.serialization``), where ``step`` comes back as a numpy ``int32``: strong-typed.
One leaf of the tree differs, so ``train_step`` of a resumed run has another cache key than the
fresh one — the Flax lm1b case of issue 20. ``compilecache warm`` covers both: by default it runs
the entrypoint a second time in the same scratch working directory, where this script finds the
checkpoint its first run wrote (``--no-resume`` turns that off).

The script, as a real one would, saves ``checkpoint.msgpack`` in its working directory (``--ckpt-dir``)
every ``--save-every`` steps, and once more when it stops (a ``finally``: the warm-up stops it
with a ``SystemExit`` after N steps, which runs it too). It uploads nothing, so it does not need
``COMPILECACHE_WARMUP``: a script would test that variable only to skip uploads and other external
side effects, never the local save the restart depends on.

``python examples/workloads/flax_resume.py --steps 3 --json`` prints one JSON object: whether it
resumed, the step it reached, and its cache requests and hits (``jax.monitoring``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import serialization
from flax.training.train_state import TrainState

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
CHECKPOINT = "checkpoint.msgpack"
RAMP_STEPS = 10


class MLP(nn.Module):
    """Dense → relu → Dense: small, so every compile takes well under a second on a CPU."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        # Mixed precision, as large models train: bfloat16 compute over float32 parameters.
        hidden = nn.relu(nn.Dense(16, dtype=jnp.bfloat16)(x))
        return nn.Dense(4, dtype=jnp.bfloat16)(hidden)


def create_state() -> TrainState:
    """A fresh state: ``step`` is the Python int 0 (weak-typed once traced)."""
    model = MLP()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((8, 8)))["params"]
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1e-2))


@jax.jit
def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
    """One SGD step on a mean-squared error."""

    def loss_fn(params: Any) -> jax.Array:
        errors = (state.apply_fn({"params": params}, x) - y) ** 2  # bfloat16
        # A loss ramp read from the step. A weak-typed step (fresh start) keeps the product in
        # bfloat16; a restored, strong int32 step promotes it to float32: another program.
        ramp = jnp.minimum(1.0, (state.step + 1) / RAMP_STEPS)
        return jnp.mean(errors * ramp)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def batch(index: int) -> tuple[jax.Array, jax.Array]:
    """A deterministic batch (no data files: the example needs nothing but its working directory)."""
    key = jax.random.fold_in(jax.random.PRNGKey(1), index)
    x = jax.random.normal(key, (8, 8), dtype=jnp.bfloat16)
    return x, x[:, :4] * 2


def main(argv: list[str] | None = None) -> int:
    """Restore if a checkpoint is there, train ``--steps`` more steps, save as it goes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps to run in this process")
    parser.add_argument("--save-every", type=int, default=1, help="save a checkpoint every N steps")
    parser.add_argument("--ckpt-dir", default=".", help="where the checkpoint lives (relative: the working dir)")
    parser.add_argument(
        "--restore",
        choices=("auto", "never", "required"),
        default="auto",
        help="auto: restore when a checkpoint exists; required: fail without one (a restart flag)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    counts = {REQUESTS: 0, HITS: 0}
    jax.monitoring.register_event_listener(lambda event, **_: counts.__setitem__(event, counts.get(event, 0) + 1))

    path = Path(args.ckpt_dir) / CHECKPOINT
    state = create_state()
    resumed = args.restore != "never" and path.exists()
    if args.restore == "required" and not path.exists():
        print(f"--restore: no checkpoint at {path}", file=sys.stderr)
        return 1
    if resumed:
        # As orbax and flax.training.checkpoints do: the restored leaves are numpy arrays, strong-typed.
        state = serialization.from_bytes(state, path.read_bytes())
    first = int(state.step)

    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(serialization.to_bytes(state))

    loss = None
    try:
        for index in range(first, first + args.steps):
            state, loss = train_step(state, *batch(index))
            if (index + 1 - first) % args.save_every == 0:
                save()
    finally:
        # Also on the warm-up's stop after its N-th step (a SystemExit): the state of the last
        # finished step is saved, for the resumed run to restore.
        save()
    result = {
        "resumed": bool(resumed),
        "step": int(state.step),
        "loss": float(loss) if loss is not None else None,
        "requests": counts[REQUESTS],
        "hits": counts[HITS],
    }
    print(json.dumps(result) if args.json else f"trained to step {result['step']}; {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
