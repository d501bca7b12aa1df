"""Cold compile vs warm hit vs the raw JAX hit floor, and ``--jobs`` scaling. Prints figures.

For each size (2, 8, 24 layers of the example transformer), in separate fresh processes:

* cold:  ``examples/train.py`` on an empty cache (compile, then write);
* warm:  ``compilecache warm`` fills a cache, then ``examples/train.py`` runs with
  ``compilecache env`` settings (our settings, JAX's own variables);
* floor: the same hit, with JAX's options set by hand through ``jax.config``
  in a script that imports nothing of ours besides the model.

Figures are backend compile-or-load seconds (``/jax/core/compile/backend_compile_duration``),
median of ``--repeat`` runs. Then K independent targets warmed with ``--jobs 1`` vs
``--jobs N`` (threads), and as N separate warmer processes (the process alternative).

    .venv/bin/python bench/coldwarm.py [--layers 2 8 24] [--repeat 3] [--variants 4] [--jobs 2]
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from compilecache.frameworks.jax.env import jax_cache_env  # noqa: E402
from jaxhelpers import inherited_pythonpath  # noqa: E402

FLOOR = """
import json, sys, time
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
durations, counts = [], []
jax.monitoring.register_event_duration_secs_listener(
    lambda e, s, **_: durations.append(s) if e == "/jax/core/compile/backend_compile_duration" else None)
jax.monitoring.register_event_listener(lambda e, **_: counts.append(e))
from examples.workloads.transformer import ModelConfig, make_init, make_train_step
config = ModelConfig.from_env()
state = make_init(config)()
make_train_step(config)(*state)[2].block_until_ready()
print(json.dumps({"compile_seconds": sum(durations),
                  "hits": counts.count("/jax/compilation_cache/cache_hits"),
                  "requests": counts.count("/jax/compilation_cache/compile_requests_use_cache")}))
"""


def base_env(layers: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` without its JAX/model settings; this tree first on its ``PYTHONPATH``, the rest kept."""
    env = {k: v for k, v in environ.items() if not k.startswith(("JAX_", "MODEL_"))}
    env.update({"MODEL_LAYERS": str(layers), "PYTHONPATH": inherited_pythonpath([REPO, REPO / "operator"], environ)})
    return env


def run_json(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def train(env: dict[str, str]) -> dict[str, Any]:
    return run_json([sys.executable, str(REPO / "examples" / "train.py"), "--json", "--steps", "1"], env)


def warm(cache: Path, env: dict[str, str], workload: str, jobs: int = 1, verify: bool = False) -> float:
    argv = [
        sys.executable,
        "-m",
        "compilecache.cli",
        "warm",
        "--cache-dir",
        str(cache),
        "--workload",
        workload,
        "--jobs",
        str(jobs),
        "--verify" if verify else "--no-verify",
    ]
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"warm failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def coldwarm(layers: int, repeat: int, scratch: Path) -> dict[str, Any]:
    env = base_env(layers)
    cold, hot, floor = [], [], []
    misses = 0
    for index in range(repeat):
        empty = scratch / f"cold-{layers}-{index}"
        cold.append(train({**env, **jax_cache_env(str(empty))})["compile_seconds"])
    cache = scratch / f"cache-{layers}"
    warm(cache, env, "examples.workloads.transformer:targets")
    for _ in range(repeat):
        # Alternate so that drift on a busy machine hits both alike.
        ours = train({**env, **jax_cache_env(str(cache))})
        misses += ours["misses"]
        hot.append(ours["compile_seconds"])
        raw = run_json([sys.executable, "-c", FLOOR, str(cache)], env)
        misses += raw["requests"] - raw["hits"]
        floor.append(raw["compile_seconds"])
    c, w, f = statistics.median(cold), statistics.median(hot), statistics.median(floor)
    return {
        "layers": layers,
        "cold": c,
        "warm": w,
        "floor": f,
        "warm/floor": w / f,
        "cold/warm": c / w,
        "misses": misses,
    }


def jobs_scaling(variants: int, jobs: int, scratch: Path) -> dict[str, float]:
    env = {**base_env(2), "MODEL_VARIANTS": str(variants)}
    workload = "examples.workloads.transformer:variants"
    sequential = warm(scratch / "jobs-1", env, workload, jobs=1)
    threaded = warm(scratch / f"jobs-{jobs}", env, workload, jobs=jobs)
    # The process alternative: one warmer process per target, `jobs` at a time.
    start = time.perf_counter()
    procs: list[subprocess.Popen[bytes]] = []
    for index in range(variants):
        one = {**env, "MODEL_WIDTH": str(64 + 16 * index), "MODEL_VARIANTS": "1"}
        argv = [
            sys.executable,
            "-m",
            "compilecache.cli",
            "warm",
            "--cache-dir",
            str(scratch / "procs"),
            "--workload",
            workload,
            "--no-verify",
        ]
        procs.append(subprocess.Popen(argv, env=one, cwd=REPO, stdout=subprocess.DEVNULL))
        if len(procs) >= jobs:
            procs.pop(0).wait()
    for proc in procs:
        proc.wait()
    processes = time.perf_counter() - start
    return {"sequential": sequential, "threads": threaded, "processes": processes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[2, 8, 24])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 2, 8))
    parser.add_argument("--skip-jobs", action="store_true")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="coldwarm-"))
    try:
        print(f"{'layers':>6} {'cold s':>8} {'warm s':>8} {'floor s':>8} {'warm/floor':>10} {'cold/warm':>9} misses")
        for layers in args.layers:
            r = coldwarm(layers, args.repeat, scratch)
            print(
                f"{r['layers']:>6} {r['cold']:>8.3f} {r['warm']:>8.3f} {r['floor']:>8.3f} "
                f"{r['warm/floor']:>10.3f} {r['cold/warm']:>8.1f}x {r['misses']:>6}",
                flush=True,
            )
        if not args.skip_jobs:
            s = jobs_scaling(args.variants, args.jobs, scratch)
            print(f"\n{args.variants} independent targets, wall seconds of the warmer (cpu cores: {os.cpu_count()}):")
            print(
                f"  --jobs 1: {s['sequential']:.2f}  --jobs {args.jobs} (threads): {s['threads']:.2f} "
                f"({s['sequential'] / s['threads']:.2f}x)  {args.jobs} processes: {s['processes']:.2f} "
                f"({s['sequential'] / s['processes']:.2f}x)"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
