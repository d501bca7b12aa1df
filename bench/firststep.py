"""Cold and warm first step of each example, on whatever backend JAX finds. Prints figures.

One command, the same work on CPU and GPU::

    .venv/bin/python bench/firststep.py [--layers 2] [--repeat 1] [--tiny]

For each example (``examples/train.py``, the transformer; ``examples/train_flax.py``, the Flax
MLP; ``examples/train.py`` as a 2-process ``jax.distributed`` group where the machine allows it,
on the CPU), in fresh processes with the product's cache settings (``jax_cache_env``):

* cold: an empty cache (compile, then JAX writes the entries);
* warm: the same run again on the cache the cold run filled (for the group: on a cache filled by
  the product's 2-process warm-up, as bench/multihost.py fills it; JAX alone writes process 0's
  entries only);

and prints the first-step seconds (each example's own figure), per-function backend
compile-or-load seconds (``/jax/core/compile/backend_compile_duration`` by ``fun_name``), the
cache's bytes, and on a GPU the share of cold compile time that XLA's autotuning takes (a cold
run with ``--xla_gpu_autotune_level=0`` against the plain cold run; ``n/a`` elsewhere). Every
figure is printed with its ratio to the cold run of the same invocation. Lines are
``key=value`` pairs, so CI (tests/test_bench_firststep.py) parses them.

Part two, the multi-host key questions (do two processes of one job ask for the same keys? does
one process compiling with ``jax_mock_gpu_topology`` produce the keys an N-process run asks for?),
is ``bench/multihost_keys.py``, run here after the examples unless ``--no-multihost`` (it also runs
alone, with ``--mock``). Its groups run on the CPU; its mock-topology probe runs on the GPU where
there is one and says how many devices, local devices and processes the mocked process saw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests"), str(REPO / "bench")]

import multihost  # noqa: E402  (bench/multihost.py: the same group, and its warm-up)
import multihost_keys  # noqa: E402  (bench/multihost_keys.py: part two)
from compilecache.frameworks.jax.env import jax_cache_env  # noqa: E402
from compilecache.local.demo import train_result  # noqa: E402
from groupharness import distributed_cpu_problem, free_port, require_success, run_processes  # noqa: E402
from jaxhelpers import inherited_pythonpath  # noqa: E402

TIMEOUT_S = 600.0
PREFIX = "FIRSTSTEP "
# Runs an example as its own __main__ with a listener that sums backend compile seconds per
# function: the examples stay as users run them, and the listener is JAX's public monitoring API.
RUNNER = f"""
import json, runpy, sys
from collections import defaultdict
import jax
seconds = defaultdict(float)
def on_duration(event, secs, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        seconds[str(kwargs.get("fun_name", "?"))] += secs
jax.monitoring.register_event_duration_secs_listener(on_duration)
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as stop:
    if stop.code:
        raise
print({PREFIX!r} + json.dumps({{"backend": jax.default_backend(), "functions": dict(seconds)}}), flush=True)
"""
AUTOTUNE_OFF = "--xla_gpu_autotune_level=0"


def example_env(cache: Path, model: Mapping[str, str], xla_flags: str = "") -> dict[str, str]:
    """The caller's environment without its JAX/model settings, plus the product's cache settings.

    This tree goes first on ``PYTHONPATH``; the caller's entries stay (where its packages may come from).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MODEL_", "FLAX_", "XLA_"))}
    env.update(jax_cache_env(str(cache), xla_flags=xla_flags or None))
    env.update(model)
    env["PYTHONPATH"] = inherited_pythonpath([REPO, REPO / "operator"])
    return env


def parse_run(output: str) -> dict[str, Any]:
    """The example's own JSON line and the runner's per-function seconds, as one dict."""
    result = train_result(output)
    [line] = [line for line in output.splitlines() if line.startswith(PREFIX)][-1:] or [""]
    if not line:
        raise SystemExit(f"no per-function figures in: {output[-1000:]}")
    result.update(json.loads(line.removeprefix(PREFIX)))
    return result


def run_one(script: str, argv: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """One fresh process of ``script``."""
    command = [sys.executable, "-c", RUNNER, str(REPO / script), *argv]
    done = subprocess.run(command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise SystemExit(f"failed: {script} {' '.join(argv)}\n{done.stderr[-2000:]}")
    return parse_run(done.stdout + "\n" + done.stderr)


def run_group(script: str, argv: Sequence[str], cache: Path, layers: int, run_dir: Path) -> dict[str, Any]:
    """A 2-process group of ``script`` (one CPU device each, as bench/multihost.py runs it).

    Process 0's figures, with both processes' hits and requests.
    """
    port = free_port()
    envs = [multihost.group_env(cache, layers, port, index) for index in range(multihost.PROCESSES)]
    command = [sys.executable, "-c", RUNNER, str(REPO / script), *argv]
    finished = run_processes([command] * multihost.PROCESSES, envs, run_dir, TIMEOUT_S, cwd=REPO)
    require_success(finished, script, TIMEOUT_S)
    results = [parse_run(one.log.read_text()) for one in finished]
    first = results[0]
    first["hits"] = sum(int(r["hits"]) for r in results)
    first["requests"] = sum(int(r["requests"]) for r in results)
    return first


def cache_bytes(cache: Path) -> int:
    """Bytes of every file under the cache (entries and JAX's sidecars)."""
    return sum(path.stat().st_size for path in cache.rglob("*") if path.is_file())


# runner(cache, run_dir, extra XLA flags) → one run's figures; fill(cache, run_dir) → warm a cache.
Runner = Callable[[Path, Path, str], dict[str, Any]]
Fill = Callable[[Path, Path], None]


def measure(name: str, runner: Runner, fill: Fill | None, repeat: int, scratch: Path) -> dict[str, Any]:
    """Cold (and, on a GPU, cold without autotuning) then warm runs of one example; every run kept.

    The warm run reads the cache the cold run filled, or with ``fill`` one the product's warm-up
    filled (a group: JAX alone writes process 0's entries only).
    """
    colds, warms, no_autotune = [], [], []
    caches = []
    for index in range(repeat):
        cache = scratch / f"{name}-{index}"
        cache.mkdir()
        colds.append(runner(cache, scratch / f"{name}-cold-{index}", ""))
        if fill is not None:
            cache = scratch / f"{name}-warmed-{index}"
            cache.mkdir()
            fill(cache, scratch / f"{name}-fill-{index}")
        caches.append(cache)
        warms.append(runner(cache, scratch / f"{name}-warm-{index}", ""))
        if colds[-1]["backend"] == "gpu":
            off = scratch / f"{name}-noautotune-{index}"
            off.mkdir()
            no_autotune.append(runner(off, scratch / f"{name}-off-{index}", AUTOTUNE_OFF))
    return {
        "name": name,
        "backend": colds[0]["backend"],
        "cold": colds,
        "warm": warms,
        "no_autotune": no_autotune,
        "bytes": statistics.median(cache_bytes(cache) for cache in caches),
    }


def summary(figures: Mapping[str, Any]) -> list[str]:
    """The printed lines for one example: a headline, then one line per function (pure)."""

    def median(runs: Sequence[Mapping[str, Any]], key: str) -> float:
        return statistics.median(float(run[key]) for run in runs)

    def compile_total(run: Mapping[str, Any]) -> float:
        return sum(float(s) for s in run["functions"].values())

    cold, warm = median(figures["cold"], "first_step_seconds"), median(figures["warm"], "first_step_seconds")
    cold_compile = statistics.median(compile_total(run) for run in figures["cold"])
    warm_compile = statistics.median(compile_total(run) for run in figures["warm"])
    autotune = "n/a"
    if figures["no_autotune"]:
        off = statistics.median(compile_total(run) for run in figures["no_autotune"])
        autotune = f"{max(0.0, 1 - off / cold_compile):.3f}" if cold_compile else "n/a"
    last = figures["warm"][-1]
    lines = [
        f"example={figures['name']} backend={figures['backend']} "
        f"cold_first_step_s={cold:.3f} warm_first_step_s={warm:.3f} warm/cold={_ratio(warm, cold)} "
        f"cold_compile_s={cold_compile:.3f} warm_compile_s={warm_compile:.3f} "
        f"compile_warm/cold={_ratio(warm_compile, cold_compile)} "
        f"warm_hits={last['hits']}/{last['requests']} cache_bytes={int(figures['bytes'])} autotune_share={autotune}"
    ]
    names = sorted({fn for run in figures["cold"] for fn in run["functions"]})
    for fn in names:
        c = statistics.median(float(run["functions"].get(fn, 0.0)) for run in figures["cold"])
        w = statistics.median(float(run["functions"].get(fn, 0.0)) for run in figures["warm"])
        lines.append(f"  function={fn} cold_s={c:.3f} warm_s={w:.3f} warm/cold={_ratio(w, c)}")
    return lines


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}" if base > 0 else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="transformer layers (MODEL_LAYERS)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (the median is printed)")
    parser.add_argument("--tiny", action="store_true", help="smallest models, one step: the CI smoke run")
    parser.add_argument("--no-multihost", action="store_true", help="skip the 2-process example")
    args = parser.parse_args(argv)
    layers = 1 if args.tiny else args.layers
    transformer = {"MODEL_LAYERS": str(layers)}
    flax = {"FLAX_WIDTH": "16"} if args.tiny else {}
    steps = ["--steps", "1", "--json"]

    def single(script: str, model: Mapping[str, str]) -> Runner:
        return lambda cache, _dir, flags: run_one(script, steps, example_env(cache, model, flags))

    def group(cache: Path, run_dir: Path, flags: str) -> dict[str, Any]:
        return run_group("examples/train.py", steps, cache, layers, run_dir)

    with tempfile.TemporaryDirectory(prefix="bench-firststep-") as folder:
        scratch = Path(folder)
        examples: list[tuple[str, Runner, Fill | None]] = [
            ("transformer", single("examples/train.py", transformer), None),
            ("flax-mlp", single("examples/train_flax.py", flax), None),
        ]
        problem = None if args.no_multihost else distributed_cpu_problem()
        if not args.no_multihost and problem is None:
            # The group runs on the CPU (one device per process): a 1-GPU machine cannot hold two.
            examples.append(("multihost-2proc", group, lambda cache, d: multihost.warm(cache, layers, d)))
        for name, runner, fill in examples:
            figures = measure(name, runner, fill, args.repeat, scratch)
            print("\n".join(summary(figures)), flush=True)
        if args.no_multihost or problem is not None:
            print(f"example=multihost-2proc skipped: {problem or '--no-multihost'}")
            print(f"multihost-keys skipped: {problem or '--no-multihost'} (bench/multihost_keys.py alone answers them)")
        else:
            # Part two: the key questions, on the CPU whatever the backend (docs/benchmarks.md).
            print("\n".join(multihost_keys.report(multihost_keys.measure(scratch / "keys"))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
