"""Issue 31 end to end: the real operator on a local cluster whose GPU pools start with no node, scaled by
the local autoscaler (``local/autoscaler.py``, Cluster Autoscaler's behaviour: a pending, ungated pod that a
pool's template node takes makes that pool grow; a pool told to ``refuse`` answers ``NotTriggerScaleUp``),
and a node reclaimed mid warm-up (``reclaimAfterSeconds``: the kubelet's graceful shutdown of a spot node).

- zero nodes → the warm-up's pod brings one up → Ready → the gated training pod runs there and hits;
- scale-up refused → the pool fails naming the autoscaler's reason at ``capacityTimeout``, and the gated
  training pod is released then (``CacheFailed``), not at its ``gateTimeout``;
- the warm-up's node reclaimed mid-run → the Job retries the pod (podFailurePolicy) → Ready, the
  disruption counted, ``backoffLimit: 0`` untouched;
- capacity on request: a ProvisioningRequest, the Job suspended until it is Provisioned, its node
  reclaimed mid-run and asked for again → Ready; a request the autoscaler cannot serve → the pool fails
  at ``capacityTimeout`` with the request's conditions.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from compilecache.local.cluster import LocalCluster, run_operator
from compilecache.local.demo import from_zero
from compilecache.local.nodes import DEFAULT_POOLS, NodePool
from test_e2e import (
    CC,
    GATE,
    JOBS,
    NAMESPACE_LABELS,
    NS,
    ROOT,
    Setup,
    example,
    pods_of,
    rendered_webhooks,
    status_of,
    training_result,
    wait_phase,
    wait_pod,
)
from test_examples import EXAMPLE_POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
A100 = "NVIDIA-A100-SXM4-40GB"
T4 = "Tesla-T4"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
REFUSAL = "quota exceeded for nvidia-l4 in us-central1"
POOLS = (
    NodePool("h100", H100, count=0, gpus=8, max_count=1, scale_up_seconds=1.0),
    NodePool("l4", L4, count=0, gpus=1, max_count=1, refuse=REFUSAL),
    NodePool("a100", A100, count=0, gpus=8, max_count=2, scale_up_seconds=0.5, reclaim_after_seconds=2.0),
    # Asked for through ProvisioningRequests (the local cluster answers them as Cluster Autoscaler does).
    NodePool("t4", T4, count=0, gpus=4, max_count=2, scale_up_seconds=0.5, reclaim_after_seconds=2.0),
    NodePool("cpu", "", count=1, gpus=0),  # the expiry Job needs no GPU
)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """A local cluster with autoscaled GPU pools at zero nodes, the chart's webhooks and a real operator."""
    webhooks = rendered_webhooks(tmp_path_factory.mktemp("chart"))
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            LocalCluster(
                tmp_path_factory.mktemp("scaled"), pools=POOLS, workdir=ROOT, namespaces={NS: NAMESPACE_LABELS}
            )
        )
        operator = stack.enter_context(
            run_operator(cluster, webhooks=webhooks, resync_seconds=0.5, policy=EXAMPLE_POLICIES["cache-gcs.yaml"])
        )
        yield Setup(cluster, operator, None)
        output = operator.output()
    assert "Traceback" not in output, output[-5000:]


def on_pool(name: str, product: str, gpus: int, **warmup: Any) -> dict[str, Any]:
    """The PVC example on one declared pool (its gpusPerPod declared: no node needed to ask for one)."""
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = name
    cache["spec"]["storage"]["pvc"]["claimName"] = f"{name}-cache"
    cache["spec"]["consumers"]["podSelector"] = {"matchLabels": {"app": name}}
    discover = cache["spec"]["warmup"].pop("discover")
    pool = {"name": "gpu", "nodeSelector": {"nvidia.com/gpu.product": product}, "gpusPerPod": gpus}
    cache["spec"]["warmup"]["pools"] = [pool | {"tolerations": discover["tolerations"]}]
    cache["spec"]["warmup"] |= warmup
    return cache


