"""Issue 32, item 1, end to end: the real operator on a local cluster with the Kueue stand-in
(``local/kueue.py``: Kueue's Job integration, a ClusterQueue's quota, admission by priority then time).

A cache whose warm-ups join a LocalQueue without the GPU quota they need: its Jobs are created
suspended, no pod runs, the pool is ``Queued`` with Kueue's own message; once the ClusterQueue has the
quota, Kueue admits them, and the cache becomes Ready through the real warm-up and expiry (the expiry Job
in its own CPU queue).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from compilecache.local import kueue
from compilecache.local.cluster import LocalCluster, run_operator
from test_e2e import (
    CC,
    JOBS,
    NAMESPACE_LABELS,
    NS,
    ROOT,
    Setup,
    example,
    pods_of,
    rendered_webhooks,
    status_of,
    wait_phase,
)
from test_examples import EXAMPLE_POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]

GPU = "nvidia.com/gpu"


def cluster_queue(name: str, gpus: str) -> dict[str, Any]:
    """A ClusterQueue of one flavor with plenty of CPU and memory, and ``gpus`` GPUs."""
    quotas = {"cpu": "256", "memory": "2Ti", GPU: gpus}
    resources = [{"name": key, "nominalQuota": value} for key, value in quotas.items()]
    group = {"coveredResources": list(quotas), "flavors": [{"name": "default-flavor", "resources": resources}]}
    return {"metadata": {"name": name}, "spec": {"resourceGroups": [group]}}


@pytest.fixture(scope="module")
def queued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    webhooks = rendered_webhooks(tmp_path_factory.mktemp("chart"))
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            LocalCluster(tmp_path_factory.mktemp("kueue"), workdir=ROOT, namespaces={NS: NAMESPACE_LABELS})
        )
        client = cluster.client
        client.create(kueue.CLUSTER_QUEUES, cluster_queue("gpus", "0"))  # no GPU quota yet
        client.create(kueue.CLUSTER_QUEUES, cluster_queue("cpus", "0"))
        client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "gpu-queue"}, "spec": {"clusterQueue": "gpus"}}, NS)
        client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "cpu-queue"}, "spec": {"clusterQueue": "cpus"}}, NS)
        operator = stack.enter_context(
            run_operator(cluster, webhooks=webhooks, resync_seconds=0.5, policy=EXAMPLE_POLICIES["cache-gcs.yaml"])
        )
        yield Setup(cluster, operator, None)
        output = operator.output()
    assert "Traceback" not in output, output[-5000:]


def test_warm_ups_wait_in_their_queue_say_why_and_warm_once_kueue_admits_them(queued: Setup) -> None:
    client = queued.cluster.client
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = "in-queue"
    cache["spec"]["storage"]["pvc"]["claimName"] = "in-queue-cache"
    cache["spec"]["warmup"]["queue"] = {"name": "gpu-queue", "expiryName": "cpu-queue"}
    client.create(CC, cache, NS)
    jobs = client.wait_for(lambda: client.list(JOBS, NS, label_selector="compilecache.dev/cache=in-queue"))
    assert all(job["spec"]["suspend"] is True for job in jobs)
    deadline = time.monotonic() + 60
    while not (pools := status_of(queued, "in-queue").get("pools")) or any(
        "couldn't assign flavors" not in p.get("message", "") for p in pools
    ):
        assert time.monotonic() < deadline, [p.get("message") for p in pools or []]
        time.sleep(0.1)
    for pool in pools:
        assert (pool["state"], pool["reason"]) == ("Pending", "Queued"), pool
        assert pool["message"].startswith("queued in LocalQueue gpu-queue: couldn't assign flavors"), pool
    assert "(Queued)" in status_of(queued, "in-queue")["message"]
    assert all(pods_of(queued, job["metadata"]["name"]) == [] for job in jobs)  # nothing runs before admission
    # The ClusterQueue gets its quota: Kueue admits the Jobs, and the warm-up is what it always was.
    client.patch(kueue.CLUSTER_QUEUES, "gpus", cluster_queue("gpus", "64"))
    status = wait_phase(queued, "in-queue", ("Ready", "Failed", "Degraded"), timeout=240)
    assert status["phase"] == "Ready", status
    assert {p["state"] for p in status["pools"]} == {"Succeeded"}
    [expiry] = client.list(JOBS, NS, label_selector="compilecache.dev/expiry-of=in-queue")
    assert expiry["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "cpu-queue"
    workloads = client.list(kueue.WORKLOADS, NS)
    mine = {(w["metadata"].get("labels") or {}).get(kueue.JOB_UID_LABEL) for w in workloads}
    assert {job["metadata"]["uid"] for job in jobs} <= mine
