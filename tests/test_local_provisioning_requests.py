"""The local cluster answers ProvisioningRequests as Cluster Autoscaler does (no operator).

PodTemplates, ProvisioningRequests and a Job that consumes one are created through the client, as the
operator (or Kueue) would; ``python -c`` containers stand in for warm-ups.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.local.cluster import LocalCluster
from compilecache.local.nodes import NodePool

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

NS = "default"
JOBS, PODS, NODES, EVENTS = "batch/v1/jobs", "v1/pods", "v1/nodes", "v1/events"
TEMPLATES, REQUESTS = "v1/podtemplates", "autoscaling.x-k8s.io/v1/provisioningrequests"
ATOMIC, CHECK = "best-effort-atomic-scale-up.autoscaling.x-k8s.io", "check-capacity.autoscaling.x-k8s.io"
CONSUME, CLASS = "autoscaling.x-k8s.io/consume-provisioning-request", "autoscaling.x-k8s.io/provisioning-class-name"
GROUP = "compilecache.dev/warmup-job"
REFUSAL = "in backoff after failed scale-up"
POOLS = (
    NodePool("l4", "NVIDIA-L4", count=0, gpus=1, max_count=2, scale_up_seconds=0.5),  # scales from zero
    NodePool("a100", "NVIDIA-A100", count=0, gpus=8, max_count=2, refuse=REFUSAL),
    NodePool("h100", "NVIDIA-H100", count=1, gpus=8),  # fixed: one node
    NodePool("b200", "NVIDIA-B200", count=0, gpus=8, max_count=1, scale_up_seconds=0.2),
    NodePool("cpu", "", count=1, gpus=0),
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("provisioning")
    with LocalCluster(root, workdir=root, pools=POOLS) as running:
        yield running


def pod_spec(product: str, group: str, code: str = "print('warm')") -> dict[str, Any]:
    """A warm-up pod for ``product`` whose pods of ``group`` repel one another (one per node), as a multi-host
    warm-up's; its container has its node's name in ``NODE``."""
    node = {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    term = {"labelSelector": {"matchLabels": {GROUP: group}}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "restartPolicy": "Never",
        "nodeSelector": {"nvidia.com/gpu.product": product},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
        "containers": [{"name": "warm", "image": "ignored:1", "command": [sys.executable, "-c", code], "env": [node]}],
    }


def ask(cluster: LocalCluster, name: str, product: str, class_name: str, count: int, **parameters: str) -> None:
    """A PodTemplate and a ProvisioningRequest ``name`` for ``count`` pods of ``product``, as the operator would."""
    template = {"metadata": {"labels": {GROUP: name}}, "spec": pod_spec(product, name)}
    cluster.client.create(TEMPLATES, {"metadata": {"name": name}, "template": template}, NS)
    spec: dict[str, Any] = {
        "provisioningClassName": class_name,
        "podSets": [{"podTemplateRef": {"name": name}, "count": count}],
    }
    if parameters:
        spec["parameters"] = parameters
    cluster.client.create(REQUESTS, {"metadata": {"name": name}, "spec": spec}, NS)


def answer(cluster: LocalCluster, name: str, *types: str, timeout: float = 30) -> dict[str, dict[str, Any]]:
    """The request's conditions by type, once it has all of ``types``."""

    def conditions() -> dict[str, dict[str, Any]] | None:
        request = cluster.client.get(REQUESTS, name, NS) or {}
        found = {c["type"]: c for c in (request.get("status") or {}).get("conditions") or []}
        return found if set(types) <= set(found) else None

    result: dict[str, dict[str, Any]] = cluster.client.wait_for(conditions, timeout=timeout)
    return result


def said(condition: dict[str, Any]) -> tuple[str, str, str]:
    return condition["status"], condition["reason"], condition["message"]


def node_names(cluster: LocalCluster, pool: str) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.client.list(NODES) if n["metadata"]["name"].startswith(f"{pool}-")}


def events_of(cluster: LocalCluster, pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in cluster.client.list(EVENTS, NS) if e["involvedObject"].get("uid") == pod["metadata"]["uid"]]


def consuming_job(name: str, product: str, hosts: int, class_name: str) -> dict[str, Any]:
    """A suspended Indexed Job of ``hosts`` pods that consume the request ``name``, as the operator makes it."""
    annotations = {CONSUME: name, CLASS: class_name}
    template = {"metadata": {"labels": {GROUP: name}, "annotations": annotations}, "spec": pod_spec(product, name)}
    spec = {
        "suspend": True,
        "completionMode": "Indexed",
        "completions": hosts,
        "parallelism": hosts,
        "backoffLimit": 0,
        "template": template,
    }
    return {"metadata": {"name": name}, "spec": spec}


