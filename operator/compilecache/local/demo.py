"""``compilecache demo`` (``make demo``): the whole loop on a local cluster, with its figures.

By default, on the local cluster (``compilecache.local``: an API server, two simulated GPU
pools, a Job runner that runs each container's real command as a local process, admission
through the operator's webhook):

1. a cold training process on no cache, for the comparison;
2. the real ``compilecache operator`` starts; ``examples/cache-pvc.yaml`` (its lifecycle as
   shipped, the model sized by ``--layers``) and ``examples/training-job.yaml`` are applied
   together, so the training pod is created before the cache is Ready;
3. the phases and the pod's state are printed as they happen, with times: the cache goes
   Pending → Warming (the real ``compilecache warm`` in one Job per pool) → Expiring (the real
   ``compilecache expire``) → Ready; the training pod waits behind its scheduling gate, is
   released at Ready and runs on the read-only cache;
4. a table: cold against warm first step, compile/load seconds, hits/requests, entries, bytes.

``--framework pytorch`` runs the same loop for a PyTorch cache (the framework's ``demo``,
:mod:`compilecache.frameworks`).

``--scale-from-zero`` (``make demo-from-zero``) starts the GPU pools with no node (:func:`from_zero`):
each pool's warm-up pod waits for a node, the local autoscaler adds one, and the first node is
reclaimed mid-run, so the warm-up is seen retried without counting against its ``backoffLimit``.

``--warmer-only`` keeps the earlier demo: three processes, no cluster — a cold training
start, ``compilecache warm`` into ``--cache-dir`` (default ``./demo-cache``, recreated each
run) and a fresh training process on it. A ``--cache-dir`` or ``--keep`` folder the demo did
not make (no ``.compilecache-demo`` marker in it) is never emptied unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compilecache import frameworks

NAMESPACE = "default"
CACHES = "compilecache.dev/v1alpha1/compilecaches"
# In a folder the demo made: only such a folder is emptied on the next run (without --force).
DEMO_MARKER = ".compilecache-demo"
TIMEOUT = 300.0  # seconds for the whole loop before the demo gives up


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``compilecache demo``."""
    parser.add_argument(
        "--warmer-only", action="store_true", help="no cluster: cold run, `compilecache warm`, warm run"
    )
    parser.add_argument(
        "--cache-dir",
        default="demo-cache",
        help="--warmer-only: a folder the demo makes and recreates each run (./demo-cache); "
        "one it did not make is never replaced without --force",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace a --cache-dir or --keep folder the demo did not make"
    )
    parser.add_argument(
        "--framework",
        choices=frameworks.names(),
        default=frameworks.DEFAULT,
        help="whose cache: jax (examples/cache-pvc.yaml) or pytorch (examples/cache-pytorch.yaml)",
    )
    parser.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    parser.add_argument("--width", type=int, default=64, help="model width (default 64; pytorch: TORCH_WIDTH)")
    parser.add_argument(
        "--devices", type=int, default=0, help="shard data-parallel over N host devices (default: unsharded)"
    )
    parser.add_argument(
        "--nodes",
        default=None,
        help="simulated GPU nodes: a YAML file {pools: [{name, product, count, gpus}]} (N hosts need count >= N)",
    )
    parser.add_argument(
        "--scale-from-zero",
        action="store_true",
        help="GPU pools start with no node: the local autoscaler adds one for each pool's warm-up, and "
        "reclaims the first mid-run (a spot node lost: the warm-up is retried, uncounted)",
    )
    parser.add_argument("--keep", default=None, help="keep the local cluster's files in this directory")
    parser.add_argument("--repo", default=None, help="repository root holding examples/ (default: found)")


