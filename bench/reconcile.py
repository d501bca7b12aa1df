"""Reconcile latency and memory of the real operator, against a bare kopf operator.

Runs each operator as a subprocess against the Kubernetes API emulator (over real
HTTP), creates CompileCaches on a cluster of N GPU products, and measures:

- latency: CompileCache created → all its warm-up Jobs created (ours, polled every 50 ms)
  vs. the API floor: the same calls (read the cache, create its claim and each Job, patch the
  status; a pass reads the rest from memory) made directly in sequence, with no operator at all. The
  emulator's own cost per request dominates both and grows with the objects it holds;
- memory: peak RSS (VmHWM) of the operator process vs. a bare kopf operator that only
  acknowledges each cache (bench/baseline_operator.py).

Usage: .venv/bin/python bench/reconcile.py [--products 2 8 32] [--caches 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import KubeClient, running_emulator  # noqa: E402
from scale import peak_rss_mib  # noqa: E402  (bench/, this script's folder)
from specs import cache_spec, node  # noqa: E402

CC = "compilecache.dev/v1alpha1/compilecaches"


def _nodes(products: int) -> list[dict[str, Any]]:
    return [node(f"n{p}-{i}", f"GPU-PRODUCT-{p}", 8) for p in range(products) for i in range(2)]


def _spec(name: str) -> dict[str, Any]:
    """A cache's spec with a claim of its own: a claim made for another cache is not this one's to mount."""
    return cache_spec(storage={"pvc": {"claimName": name, "create": {"size": "1Gi"}}})


def _run(command: list[str], products: int, caches: int, done: Any) -> tuple[list[float], float]:
    """Start an operator, create caches one by one, return per-cache latencies and peak RSS."""
    with tempfile.TemporaryDirectory() as tmp, running_emulator(Path(tmp)) as runner:
        kube = KubeClient(runner)
        for item in _nodes(products):
            kube.create("v1/nodes", item)
        env = {**os.environ, "KUBECONFIG": str(runner.kubeconfig), "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            # Warm-up: the first cache pays for imports and the first watch; not measured.
            kube.create(CC, {"metadata": {"name": "warmup"}, "spec": _spec("warmup")}, "default")
            kube.wait_for(lambda: done(kube, "warmup", products), timeout=60, interval=0.05)
            latencies = []
            for index in range(caches):
                name = f"cache-{index}"
                started = time.perf_counter()
                kube.create(CC, {"metadata": {"name": name}, "spec": _spec(name)}, "default")
                kube.wait_for(lambda name=name: done(kube, name, products), timeout=60, interval=0.05)
                latencies.append(time.perf_counter() - started)
            rss = peak_rss_mib(process.pid)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    return latencies, rss


def _api_floor(products: int, caches: int) -> list[float]:
    """The same API calls as one reconciliation, made directly: no watch, no kopf, no operator."""
    from compilecache.controller.api import parse_spec
    from compilecache.controller.jobs import claim, warmup_job
    from compilecache.controller.pools import resolve_pools

    with tempfile.TemporaryDirectory() as tmp, running_emulator(Path(tmp)) as runner:
        kube = KubeClient(runner)
        for item in _nodes(products):
            kube.create("v1/nodes", item)
        durations = []
        for index in range(caches):
            name = f"cache-{index}"
            kube.create(CC, {"metadata": {"name": name}, "spec": _spec(name)}, "default")
            started = time.perf_counter()
            # The one read of a pass that reaches the API (the cache; the rest come from the operator's
            # watch-fed indexes: controller/indexes.py), then its writes (act).
            obj = kube.get(CC, name, "default") or {}
            spec = parse_spec(obj["spec"])
            kube.create("v1/persistentvolumeclaims", claim(obj, spec) or {}, "default")
            pools = resolve_pools(spec, _nodes(products))
            for pool in pools:
                kube.create("batch/v1/jobs", warmup_job(obj, spec, pool), "default")
            kube.patch(CC, name, {"status": {"phase": "Warming"}}, "default", subresource="status")
            durations.append(time.perf_counter() - started)
    return durations


def _jobs_created(kube: KubeClient, name: str, products: int) -> bool:
    return len(kube.list("batch/v1/jobs", "default", f"compilecache.dev/cache={name}")) == products


def _acknowledged(kube: KubeClient, name: str, products: int) -> bool:
    return bool(((kube.get(CC, name, "default") or {}).get("status") or {}).get("phase"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--caches", type=int, default=5)
    args = parser.parse_args()

    ours = [sys.executable, "-m", "compilecache.cli", "operator", "--standalone", "-A", "-q"]
    bare = [sys.executable, "-m", "kopf", "run", "--standalone", "-A", "-q", str(ROOT / "bench/baseline_operator.py")]
    header = ["GPU products", "ours p50 ms", "API floor ms", "ratio", "ours MiB", "bare kopf MiB", "ratio"]
    print(" ".join(f"{h:>13}" for h in header))
    for products in args.products:
        ours_lat, ours_rss = _run(ours, products, args.caches, _jobs_created)
        floor_ms = statistics.median(_api_floor(products, args.caches)) * 1000
        _, kopf_rss = _run(bare, products, 1, _acknowledged)
        ours_ms = statistics.median(ours_lat) * 1000
        row = [products, f"{ours_ms:.0f}", f"{floor_ms:.0f}", f"{ours_ms / floor_ms:.2f}"]
        row += [f"{ours_rss:.1f}", f"{kopf_rss:.1f}", f"{ours_rss / kopf_rss:.2f}"]
        print(" ".join(f"{v:>13}" for v in row))


if __name__ == "__main__":
    main()
