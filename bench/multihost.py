"""A 2-process training run (``examples/train.py``): cold, warm by JAX alone, warm by the warmer. Prints figures.

Every run is a fresh group of 2 processes over 127.0.0.1 (``jax.distributed``, gloo), as an
Indexed training Job runs on 2 nodes:

* cold:      an empty cache; each process compiles;
* jax-only:  the same run again on the cache the cold run left (JAX wrote process 0's entries only);
* warmed:    a fresh cache filled by a 2-process ``compilecache warm --script examples/train.py
  --steps 2`` group (each process stores its own keys), then the same run.

Prints per process: cache hits, compile seconds (JAX's backend_compile: compile or load) and
the first step, and each figure's ratio to the cold run's. Median of ``--repeat`` runs.

    .venv/bin/python bench/multihost.py [--repeat 3] [--layers 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from compilecache.local.demo import train_result  # noqa: E402
from groupharness import cpu_env, distributed_cpu_problem, free_port, require_success, run_processes  # noqa: E402

PROCESSES = 2
TIMEOUT_S = 600.0


def group_env(cache: Path, layers: int, port: int, index: int) -> dict[str, str]:
    """What the training Job's pod *index* has: the cache settings, the model, the group's variables."""
    return cpu_env(
        cache,
        1,
        {
            "MODEL_LAYERS": str(layers),
            "MODEL_SHARDED": "1",
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "COMPILECACHE_NUM_PROCESSES": str(PROCESSES),
            "JOB_COMPLETION_INDEX": str(index),
        },
    )


def train(cache: Path, layers: int, run_dir: Path) -> list[dict[str, Any]]:
    """One 2-process training run; each process's JSON line."""
    port = free_port()
    command = [sys.executable, "examples/train.py", "--steps", "2", "--json"]
    envs = [group_env(cache, layers, port, index) for index in range(PROCESSES)]
    finished = run_processes([command] * PROCESSES, envs, run_dir, TIMEOUT_S, cwd=REPO)
    require_success(finished, "training", TIMEOUT_S)
    results = [train_result(one.log.read_text()) for one in finished]
    return sorted(results, key=lambda result: int(result["process"]))


def warm(cache: Path, layers: int, run_dir: Path) -> None:
    """The warm-up pods' command, one process per pod (the coordination group uses port..port+3)."""
    port = free_port(block=4)
    command = [sys.executable, "-m", "compilecache.cli", "warm", "--cache-dir", str(cache)]
    command += ["--script", "examples/train.py", "--steps", "2", "--step-fn", "_train_step", "--", "--steps", "1000"]
    envs = [group_env(cache, layers, port, index) for index in range(PROCESSES)]
    require_success(run_processes([command] * PROCESSES, envs, run_dir, TIMEOUT_S, cwd=REPO), "warm", TIMEOUT_S)


def one_round(layers: int, scratch: Path) -> dict[str, list[dict[str, Any]]]:
    shared, fresh = scratch / "jax-cache", scratch / "warmed-cache"
    shared.mkdir()
    fresh.mkdir()
    cold = train(shared, layers, scratch / "cold")
    jax_only = train(shared, layers, scratch / "jax-only")
    warm(fresh, layers, scratch / "warm")
    warmed = train(fresh, layers, scratch / "warmed")
    return {"cold": cold, "jax-only": jax_only, "warmed": warmed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    problem = distributed_cpu_problem()
    if problem:
        raise SystemExit(problem)
    rounds = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-multihost-") as scratch:
            rounds.append(one_round(args.layers, Path(scratch)))

    def median(mode: str, process: int, key: str) -> float:
        return statistics.median(float(r[mode][process][key]) for r in rounds)

    print(f"2 processes x 1 CPU device, MODEL_LAYERS={args.layers}, median of {args.repeat} (seconds; ratio to cold)")
    print(f"{'run':<10} {'process':>7} {'hits':>6} {'compile':>16} {'first step':>16}")
    for mode in ("cold", "jax-only", "warmed"):
        for process in range(PROCESSES):
            last = rounds[-1][mode][process]
            figures = []
            for key in ("compile_seconds", "first_step_seconds"):
                value, base = median(mode, process, key), median("cold", process, key)
                figures.append(f"{value:7.3f} ({value / base:5.2f}x)")
            hits = f"{last['hits']}/{last['requests']}"
            print(f"{mode:<10} {process:>7} {hits:>6} {figures[0]:>16} {figures[1]:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