def training_on(cache: dict[str, Any], product: str) -> dict[str, Any]:
    """``examples/training-job.yaml`` for this cache, on the pool's GPU product."""
    job = example("training-job.yaml")
    name = cache["metadata"]["name"]
    job["metadata"]["name"] = f"{name}-train"
    template = job["spec"]["template"]
    template["metadata"]["labels"] |= {"app": name, "compilecache.dev/cache": name}
    template["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return job


def nodes_of(setup: Setup, product: str) -> list[dict[str, Any]]:
    nodes = setup.cluster.client.list("v1/nodes")
    return [n for n in nodes if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.product") == product]


def pool_until(setup: Setup, name: str, check: Any, timeout: float = 60) -> dict[str, Any]:
    """The cache's only pool entry once ``check(entry)`` holds; fail with the status and the operator's log tail."""
    deadline = time.monotonic() + timeout
    while True:
        pools = status_of(setup, name).get("pools") or []
        if pools and check(pools[0]):
            return dict(pools[0])
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: {status_of(setup, name)}\n{setup.operator.output()[-3000:]}")
        time.sleep(0.1)


def test_a_pool_at_zero_nodes_brings_one_up_warms_and_the_gated_training_pod_hits(scaled: Setup) -> None:
    client = scaled.cluster.client
    assert nodes_of(scaled, H100) == []
    cache = on_pool("from-zero", H100, 8)
    client.create(CC, cache, NS)
    training = training_on(cache, H100)
    client.create(JOBS, training, NS)
    first = wait_pod(scaled, training["metadata"]["name"], lambda pod: True, timeout=30)
    assert {"name": GATE} in first["spec"].get("schedulingGates", [])  # held: the cache is not Ready
    # The warm-up's pod waited for a node, and the pool said what the autoscaler said.
    pool_until(scaled, "from-zero", lambda p: p.get("nodes") == 1 or "TriggeredScaleUp" in p.get("message", ""))
    status = wait_phase(scaled, "from-zero", ("Ready", "Failed", "Degraded"), timeout=180)
    assert status["phase"] == "Ready", status
    assert [n["metadata"]["name"] for n in nodes_of(scaled, H100)] == ["h100-0"]
    [warmup] = [
        j
        for j in client.list(JOBS, NS)
        if (j["metadata"].get("labels") or {}).get("compilecache.dev/cache") == "from-zero"
    ]
    [warm_pod] = pods_of(scaled, warmup["metadata"]["name"])
    assert warm_pod["spec"]["nodeName"] == "h100-0"
    events = [
        e
        for e in client.list("v1/events", NS)
        if (e.get("involvedObject") or {}).get("uid") == warm_pod["metadata"]["uid"]
    ]
    assert [e["reason"] for e in events if e["reason"] == "TriggeredScaleUp"] == ["TriggeredScaleUp"]
    pod = wait_pod(
        scaled,
        training["metadata"]["name"],
        lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        timeout=120,
    )
    log = scaled.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    assert pod["metadata"]["annotations"]["compilecache.dev/released"].startswith("CacheReady")
    result = training_result(log)
    assert result["requests"] > 0 and result["hits"] == result["requests"], result


def test_a_refused_scale_up_fails_the_pool_naming_why_and_releases_training_at_the_bound(scaled: Setup) -> None:
    client = scaled.cluster.client
    cache = on_pool("refused", L4, 1, capacityTimeout="20s")
    client.create(CC, cache, NS)
    training = training_on(cache, L4)
    client.create(JOBS, training, NS)
    waiting = pool_until(scaled, "refused", lambda p: p.get("reason") == "NotTriggerScaleUp")
    assert waiting["state"] == "Pending" and REFUSAL in waiting["message"], waiting
    assert status_of(scaled, "refused")["phase"] == "Warming"
    status = wait_phase(scaled, "refused", ("Failed", "Ready", "Degraded"), timeout=90)
    assert status["phase"] == "Failed", status
    [pool] = status["pools"]
    assert (pool["state"], pool["reason"]) == ("Failed", "NotTriggerScaleUp"), pool
    assert REFUSAL in pool["message"] and "capacityTimeout" in pool["message"], pool
    assert nodes_of(scaled, L4) == []
    # The gated training pod is not held past the bound: released as soon as nothing can warm.
    pod = wait_pod(scaled, training["metadata"]["name"], lambda p: not p["spec"].get("schedulingGates"), timeout=30)
    assert pod["metadata"]["annotations"]["compilecache.dev/released"].startswith("CacheFailed"), pod["metadata"]


def test_a_warm_up_whose_node_is_reclaimed_mid_run_is_retried_uncounted_and_the_cache_becomes_ready(
    scaled: Setup,
) -> None:
    client = scaled.cluster.client
    cache = on_pool("reclaimed", A100, 8, backoffLimit=0)
    client.create(CC, cache, NS)
    status = wait_phase(scaled, "reclaimed", ("Ready", "Failed", "Degraded"), timeout=240)
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert pool["state"] == "Succeeded" and pool["disruptions"] == 1, pool
    [job] = [
        j
        for j in client.list(JOBS, NS)
        if (j["metadata"].get("labels") or {}).get("compilecache.dev/cache") == "reclaimed"
    ]
    assert job["spec"]["backoffLimit"] == 0 and not job["status"].get("failed"), job["status"]  # not counted
    pods = pods_of(scaled, job["metadata"]["name"])
    cut = [p for p in pods if any(c.get("type") == "DisruptionTarget" for c in p["status"].get("conditions") or [])]
    assert len(cut) == 1 and cut[0]["status"]["phase"] == "Failed", pods
    assert [p["status"]["phase"] for p in pods if p is not cut[0]] == ["Succeeded"]
    preempted = [e for e in client.list("v1/events", NS) if e.get("reason") == "Preempted"]
    assert any((e.get("involvedObject") or {}).get("name") == "reclaimed" for e in preempted), preempted


def test_the_demo_from_zero_shows_the_pools_come_up_a_preemption_retried_and_every_compile_hit() -> None:
    """``make demo-from-zero`` as shipped: the output a newcomer reads."""
    completed = subprocess.run(
        [sys.executable, "-m", "compilecache.cli", "demo", "--scale-from-zero", "--repo", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    out = completed.stdout
    assert completed.returncode == 0, (out + completed.stderr)[-4000:]
    assert "pool h100: 0 nodes, autoscaled up to 2" in out, out
    assert "WaitingForCapacity: waiting for a node" in out and "TriggeredScaleUp" in out, out
    assert "Preempted: preempted once, retrying (not counted against backoffLimit)" in out, out
    assert "the training pod's own verdict: compilecache: 2/2 compiles hit" in out, out


def test_from_zero_declares_each_gpu_pool_with_its_gpus_and_starts_it_at_no_node() -> None:
    cache = example("cache-pvc.yaml")
    declared, pools = from_zero(cache, DEFAULT_POOLS)
    assert "discover" not in declared["spec"]["warmup"] and "discover" in cache["spec"]["warmup"]  # a copy
    by_product = {p["nodeSelector"]["nvidia.com/gpu.product"]: p for p in declared["spec"]["warmup"]["pools"]}
    for before, after in zip(DEFAULT_POOLS, pools, strict=True):
        if before.gpus == 0:
            assert after == before  # the CPU node stays: the expiry Job runs there
            continue
        assert (after.count, after.max_count) == (0, before.count)
        assert by_product[before.product]["gpusPerPod"] == before.gpus
    assert [p.reclaim_after_seconds is not None for p in pools] == [True, False, False]


def test_a_warm_up_that_asks_for_its_capacity_runs_once_provisioned_and_asks_again_after_a_reclaim(
    scaled: Setup,
) -> None:
    client = scaled.cluster.client
    requests = "autoscaling.x-k8s.io/v1/provisioningrequests"
    cache = on_pool("queued", T4, 4, backoffLimit=0, provisioningRequest={"className": ATOMIC})
    client.create(CC, cache, NS)
    [job] = client.wait_for(lambda: client.list(JOBS, NS, label_selector="compilecache.dev/cache=queued"))
    assert job["spec"]["suspend"] is True  # it waits for its request, not as a pending pod
    status = wait_phase(scaled, "queued", ("Ready", "Failed", "Degraded"), timeout=240)
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert pool["state"] == "Succeeded" and pool["disruptions"] == 1, pool
    job = client.get(JOBS, job["metadata"]["name"], NS)
    assert job["spec"]["suspend"] is False and not job["status"].get("failed"), job
    pods = pods_of(scaled, job["metadata"]["name"])
    nodes = {p["spec"].get("nodeName") for p in pods}
    assert len(pods) == 2 and len(nodes) == 2, pods  # the retry ran on the node asked for again
    # Finished: its request and PodTemplate are gone.
    client.wait_for(lambda: client.list(requests, NS, label_selector="compilecache.dev/cache=queued") == [])
    deadline = time.monotonic() + 30
    while client.get("v1/podtemplates", job["metadata"]["name"], NS) is not None:  # deleted after it
        lines = [line for line in scaled.operator.output().splitlines() if "queued" in line]
        assert time.monotonic() < deadline, "\n".join(lines[-40:])
        time.sleep(0.1)


def test_a_request_the_autoscaler_cannot_serve_fails_the_pool_at_capacity_timeout(scaled: Setup) -> None:
    cache = on_pool("unserved", L4, 1, capacityTimeout="15s", provisioningRequest={"className": ATOMIC})
    scaled.cluster.client.create(CC, cache, NS)
    waiting = pool_until(scaled, "unserved", lambda p: "CapacityIsNotFound" in p.get("message", ""))
    assert (waiting["state"], waiting["reason"]) == ("Pending", "WaitingForCapacity"), waiting
    status = wait_phase(scaled, "unserved", ("Failed", "Ready", "Degraded"), timeout=90)
    [pool] = status["pools"]
    assert (pool["state"], pool["reason"]) == ("Failed", "WaitingForCapacity"), pool
    assert "ProvisioningRequest" in pool["message"] and "capacityTimeout" in pool["message"], pool
