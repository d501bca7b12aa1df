"""``compilecache demo --framework pytorch``: the PyTorch loop on the local cluster, with its figures.

The demo's loop (:mod:`compilecache.local.demo`) for a ``spec.framework: pytorch`` cache:

1. a cold training process (``examples/pytorch/train.py``) on an empty Inductor cache;
2. the real ``compilecache operator`` starts; ``examples/cache-pytorch.yaml`` and
   ``examples/training-pytorch.yaml`` are applied together (the model sized by ``--width``), so
   the training pod is created before the cache is Ready and waits behind its scheduling gate;
   the cache goes Pending → Warming (``compilecache warm --framework pytorch``) → Expiring →
   Ready, and the pod is released onto the read-only cache, which torch's runtime hook copies
   into the pod's local folder at ``import torch``;
3. a table: cold against warm first step, FX graph and AOTAutograd hits, entries, bytes; and the
   pod's own verdict (``compilecache: N/N graphs hit``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from compilecache.frameworks.pytorch.env import torch_cache_env
from compilecache.local import demo

CACHE_EXAMPLE = "examples/cache-pytorch.yaml"
TRAINING_EXAMPLE = "examples/training-pytorch.yaml"
SCRIPT = "examples/pytorch/train.py"
STEPS = "3"
# What the example's workload and training Job set that changes the compiled graphs or their key:
# the demo's cold process runs with the same, or the comparison is not the same program.
KEY_ENV = ("TORCH_", "OMP_NUM_THREADS")


def sized_examples(repo: Path, width: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cache and the training Job as shipped, the model's width set in both (pure but for reading them).

    The training container runs ``STEPS`` steps and prints one JSON line (``--json``).
    """
    import yaml

    cache = yaml.safe_load((repo / CACHE_EXAMPLE).read_text())
    training = yaml.safe_load((repo / TRAINING_EXAMPLE).read_text())
    container = training["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", SCRIPT, "--steps", STEPS, "--json"]
    envs = [workload.setdefault("env", []) for workload in cache["spec"]["warmup"]["workloads"]]
    for env in [*envs, container.setdefault("env", [])]:
        env[:] = [item for item in env if item["name"] != "TORCH_WIDTH"]
        env.append({"name": "TORCH_WIDTH", "value": str(width)})
    return cache, training


def key_env(training: dict[str, Any]) -> dict[str, str]:
    """The training container's variables that size the model or enter Inductor's key (:data:`KEY_ENV`)."""
    container = training["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if e["name"].startswith(KEY_ENV)}


def run_loop(args: argparse.Namespace, repo: Path, root: Path) -> int:
    """The PyTorch loop on a local cluster under ``root``."""
    from compilecache.local.cluster import LocalCluster

    cache, training = sized_examples(repo, args.width)
    model = key_env(training)
    clock = demo.Clock()
    print("compilecache demo --framework pytorch: the operator's loop for torch.compile caches (local cluster)")
    print("  containers run as local processes in this Python environment; images are ignored\n")
    print(f"1/3 cold: {SCRIPT} with an empty Inductor cache ({', '.join(f'{k}={v}' for k, v in model.items())})")
    with tempfile.TemporaryDirectory(prefix="compilecache-cold-") as empty:
        env = {**clean_env(), **model, **torch_cache_env(empty)}
        cold = demo.run_script(repo, [SCRIPT, "--steps", STEPS, "--json"], env)
    print(f"    first step {cold['first_step_seconds']:.2f}s\n")

    with LocalCluster(root, workdir=repo) as cluster:
        print(f"2/3 local cluster at {cluster.client.url}")
        outcome = demo.apply_and_wait(cluster, cache, training, clock, f"{CACHE_EXAMPLE}, {TRAINING_EXAMPLE}")
    if outcome is None:
        return 1
    status, log = outcome
    warm = train_result(log)
    cached = status.get("cache") or {}
    print(f"\n3/3 cold against warm (the pod, on the cache the operator warmed), total {clock.now():.0f}s")
    print(format_table(cold, warm, {"entries": cached.get("entries", 0), "bytes": cached.get("bytes", 0)}))
    verdicts = [line for line in log.splitlines() if line.startswith("compilecache: ") and "graphs hit" in line]
    if verdicts:  # printed by the pod itself (torch's runtime hook), no code change in the script
        print(f"the training pod's own verdict: {verdicts[-1]}")
    return 0 if warm["fxgraph_misses"] == 0 and warm["fxgraph_hits"] > 0 else 1


def format_table(cold: dict[str, Any], warm: dict[str, Any], cache: dict[str, Any]) -> str:
    """The PyTorch demo's result table (pure: for tests and docs/pytorch.md)."""
    speedup = cold["first_step_seconds"] / max(warm["first_step_seconds"], 1e-9)

    def graphs(result: dict[str, Any], kind: str) -> str:
        hits = result[f"{kind}_hits"]
        return f"{hits}/{hits + result[f'{kind}_misses']}"

    rows = [
        ("", "cold (empty cache)", "training pod (warmed cache)"),
        ("first step seconds", f"{cold['first_step_seconds']:.2f}", f"{warm['first_step_seconds']:.2f}"),
        ("FX graph hits/lookups", graphs(cold, "fxgraph"), graphs(warm, "fxgraph")),
        ("AOTAutograd hits/lookups", graphs(cold, "autograd"), graphs(warm, "autograd")),
        ("speedup (first step)", "", f"{speedup:.1f}x"),
        ("cache entries, bytes", "", f"{cache['entries']}, {cache['bytes']:,}"),
    ]
    return demo.table(rows)


def clean_env() -> dict[str, str]:
    """This environment without any cache setting of ours or torch's: the cold process starts from nothing."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("COMPILECACHE_", "TORCHINDUCTOR_", "JAX_"))}


def train_result(output: str) -> dict[str, Any]:
    """What ``examples/pytorch/train.py --json`` printed: its last JSON line (a pod's log mixes in stderr)."""
    return demo.train_result(output, SCRIPT)
