"""The Flax example warmed both ways: cold vs warm first step, and exact-mode overhead. Prints figures.

In fresh processes, over 4 CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``):

* cold:  ``examples/train_flax.py`` on an empty cache — seconds from start to the first step's result;
* exact: ``compilecache warm --script examples/train_flax.py --steps 2`` fills a cache, then the same
  training run on it;
* aot:   ``compilecache warm --workload examples.workloads.flax_mlp:targets`` fills a cache, then the
  same training run on it.

Warm-up wall time is measured with verify on (the default) and off. Median of ``--repeat`` runs;
ratios are printed beside the seconds. ``FLAX_WIDTH`` etc. (see the workload) change the size.

    .venv/bin/python bench/warm_modes.py [--repeat 3] [--width 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from compilecache.frameworks.jax.env import jax_cache_env  # noqa: E402
from jaxhelpers import inherited_pythonpath  # noqa: E402

FOUR_CPUS = "--xla_force_host_platform_device_count=4"
WARM = {
    "exact": ["--script", "examples/train_flax.py", "--steps", "2", "--", "--steps", "1000"],
    "aot": ["--workload", "examples.workloads.flax_mlp:targets"],
}


def base_env(width: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "FLAX_"))}
    env.update(PYTHONPATH=inherited_pythonpath([REPO / "operator", REPO]), XLA_FLAGS=FOUR_CPUS, FLAX_WIDTH=str(width))
    return env


def train(env: dict[str, str]) -> dict[str, Any]:
    argv = [sys.executable, "examples/train_flax.py", "--json", "--steps", "2"]
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"training failed: {done.stderr[-600:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def warm(cache: Path, env: dict[str, str], mode: str, verify: bool) -> float:
    argv = [sys.executable, "-m", "compilecache.cli", "warm", "--cache-dir", str(cache)]
    argv += ([] if verify else ["--no-verify"]) + WARM[mode]
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"warm {mode} failed: {done.stderr[-600:]}")
    return time.perf_counter() - start


def measure(width: int, repeat: int, scratch: Path) -> dict[str, float]:
    env = base_env(width)
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    for index in range(repeat):
        cold = scratch / f"cold{index}"
        add("cold first step", train({**env, **jax_cache_env(str(cold))})["first_step_seconds"])
        for mode in WARM:
            for verify in (True, False):
                cache = scratch / f"{mode}{index}{verify}"
                add(f"warm-up {mode}{'' if verify else ' --no-verify'}", warm(cache, env, mode, verify))
            result = train({**env, **jax_cache_env(str(cache))})
            if result["hits"] != result["requests"]:
                raise SystemExit(f"{mode}: training missed {result['requests'] - result['hits']} compiles")
            add(f"{mode} first step", result["first_step_seconds"])
        for path in scratch.iterdir():
            shutil.rmtree(path)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="warm-modes-") as scratch:
        figures = measure(args.width, args.repeat, Path(scratch))
    cold = figures["cold first step"]
    print(f"Flax MLP width {args.width}, 4 CPU devices, median of {args.repeat} (seconds):")
    for mode in WARM:
        step = figures[f"{mode} first step"]
        print(f"  first step  cold {cold:.2f}  warm ({mode}) {step:.2f}  = {step / cold:.2f}x of cold")
    for suffix in ("", " --no-verify"):
        exact, aot = figures[f"warm-up exact{suffix}"], figures[f"warm-up aot{suffix}"]
        print(f"  warm-up{suffix or ' (verify on)'}: exact {exact:.2f}  aot {aot:.2f}  = exact/aot {exact / aot:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