def run(args: argparse.Namespace) -> int:
    """Run the demo; return non-zero with a one-line error if any step fails."""
    framework = frameworks.get(args.framework)
    if args.warmer_only:
        if framework.warmer_only_demo is None:
            offered = frameworks.get(frameworks.DEFAULT).title
            print(
                f"compilecache demo: error: --warmer-only is the {offered} demo's; leave out --framework",
                file=sys.stderr,
            )
            return 2
        return framework.warmer_only_demo(args)
    demo = framework.demo
    if demo is None:
        print(f"compilecache demo: error: --framework {framework.name} has no demo", file=sys.stderr)
        return 2
    try:
        repo = repo_root(args.repo)
    except ValueError as error:
        print(f"compilecache demo: error: {error}", file=sys.stderr)
        return 2
    try:
        import compilecache.local.cluster  # noqa: F401  (the optional extra)
    except ImportError as error:
        print(
            f"compilecache demo: error: the local cluster needs the `local` extra "
            f"(pip install 'compilecache-operator[local]'): {error}",
            file=sys.stderr,
        )
        return 2
    if args.keep:
        try:
            root = fresh_dir(Path(args.keep), "--keep", args.force)
        except ValueError as error:
            print(f"compilecache demo: error: {error}", file=sys.stderr)
            return 2
        return demo(args, repo, root)
    with tempfile.TemporaryDirectory(prefix="compilecache-demo-") as folder:
        return demo(args, repo, Path(folder))


def apply_and_wait(
    cluster: Any, cache: dict[str, Any], training: dict[str, Any], clock: Clock, applied: str
) -> tuple[dict[str, Any], str] | None:
    """Run the operator, apply the cache and the training Job, wait for the training pod to finish.

    Returns the cache's status and the pod's log, or ``None`` after saying on stderr why the loop
    did not end in a Ready cache and a succeeded pod (both demos share this part).
    """
    from compilecache.local.cluster import run_operator

    name, job = cache["metadata"]["name"], training["metadata"]["name"]
    with run_operator(cluster) as operator:
        print(f"    compilecache operator (pid {operator.process.pid}), webhook {operator.url}")
        print(f"    apply {applied}")
        clock.start()
        cluster.client.create(CACHES, cache, NAMESPACE)
        cluster.client.create("batch/v1/jobs", training, NAMESPACE)
        pod = _watch(cluster, name, job, clock)
        if pod is None:
            print(f"compilecache demo: error: the loop did not finish; operator log: {operator.log}", file=sys.stderr)
            return None
        status: dict[str, Any] = (cluster.client.get(CACHES, name, NAMESPACE) or {}).get("status") or {}
        log = cluster.logs(NAMESPACE, pod["metadata"]["name"], "train") if pod["metadata"]["name"] else ""
    if status.get("phase") != "Ready" or pod["status"]["phase"] != "Succeeded":
        print(f"compilecache demo: error: cache {status.get('phase')}: {status.get('message')}", file=sys.stderr)
        print(log[-2000:], file=sys.stderr)
        return None
    return status, log


def from_zero(cache: dict[str, Any], pools: Sequence[Any]) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """``--scale-from-zero`` (pure): the GPU pools at no node, autoscaled up to their size, the first one
    reclaimed once mid-run; the cache's discovery replaced by those pools declared with their GPUs (a pool
    with no node can ask for one only with its GPU count, which the cache key holds)."""
    import dataclasses

    from compilecache.controller.pools import pool_name

    gpu = [pool for pool in pools if pool.gpus > 0]
    scaled = tuple(
        dataclasses.replace(
            pool,
            count=0,
            max_count=pool.count,
            scale_up_seconds=2.0,
            reclaim_after_seconds=3.0 if pool is gpu[0] else None,
        )
        if pool.gpus > 0
        else pool
        for pool in pools
    )
    warmup = dict(cache["spec"]["warmup"])
    discover = warmup.pop("discover", None) or {}
    warmup["pools"] = [
        {
            "name": pool_name(pool.product),
            "nodeSelector": {"nvidia.com/gpu.product": pool.product},
            "gpusPerPod": pool.gpus,
            **({"tolerations": discover["tolerations"]} if discover.get("tolerations") else {}),
        }
        for pool in gpu
    ]
    return {**cache, "spec": {**cache["spec"], "warmup": warmup}}, scaled


