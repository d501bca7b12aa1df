"""What naming a miss costs a training process: the compile hook per compile, the signature per miss.

``python bench/miss_naming.py [--leaves 90] [--repeat 2000]`` prints, on this machine's backend:

- the hook's cost on every compile (:mod:`compilecache.frameworks.jax.compilehook`: a thread-local store
  around ``MeshComputation.compile``), measured on a call that returns JAX's own memoised
  executable, so nothing but the wrapper is timed against the bare method;
- the cost of reading a missed program's signature (:func:`signature_of_computation`), which the
  trainer pays only on a miss, for a state of ``--leaves`` arrays (Flax lm1b's ``TrainState`` has 90);
- the cold compile time of that program, the cost the signature is compared with;
- the cost, on every call of the step function, of counting its calls (the trainer's step count:
  :class:`compilecache.frameworks.jax.stepcalls.CountingJitted` around the jitted step), against a bare call
  of the same compiled step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def _per_call(fn: Any, repeat: int) -> float:
    """Median seconds per call over 5 rounds of ``repeat`` calls."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        rounds.append((time.perf_counter() - start) / repeat)
    return statistics.median(rounds)


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    from jax._src.interpreters import pxla

    from compilecache.frameworks.jax import compilehook
    from compilecache.frameworks.jax.keydiff import signature_of_computation
    from compilecache.frameworks.jax.stepcalls import CountingJitted

    state = {"step": 0, "params": [jnp.ones((16, 16)) for _ in range(args.leaves - 1)]}

    def train_step(state: dict[str, Any]) -> dict[str, Any]:
        return {"step": state["step"] + 1, "params": [p * 0.9 + 0.1 for p in state["params"]]}

    bare = pxla.MeshComputation.compile
    lowering = jax.jit(train_step).lower(state)._lowering
    start = time.perf_counter()
    bare(lowering)  # the cold compile (no persistent cache here); later calls return it memoised
    compile_seconds = time.perf_counter() - start
    unhooked = _per_call(lambda: bare(lowering), args.repeat)
    compilehook.install()
    hooked_method = pxla.MeshComputation.compile
    hooked = _per_call(lambda: hooked_method(lowering), args.repeat)
    signature = _per_call(lambda: signature_of_computation(lowering), max(1, args.repeat // 20))
    hook_us = max(0.0, hooked - unhooked) * 1e6
    # The smallest step (one tiny array), so that the wrapper is not lost in the step's own dispatch;
    # rounds alternate between the bare and the counting call and the fastest round of each counts.
    jitted = jax.jit(lambda x: x + 1.0)
    tiny = jnp.ones((4,))
    jax.block_until_ready(jitted(tiny))  # compiled once: both sides below time dispatch only
    calls = [0]

    def after(_: Any) -> None:  # what the trainer's counter does on each step (frameworks/jax/stepcount.py)
        calls[0] += 1

    counting = CountingJitted(jitted, after=after)
    bare_rounds: list[float] = []
    counted_rounds: list[float] = []
    for _ in range(7):
        for fn, rounds in ((jitted, bare_rounds), (counting, counted_rounds)):
            start = time.perf_counter()
            for _ in range(args.repeat):
                fn(tiny)
            jax.block_until_ready(fn(tiny))
            rounds.append((time.perf_counter() - start) / (args.repeat + 1))
    bare_step, counted_step = min(bare_rounds), min(counted_rounds)
    count_us = max(0.0, counted_step - bare_step) * 1e6
    print(f"backend {jax.default_backend()}, {jax.device_count()} device(s), jax {jax.__version__}")
    print(f"cold compile of a {args.leaves}-leaf train_step: {compile_seconds * 1e3:.1f} ms")
    print(f"hook, every compile: {hook_us:.2f} us ({hook_us / (compile_seconds * 1e6) * 100:.4f} % of that compile)")
    print(
        f"signature, on a miss only: {signature * 1e3:.3f} ms "
        f"({signature / compile_seconds * 100:.2f} % of that compile)"
    )
    print(
        f"step count, every step call: {count_us:.2f} us "
        f"(a bare call of a one-array step: {bare_step * 1e6:.1f} us; a training step takes milliseconds)"
    )


if __name__ == "__main__":
    main()
