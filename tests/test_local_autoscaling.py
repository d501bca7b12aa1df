"""The local cluster scales pools from zero, refuses when told, and reclaims nodes mid-run (no operator).

Jobs are created through the client as a user would; ``python -c`` containers stand in for warm-ups.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.local.cluster import LocalCluster
from compilecache.local.nodes import NodePool
from test_local_cluster import finished, pods_of

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

NS = "default"
JOBS, PODS, NODES, EVENTS = "batch/v1/jobs", "v1/pods", "v1/nodes", "v1/events"
REFUSAL = "in backoff after failed scale-up"
POOLS = (
    NodePool("l4", "NVIDIA-L4", count=0, gpus=1, max_count=1, scale_up_seconds=0.5),  # scales from zero
    NodePool("a100", "NVIDIA-A100", count=0, gpus=8, max_count=1, refuse=REFUSAL),
    NodePool("spot", "NVIDIA-H100", count=1, gpus=8, max_count=1, scale_up_seconds=0.2),  # reclaimed by the tests
    NodePool("pre", "NVIDIA-B200", count=0, gpus=8, max_count=2, scale_up_seconds=0.2, reclaim_after_seconds=1),
    NodePool("gang", "NVIDIA-GB200", count=0, gpus=4, max_count=2, scale_up_seconds=0.2),  # a multi-host pool
    NodePool("cpu", "", count=1, gpus=0),
)
IGNORE_DISRUPTION = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("autoscaling")
    with LocalCluster(root, workdir=root, pools=POOLS) as running:
        yield running


def gpu_job(name: str, product: str, code: str = "print('warm')", **spec: Any) -> dict[str, Any]:
    """A Job of one GPU pod for ``product`` (its selector and toleration, as the operator's warm-ups have);
    its container has its node's name in ``NODE``."""
    node = {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    container = {"name": "warm", "image": "ignored:1", "command": [sys.executable, "-c", code], "env": [node]}
    pod = {
        "restartPolicy": "Never",
        "nodeSelector": {"nvidia.com/gpu.product": product},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [container],
    }
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": pod}, **spec}}


def once(marker: Path) -> str:
    """A container that runs until killed the first time (after it made ``marker``) and succeeds the second:
    a warm-up cut by a reclaim."""
    return (
        "import pathlib, sys, time\n"
        f"marker = pathlib.Path({str(marker)!r})\n"
        "if marker.exists(): sys.exit(0)\n"
        "marker.touch()\n"
        "time.sleep(120)\n"
    )


# Runs until killed on the pool's first node, succeeds on any other: what the reclaimed pod and its retry do.
UNTIL_MOVED = "import os, sys, time\nif os.environ['NODE'] == 'pre-0': time.sleep(120)\n"


def events_of(cluster: LocalCluster, pod: dict[str, Any]) -> list[dict[str, Any]]:
    # All events, filtered here: field selectors on events are the emulator's to add, not this test's.
    return [e for e in cluster.client.list(EVENTS, NS) if e["involvedObject"].get("uid") == pod["metadata"]["uid"]]


def node_names(cluster: LocalCluster) -> set[str]:
    return {node["metadata"]["name"] for node in cluster.client.list(NODES)}


def running_pod(cluster: LocalCluster, job: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        live = [p for p in pods_of(cluster, job) if (p.get("status") or {}).get("phase") == "Running"]
        return live[0] if live else None

    result: dict[str, Any] = cluster.client.wait_for(running, timeout=30)
    return result


def test_a_pod_for_a_pool_at_zero_brings_up_its_node_and_runs_there(cluster: LocalCluster) -> None:
    assert not {name for name in node_names(cluster) if name.startswith("l4-")}
    cluster.client.create(JOBS, gpu_job("cold", "NVIDIA-L4"), NS)
    done = finished(cluster, "cold")
    assert done["status"]["succeeded"] == 1
    [pod] = pods_of(cluster, "cold")
    assert pod["spec"]["nodeName"] == "l4-0" and "l4-0" in node_names(cluster)
    # The scheduler said why it waited before the node came.
    [event] = events_of(cluster, pod)
    assert (event["reason"], event["type"], event["source"]) == (
        "TriggeredScaleUp",
        "Normal",
        {"component": "cluster-autoscaler"},
    )
    assert event["message"] == "pod triggered scale-up: [{l4 0->1 (max: 1)}]"
    assert event["involvedObject"]["name"] == pod["metadata"]["name"] and event["count"] == 1
    node = cluster.client.get(NODES, "l4-0") or {}
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert node["status"]["conditions"] == [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]


def test_a_refused_pool_gets_no_node_and_the_pod_hears_why_once(cluster: LocalCluster) -> None:
    cluster.client.create(JOBS, gpu_job("refused", "NVIDIA-A100"), NS)

    def told() -> dict[str, Any] | None:
        pods = pods_of(cluster, "refused")
        found = events_of(cluster, pods[0]) if pods else []
        return found[0] if found else None

    event = cluster.client.wait_for(told, timeout=30)
    assert event["reason"] == "NotTriggerScaleUp" and event["type"] == "Normal"
    assert event["message"].startswith("pod didn't trigger scale-up: ")
    assert f"1 {REFUSAL}" in event["message"].split(": ", 1)[1].split(", ")
    # Many passes later (another Job ran to the end meanwhile): still Pending, no node, one Event.
    cluster.client.create(JOBS, _on_cpu("meanwhile"), NS)
    assert finished(cluster, "meanwhile")["status"]["succeeded"] == 1
    [pod] = pods_of(cluster, "refused")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert not {name for name in node_names(cluster) if name.startswith("a100-")}
    [again] = events_of(cluster, pod)
    assert again["count"] == 1 and again["message"] == event["message"]
    cluster.client.delete(JOBS, "refused", NS)


def _on_cpu(name: str) -> dict[str, Any]:
    """A Job of one pod on the CPU node."""
    container = {"name": "c", "image": "ignored:1", "command": [sys.executable, "-c", "pass"]}
    pod = {"restartPolicy": "Never", "containers": [container]}
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": pod}}}


@pytest.mark.parametrize("policy", [IGNORE_DISRUPTION, None], ids=["ignore-disruption", "no-policy"])
def test_a_reclaimed_pod_is_retried_under_an_ignore_rule_and_fails_the_job_without(
    cluster: LocalCluster, tmp_path: Path, policy: dict[str, Any] | None
) -> None:
    name = "reclaimed" if policy else "reclaimed-plain"
    extra = {"podFailurePolicy": policy} if policy else {}
    cluster.client.create(JOBS, gpu_job(name, "NVIDIA-H100", once(tmp_path / "started"), **extra), NS)
    pod = running_pod(cluster, name)
    cluster.client.wait_for(lambda: (tmp_path / "started").exists(), timeout=30)  # it runs: now reclaim its node
    node = pod["spec"]["nodeName"]
    assert node.startswith("spot-")
    assert cluster.reclaim(node) == [pod["metadata"]["name"]]
    assert node not in node_names(cluster)
    done = finished(cluster, name)
    first = cluster.client.get(PODS, pod["metadata"]["name"], NS) or {}
    status = first["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "Terminated")
    assert status["message"] == "Pod was terminated in response to imminent node shutdown."
    [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"]) == ("True", "TerminationByKubelet")
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    if policy:
        # backoffLimit 0, yet the Job completes: the reclaimed pod is not counted, and a new spot node took the retry.
        assert (done["status"]["succeeded"], done["status"]["failed"]) == (1, 0)
        [retry] = [p for p in pods_of(cluster, name) if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        assert retry["status"]["phase"] == "Succeeded" and retry["spec"]["nodeName"] not in (node, "")
        assert [e["reason"] for e in events_of(cluster, retry)] == ["TriggeredScaleUp"]
    else:
        assert done["status"]["failed"] == 1
        assert done["status"]["conditions"][-1]["reason"] == "BackoffLimitExceeded"


def test_a_pool_told_to_reclaim_does_it_once_and_the_retry_completes(cluster: LocalCluster) -> None:
    job = gpu_job("preempted", "NVIDIA-B200", UNTIL_MOVED, podFailurePolicy=IGNORE_DISRUPTION)
    cluster.client.create(JOBS, job, NS)
    done = finished(cluster, "preempted")
    assert (done["status"]["succeeded"], done["status"]["failed"]) == (1, 0)
    # Each pod by its node (creation stamps have whole seconds: no order between two pods of one second).
    first, retry = sorted(pods_of(cluster, "preempted"), key=lambda pod: pod["spec"]["nodeName"])
    assert first["spec"]["nodeName"] == "pre-0" and first["status"]["reason"] == "Terminated"
    assert retry["spec"]["nodeName"] == "pre-1" and retry["status"]["phase"] == "Succeeded"
    assert "pre-0" not in node_names(cluster) and "pre-1" in node_names(cluster)
    messages = [e["message"] for e in events_of(cluster, first) + events_of(cluster, retry)]
    # The retry's node was one scale-up: the reclaim shrank the pool back to 0 (as Karpenter deletes a spot node).
    assert messages == [
        "pod triggered scale-up: [{pre 0->1 (max: 2)}]",
        "pod triggered scale-up: [{pre 0->1 (max: 2)}]",
    ]


def test_the_pods_of_a_multi_host_job_bring_up_one_node_each(cluster: LocalCluster) -> None:
    job = gpu_job("gang", "NVIDIA-GB200", completionMode="Indexed", completions=2, parallelism=2)
    term = {"labelSelector": {"matchLabels": {"job-name": "gang"}}, "topologyKey": "kubernetes.io/hostname"}
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    job["spec"]["template"]["spec"]["affinity"] = anti
    cluster.client.create(JOBS, job, NS)
    assert finished(cluster, "gang")["status"]["succeeded"] == 2
    pods = pods_of(cluster, "gang")
    assert sorted(pod["spec"]["nodeName"] for pod in pods) == ["gang-0", "gang-1"]
    messages = {e["message"] for pod in pods for e in events_of(cluster, pod)}
    assert messages == {"pod triggered scale-up: [{gang 0->2 (max: 2)}]"}  # one scale-up for both hosts
