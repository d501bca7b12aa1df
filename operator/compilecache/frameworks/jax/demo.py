"""``compilecache demo`` for JAX (the default): the transformer example through the operator's loop.

JAX's part of the demo (:mod:`compilecache.local.demo` owns the flags, the local cluster's run of
the operator and the watch): ``examples/cache-pvc.yaml`` and ``examples/training-job.yaml`` sized
by ``--layers``/``--width``/``--devices``, a cold process to compare with, and the table; and
``--warmer-only``, the earlier demo with no cluster (cold, ``compilecache warm``, warm).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from compilecache.frameworks.jax.env import jax_cache_env
from compilecache.local.demo import (
    Clock,
    apply_and_wait,
    fresh_dir,
    from_zero,
    repo_root,
    run_script,
    table,
    train_result,
)

WORKLOAD = "examples.workloads.transformer:targets"


# The JAX example as the demo runs it outside the cluster (the cold process, and the warmer-only hit).
TRAIN = ["examples/train.py", "--json"]


def run_loop(args: argparse.Namespace, repo: Path, root: Path) -> int:
    """The whole loop on a local cluster under ``root``."""
    import yaml

    from compilecache.local.cluster import LocalCluster
    from compilecache.local.nodes import DEFAULT_POOLS, pools_from_config

    pools = DEFAULT_POOLS
    if args.nodes:
        try:
            pools = pools_from_config(yaml.safe_load(Path(args.nodes).read_text()) or {})
        except (OSError, ValueError, yaml.YAMLError) as error:
            print(f"compilecache demo: error: --nodes {args.nodes}: {error}", file=sys.stderr)
            return 2
    env = _model_env(args)
    clock = Clock()
    print("compilecache demo: the operator's whole loop on a local cluster (compilecache.local)")
    print("  containers run as local processes in this Python environment; images are ignored\n")
    print(f"1/3 cold: a training process with no cache ({args.layers} layers, width {args.width})")
    with tempfile.TemporaryDirectory(prefix="compilecache-cold-") as empty:
        cold = run_script(repo, TRAIN, {**env, **jax_cache_env(empty)})
    print(f"    first step {cold['first_step_seconds']:.2f}s (compile {cold['compile_seconds']:.2f}s)\n")

    cache = yaml.safe_load((repo / "examples" / "cache-pvc.yaml").read_text())
    model = [{"name": key, "value": value} for key, value in env.items() if key.startswith(("MODEL_", "XLA_"))]
    for workload in cache["spec"]["warmup"]["workloads"]:
        workload["env"] = [*(e for e in workload.get("env") or [] if not e["name"].startswith("MODEL_")), *model]
    if args.scale_from_zero:
        cache, pools = from_zero(cache, pools)
    training = yaml.safe_load((repo / "examples" / "training-job.yaml").read_text())
    container = training["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", "examples/train.py", "--steps", "3", "--json"]
    container["env"] = model

    with LocalCluster(root, workdir=repo, pools=pools) as cluster:
        # From the config, not the Nodes' labels: a pool labelled the way of a cloud (labelling) has no GFD label.
        products: dict[str, int] = {}
        for pool in pools:
            if pool.gpus > 0:
                kind = pool.product or pool.accelerator or pool.name
                products[kind] = products.get(kind, 0) + pool.count
        print(f"2/3 local cluster at {cluster.client.url}: {sum(products.values())} GPU nodes in {len(products)} pools")
        for product, count in sorted(products.items()):
            if count:
                print(f"    {count} x {product}")
        for pool in pools:
            if pool.autoscaled:
                print(f"    pool {pool.name}: 0 nodes, autoscaled up to {pool.max_count} ({pool.product})")
        applied = f"examples/cache-pvc.yaml, examples/training-job.yaml (MODEL_LAYERS={args.layers})"
        outcome = apply_and_wait(cluster, cache, training, clock, applied)
    if outcome is None:
        return 1
    status, log = outcome
    warm = train_result(log)
    print(f"\n3/3 cold against warm (the pod, on the cache the operator warmed), total {clock.now():.0f}s")
    cached = status.get("cache") or {}
    print(
        format_table(
            cold,
            warm,
            {"entries": cached.get("entries", 0), "bytes": cached.get("bytes", 0)},
            "training pod (warmed cache)",
        )
    )
    verdicts = [line for line in log.splitlines() if line.startswith("compilecache: ") and "compiles hit" in line]
    if verdicts:  # printed by the pod itself (the package's jax_plugins entry point), no code change
        print(f"the training pod's own verdict: {verdicts[-1]}")
    return 0 if warm["misses"] == 0 else 1


def run_warmer_only(args: argparse.Namespace) -> int:
    """The demo without a cluster: cold run, ``compilecache warm``, warm run."""
    try:
        repo = repo_root(args.repo)
        cache = fresh_dir(Path(args.cache_dir), "--cache-dir", args.force)
    except ValueError as error:
        print(f"compilecache demo: error: {error}", file=sys.stderr)
        return 2
    env = _model_env(args)
    print(f"1/3 cold: a training process on an empty cache ({args.layers} layers, width {args.width})")
    with tempfile.TemporaryDirectory(prefix="compilecache-cold-") as empty:
        cold = run_script(repo, TRAIN, {**env, **jax_cache_env(empty)})
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
    hot = run_script(repo, TRAIN, {**env, **jax_cache_env(str(cache))})
    print(format_table(cold, hot, report))
    return 0 if hot["misses"] == 0 else 1


def format_table(
    cold: dict[str, Any],
    warm: dict[str, Any],
    report: dict[str, Any],
    warm_title: str = "warm (after compilecache warm)",
) -> str:
    """The demo's result table (pure: for tests and the README)."""
    speedup = cold["compile_seconds"] / max(warm["compile_seconds"], 1e-9)
    rows = [
        ("", "cold (empty cache)", warm_title),
        ("compile/load seconds", f"{cold['compile_seconds']:.2f}", f"{warm['compile_seconds']:.2f}"),
        ("first step seconds", f"{cold['first_step_seconds']:.2f}", f"{warm['first_step_seconds']:.2f}"),
        ("cache hits/requests", f"{cold['hits']}/{cold['requests']}", f"{warm['hits']}/{warm['requests']}"),
        ("speedup (compile)", "", f"{speedup:.1f}x"),
        ("cache entries, bytes", "", f"{report['entries']}, {report['bytes']:,}"),
    ]
    return table(rows)


def _model_env(args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update({"MODEL_LAYERS": str(args.layers), "MODEL_WIDTH": str(args.width)})
    if args.devices:
        env["MODEL_SHARDED"] = "1"
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    return env