def test_an_atomic_request_brings_up_every_node_then_is_provisioned_and_its_pods_land_there(
    cluster: LocalCluster,
) -> None:
    assert node_names(cluster, "l4") == set()
    ask(cluster, "gang", "NVIDIA-L4", ATOMIC, 2)
    conditions = answer(cluster, "gang", "Accepted", "Provisioned")
    assert said(conditions["Accepted"]) == ("True", "Accepted", "ProvisioningRequest is accepted by ClusterAutoscaler")
    assert said(conditions["Provisioned"]) == ("True", "CapacityIsProvisioned", "Capacity is found in the cluster")
    assert conditions["Provisioned"]["observedGeneration"] == 1
    assert node_names(cluster, "l4") == {"l4-0", "l4-1"}  # both, before Provisioned
    # The Job that consumes it, unsuspended as the operator does once it is provisioned, runs there.
    cluster.client.create(JOBS, consuming_job("gang", "NVIDIA-L4", 2, ATOMIC), NS)
    cluster.client.patch(JOBS, "gang", {"spec": {"suspend": False}}, NS)

    def done() -> dict[str, Any] | None:
        job = cluster.client.get(JOBS, "gang", NS) or {}
        return job if (job.get("status") or {}).get("succeeded") == 2 else None

    cluster.client.wait_for(done, timeout=60)
    pods = cluster.client.list(PODS, NS, label_selector="job-name=gang")
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["l4-0", "l4-1"]
    assert node_names(cluster, "l4") == {"l4-0", "l4-1"}  # the autoscaler added nothing for them
    assert not [e for p in pods for e in events_of(cluster, p) if e["reason"] == "TriggeredScaleUp"]


def test_an_atomic_request_on_a_refused_pool_gets_no_node_and_says_why(cluster: LocalCluster) -> None:
    ask(cluster, "refused", "NVIDIA-A100", ATOMIC, 2)
    conditions = answer(cluster, "refused", "Accepted", "Provisioned")
    status, reason, message = said(conditions["Provisioned"])
    assert (status, reason) == ("False", "CapacityIsNotFound")
    # CA's message, then each autoscaled pool's reason (the other pools' nodes would not take the pod).
    assert message.startswith("Capacity is not found, CA will try to find it later. pod didn't trigger scale-up: ")
    assert f"1 {REFUSAL}" in message
    assert "Failed" not in conditions  # CA keeps trying: the operator's capacityTimeout bounds the wait
    assert node_names(cluster, "a100") == set()


def test_check_capacity_answers_from_the_nodes_there_are(cluster: LocalCluster) -> None:
    ask(cluster, "fits", "NVIDIA-H100", CHECK, 1)
    ask(cluster, "full", "NVIDIA-H100", CHECK, 2)  # two pods that repel one another, one node
    ask(cluster, "empty", "NVIDIA-B200", CHECK, 1, noRetry="true")  # a pool at zero is no capacity
    assert said(answer(cluster, "fits", "Provisioned")["Provisioned"]) == (
        "True",
        "CapacityIsFound",
        "Capacity is found in the cluster",
    )
    assert said(answer(cluster, "full", "Provisioned")["Provisioned"]) == (
        "False",
        "CapacityIsNotFound",
        "Capacity is not found, CA will try to find it later.",
    )
    empty = answer(cluster, "empty", "Failed")
    assert said(empty["Failed"]) == ("True", "CapacityIsNotFound", "CA could not find requested capacity")
    assert "Provisioned" not in empty
    assert node_names(cluster, "h100") == {"h100-0"} and node_names(cluster, "b200") == set()


def test_a_request_of_a_class_cluster_autoscaler_does_not_know_is_left_alone(cluster: LocalCluster) -> None:
    ask(cluster, "theirs", "NVIDIA-L4", "example.com/another-provisioner", 1)
    ask(cluster, "known", "NVIDIA-H100", CHECK, 1)  # answered in the same pass that sees the other
    answer(cluster, "known", "Provisioned")
    assert (cluster.client.get(REQUESTS, "theirs", NS) or {}).get("status") in (None, {})


def test_a_pod_that_consumes_a_request_waits_for_it_and_brings_up_no_node_itself(cluster: LocalCluster) -> None:
    job = consuming_job("waiter", "NVIDIA-B200", 1, ATOMIC)
    job["spec"]["suspend"] = False  # no request was made: its pod must not bring up a node on its own
    cluster.client.create(JOBS, job, NS)
    message = "Unschedulable pod didn't trigger scale-up, because it's consuming ProvisioningRequest default/waiter"

    def told() -> list[dict[str, Any]] | None:
        pods = cluster.client.list(PODS, NS, label_selector="job-name=waiter")
        events = [e for p in pods for e in events_of(cluster, p)]
        return events if any(e["message"] == message for e in events) else None

    events = cluster.client.wait_for(told, timeout=30)
    # The autoscaler posts its scale-up Events in the pass that decides: none came with this one.
    assert [(e["reason"], e["source"]["component"]) for e in events] == [("", "cluster-autoscaler")]
    assert node_names(cluster, "b200") == set()


def test_a_request_not_provisioned_in_time_fails_as_expired(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, workdir=tmp_path, pools=POOLS, request_expiry=datetime.timedelta(0)) as running:
        ask(running, "late", "NVIDIA-A100", ATOMIC, 1)
        conditions = answer(running, "late", "Failed")
        assert said(conditions["Failed"]) == ("True", "Expired", "ProvisioningRequest is expired")
