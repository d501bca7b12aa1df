"""A PyTorch CompileCache on the local cluster: the real operator, ``compilecache warm --framework
pytorch`` and ``expire`` in Jobs, and a gated training pod that loads every graph through its local copy.

``examples/cache-pytorch.yaml`` and ``examples/training-pytorch.yaml`` as shipped (the model's
width set alike in both, as ``compilecache demo --framework pytorch`` does), applied together:
the training pod is admitted while the cache warms and waits behind its gate. Needs the PyTorch
warmer (``compilecache warm --framework``) and torch's runtime hook: until they are in the
checkout, every test here skips and says so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.frameworks.pytorch import demo as torchdemo
from compilecache.local.cluster import LocalCluster, run_operator
from test_e2e import (
    CC,
    GATE,
    JOBS,
    NAMESPACE_LABELS,
    NS,
    Setup,
    finished_jobs,
    pods_of,
    rendered_webhooks,
    status_of,
    wait_phase,
    wait_pod,
)
from torchhelpers import ROOT, torch_warmer_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.timeout(900)]

FINISHED = ("Succeeded", "Failed")


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The examples applied together on a fresh local cluster; what the loop left, once the pod finished."""
    pytest.importorskip("torch", reason="the `torch` extra is not installed (make test installs torch==2.13.0)")
    torch_warmer_or_skip()
    webhooks = rendered_webhooks(tmp_path_factory.mktemp("chart"))
    cache, training = torchdemo.sized_examples(ROOT, 32)
    name, job = cache["metadata"]["name"], training["metadata"]["name"]
    root = tmp_path_factory.mktemp("local-cluster")
    with (
        LocalCluster(root, workdir=ROOT, namespaces={NS: NAMESPACE_LABELS}) as cluster,
        run_operator(cluster, webhooks=webhooks, resync_seconds=0.5) as operator,
    ):
        setup = Setup(cluster, operator, None)
        cluster.client.create(CC, cache, NS)
        cluster.client.create(JOBS, training, NS)
        first = wait_pod(setup, job, lambda pod: True, timeout=60)
        status = wait_phase(setup, name, ("Ready", "Failed", "Degraded"), timeout=600)
        pod = wait_pod(setup, job, lambda p: (p.get("status") or {}).get("phase") in FINISHED, timeout=400)
        consumers = cluster.client.wait_for(
            lambda: (status_of(setup, name).get("consumers") or {}).get("requests") and status_of(setup, name),
            timeout=60,
        )
        yield {
            "setup": setup,
            "cache": cache,
            "status": status,
            "first": first,
            "pod": pod,
            "log": cluster.logs(NS, pod["metadata"]["name"], "train"),
            "consumers": consumers["consumers"],
            "claim": sorted(p.name for p in cluster.claim_dir(NS, "torch-mlp-cache").rglob("*") if p.is_file()),
        }
        output = operator.output()
    assert "Traceback" not in output, output[-5000:]


def test_the_pytorch_cache_warms_expires_and_turns_ready(loop: dict[str, Any]) -> None:
    status, setup = loop["status"], loop["setup"]
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert pool["state"] == "Succeeded" and pool["entries"] >= 1 and pool["bytes"] > 0, pool
    assert status["cache"]["entries"] >= 1 and status["cache"]["bytes"] > 0, status["cache"]
    assert loop["claim"], "nothing was published on the claim"
    [warmup] = finished_jobs(setup, "compilecache.dev/cache=torch-mlp")
    container = warmup["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:4] == ["compilecache", "warm", "--framework", "pytorch"]
    assert not [e["name"] for e in container["env"] if e["name"].startswith(("JAX_", "XLA_"))]
    [expiry] = finished_jobs(setup, "compilecache.dev/expiry-of=torch-mlp")
    assert expiry["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "compilecache", "expire", "--framework", "pytorch",
    ]  # fmt: skip
    [expiry_pod] = pods_of(setup, expiry["metadata"]["name"])
    assert expiry_pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_the_training_pod_waits_then_hits_every_graph_through_its_local_copy(loop: dict[str, Any]) -> None:
    first, pod, log = loop["first"], loop["pod"], loop["log"]
    # Admitted while the cache warmed: gated, the cache read-only, an emptyDir for the local copy.
    assert {"name": GATE} in first["spec"].get("schedulingGates", []), first["spec"]
    mounts = {m["name"]: m for m in first["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["compilecache"]["readOnly"] is True
    assert mounts["compilecache-local"]["mountPath"] == "/var/tmp/compilecache-torch"
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    assert "compilecache.dev/released" in pod["metadata"]["annotations"]
    result = torchdemo.train_result(log)
    # Inductor worked in the pod's own emptyDir (the kubelet's mapping of /var/tmp/compilecache-torch).
    assert pod["metadata"]["name"] in result["cache_dir"] and "/ro/" not in result["cache_dir"], result
    assert result["fxgraph_hits"] > 0 and result["fxgraph_misses"] == 0, result
    assert result["autograd_hits"] > 0 and result["autograd_misses"] == 0, result
    # The pod's own verdict (torch's runtime hook), in its log and its termination message, then the status.
    verdict = re.search(r"^compilecache: (\d+)/(\d+) graphs hit", log, re.MULTILINE)
    assert verdict, log[-2000:]
    report = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert report["schema"] == "compilecache.dev/trainer/v1" and report["hits"] == report["requests"] > 0, report
    assert (int(verdict[1]), int(verdict[2])) == (report["hits"], report["requests"]), verdict[0]
    consumers = loop["consumers"]
    assert (consumers["hits"], consumers["requests"]) == (report["hits"], report["requests"]), consumers


def test_the_pytorch_demo_shows_the_loop(tmp_path: Path) -> None:
    """``compilecache demo --framework pytorch`` as a user runs it: phases, the released pod, cold against warm."""
    pytest.importorskip("torch", reason="the `torch` extra is not installed (make test installs torch==2.13.0)")
    torch_warmer_or_skip()
    done = subprocess.run(
        [sys.executable, "-m", "compilecache.cli", "demo", "--framework", "pytorch", "--width", "32"],
        cwd=ROOT,
        env=torchdemo.clean_env() | {"HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    out = done.stdout
    for phase in ("Warming", "Ready", "SchedulingGated", "released"):
        assert phase in out, out
    assert "FX graph hits/lookups" in out and "speedup (first step)" in out, out
    assert "the training pod's own verdict: compilecache: " in out, out
