"""``compilecache demo`` (``make demo``): warm the example workload, then time a fresh training process.

Three processes, all real: a cold training start on an empty cache, the
warmer filling ``--cache-dir`` (default ``./demo-cache``, recreated every run),
and a fresh training process on that cache. Prints a table: cold compile
seconds, warm load seconds, speedup, hits/requests, entries and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from compilecache.cache.cacheenv import jax_cache_env
from compilecache.cache.store import META_DIR

WORKLOAD = "examples.workloads.transformer:targets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``compilecache demo``."""
    parser.add_argument("--cache-dir", default="demo-cache", help="recreated each run (default ./demo-cache)")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    parser.add_argument("--width", type=int, default=64, help="model width (default 64)")
    parser.add_argument(
        "--devices", type=int, default=0, help="shard data-parallel over N host devices (default: unsharded)"
    )
    parser.add_argument("--repo", default=None, help="repository root holding examples/ (default: found)")


def run(args: argparse.Namespace) -> int:
    """Run the demo; return non-zero with a one-line error if any step fails."""
    try:
        repo = _repo_root(args.repo)
        cache = _fresh_cache_dir(Path(args.cache_dir))
    except ValueError as error:
        print(f"compilecache demo: error: {error}", file=sys.stderr)
        return 2
    env = _model_env(args)
    print(f"1/3 cold: a training process on an empty cache ({args.layers} layers, width {args.width})")
    with tempfile.TemporaryDirectory(prefix="compilecache-cold-") as empty:
        cold = _train(repo, {**env, **jax_cache_env(empty)})
    print(f"2/3 warm: compilecache warm --cache-dir {cache} --workload {WORKLOAD}")
    report_path = Path(tempfile.gettempdir()) / f"compilecache-demo-{os.getpid()}.json"
    warm = subprocess.run(
        [
            sys.executable,
            "-m",
            "compilecache.cli",
            "warm",
            "--cache-dir",
            str(cache),
            "--workload",
            WORKLOAD,
            "--report",
            str(report_path),
        ],
        cwd=repo,
        env=env,
        check=False,
    )
    if warm.returncode != 0:
        print(f"compilecache demo: error: the warmer failed (exit {warm.returncode})", file=sys.stderr)
        return 1
    report = json.loads(report_path.read_text())
    report_path.unlink()
    print(f"3/3 hit: a fresh training process with `compilecache env --cache-dir {cache}`")
    hot = _train(repo, {**env, **jax_cache_env(str(cache))})
    print(format_table(cold, hot, report))
    return 0 if hot["misses"] == 0 else 1


def format_table(cold: dict[str, Any], warm: dict[str, Any], report: dict[str, Any]) -> str:
    """The demo's result table (pure: for tests and the README)."""
    speedup = cold["compile_seconds"] / max(warm["compile_seconds"], 1e-9)
    rows = [
        ("", "cold (empty cache)", "warm (after compilecache warm)"),
        ("compile/load seconds", f"{cold['compile_seconds']:.2f}", f"{warm['compile_seconds']:.2f}"),
        ("first step seconds", f"{cold['first_step_seconds']:.2f}", f"{warm['first_step_seconds']:.2f}"),
        ("cache hits/requests", f"{cold['hits']}/{cold['requests']}", f"{warm['hits']}/{warm['requests']}"),
        ("speedup (compile)", "", f"{speedup:.1f}x"),
        ("cache entries, bytes", "", f"{report['entries']}, {report['bytes']:,}"),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _train(repo: Path, env: dict[str, str]) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, str(repo / "examples" / "train.py"), "--json"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(f"compilecache demo: error: training failed: {completed.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def _model_env(args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update({"MODEL_LAYERS": str(args.layers), "MODEL_WIDTH": str(args.width)})
    if args.devices:
        env["MODEL_SHARDED"] = "1"
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    return env


def _repo_root(given: str | None) -> Path:
    candidates = [Path(given)] if given else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for candidate in candidates:
        if (candidate / "examples" / "workloads" / "transformer.py").is_file():
            return candidate.resolve()
    raise ValueError("cannot find examples/workloads/transformer.py: run from the repository root")


def _fresh_cache_dir(path: Path) -> Path:
    # Recreate the demo cache, but never delete a directory we did not make.
    if path.exists() and any(path.iterdir()) and not (path / META_DIR).is_dir():
        raise ValueError(f"{path} exists and is not a compilecache cache; pick another --cache-dir")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path.resolve()