def run_script(repo: Path, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run an example training script (``argv``, relative to ``repo``) in a fresh process; its JSON result."""
    completed = subprocess.run(
        [sys.executable, str(repo / argv[0]), *argv[1:]], cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise SystemExit(f"compilecache demo: error: training failed: {completed.stderr.strip()[-500:]}")
    return train_result(completed.stdout, argv[0])


class Clock:
    """Seconds since the loop's start (the operator's start), for the lines the demo prints."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def start(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start


def _watch(cluster: Any, name: str, job: str, clock: Clock) -> dict[str, Any] | None:
    """Print the cache's phases and the training pod's states as they change; the finished pod, or None."""
    client = cluster.client
    seen: dict[str, str] = {}

    def show(key: str, text: str) -> None:
        if seen.get(key) != text:
            seen[key] = text
            print(f"    {clock.now():6.1f}s  {text}", flush=True)

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        status = (client.get(CACHES, name, NAMESPACE) or {}).get("status") or {}
        phase = status.get("phase") or "(no status yet)"
        show("cache", f"CompileCache {name}: {phase:<9} {status.get('message', '')}".rstrip())
        for pool in status.get("pools") or []:  # what a pool waits for: a node, a retry after a preemption
            if pool.get("reason") in ("WaitingForCapacity", "NotTriggerScaleUp", "Preempted"):
                show(
                    f"pool {pool.get('name')}", f"pool {pool.get('name')}: {pool['reason']}: {pool.get('message', '')}"
                )
        nodes = sorted(node["metadata"]["name"] for node in client.list("v1/nodes"))
        show("nodes", f"nodes: {', '.join(nodes)}")
        for pod in client.list("v1/pods", NAMESPACE, label_selector=f"job-name={job}"):
            show("pod", f"pod {pod['metadata']['name']}: {_pod_state(pod)}")
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and phase in ("Ready", "Failed"):
                return pod
        if phase == "Failed":
            return {"metadata": {"name": ""}, "status": {"phase": "Failed"}}
        time.sleep(0.05)  # a display refresh, not a synchronisation
    return None


def _pod_state(pod: dict[str, Any]) -> str:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("schedulingGates"):
        gates = ", ".join(gate["name"] for gate in spec["schedulingGates"])
        return f"SchedulingGated ({gates})"
    released = ((pod.get("metadata") or {}).get("annotations") or {}).get("compilecache.dev/released", "")
    phase = status.get("phase") or "Pending"
    node = f" on {spec['nodeName']}" if spec.get("nodeName") else ""
    return f"{phase}{node}" + (f" (released: {released})" if released else "")


def table(rows: Sequence[tuple[str, str, str]]) -> str:
    """A demo's result table (pure): the first row a header underlined, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def train_result(output: str, script: str = "examples/train.py") -> dict[str, Any]:
    """What an example's ``--json`` printed: its last JSON line.

    A pod's log mixes in stderr, where the trainer's own verdict (``compilecache: H/R compiles
    hit``, from the package's runtime hook) comes after it.
    """
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"compilecache demo: error: no result from {script} in: {output[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def repo_root(given: str | None) -> Path:
    candidates = [Path(given)] if given else [Path.cwd(), Path(__file__).resolve().parents[3]]
    for candidate in candidates:
        if (candidate / "examples" / "workloads" / "transformer.py").is_file():
            return candidate.resolve()
    raise ValueError("cannot find examples/workloads/transformer.py: run from the repository root")


def fresh_dir(path: Path, flag: str, force: bool) -> Path:
    """An empty folder at ``path``: made here (one level), or emptied if an earlier demo made it.

    Never deletes what the demo did not make (a cache, a user's folder) unless ``force``: the
    marker file says who made it. The parent must exist, as for ``compilecache warm``.
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file; pick a folder")
    if path.is_dir() and any(path.iterdir()):
        if not (path / DEMO_MARKER).is_file() and not force:
            raise ValueError(
                f"{flag} {path} exists and was not made by the demo; pick another {flag}, "
                "or give --force to delete what it holds"
            )
        shutil.rmtree(path)
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {path}: its parent {path.parent} does not exist; create it first")
    path.mkdir(exist_ok=True)
    (path / DEMO_MARKER).write_text("made by `compilecache demo`: it deletes this folder on its next run\n")
    return path.resolve()
