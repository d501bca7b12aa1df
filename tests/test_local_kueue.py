"""The local cluster's Kueue stand-in, through the client as the operator sees it (no operator).

Queued Jobs of ``python -c`` containers stand in for warm-ups and training; the tests write the
admission check's state as the operator (the check's controller) would.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compilecache.local import kueue
from compilecache.local.cluster import LocalCluster
from compilecache.local.nodes import NodePool

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

NS = "default"
JOBS, PODS = "batch/v1/jobs", "v1/pods"
GPU = "nvidia.com/gpu"
POOLS = (NodePool("h100", "NVIDIA-H100", count=1, gpus=8),)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("kueue")
    with LocalCluster(root, workdir=root, pools=POOLS) as running:
        client = running.client
        resources = [{"name": GPU, "nominalQuota": "8"}]
        group = {"coveredResources": [GPU], "flavors": [{"name": "default-flavor", "resources": resources}]}
        client.create(kueue.CLUSTER_QUEUES, {"metadata": {"name": "gpus"}, "spec": {"resourceGroups": [group]}})
        checked = {"resourceGroups": [group], "admissionChecks": ["warm-cache"]}
        client.create(kueue.CLUSTER_QUEUES, {"metadata": {"name": "checked"}, "spec": checked})
        client.create(kueue.ADMISSION_CHECKS, {"metadata": {"name": "warm-cache"}, "spec": {"controllerName": "x/y"}})
        client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}}, NS)
        client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "trained"}, "spec": {"clusterQueue": "checked"}}, NS)
        yield running


def queued_job(name: str, queue: str, gpus: int, code: str = "print('warm')") -> dict[str, Any]:
    """A Job of one pod asking for ``gpus`` GPUs in ``queue``, created unsuspended: Kueue's webhook suspends it."""
    container = {
        "name": "main",
        "image": "ignored:1",
        "command": [sys.executable, "-c", code],
        "resources": {"limits": {GPU: str(gpus)}},
    }
    template = {
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [container],
        }
    }
    labels = {kueue.QUEUE_LABEL: queue}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"backoffLimit": 0, "template": template}}


def workload_of(cluster: LocalCluster, job: str, timeout: float = 30) -> dict[str, Any]:
    """The Job's Workload once it has a QuotaReserved condition."""

    def found() -> dict[str, Any] | None:
        owner = cluster.client.get(JOBS, job, NS)
        assert owner is not None, f"Job {job} is gone"
        for workload in cluster.client.list(kueue.WORKLOADS, NS):
            refs = workload["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == owner["metadata"]["uid"] for ref in refs) and kueue.condition(
                (workload.get("status") or {}).get("conditions") or [], "QuotaReserved"
            ):
                return workload
        return None

    result: dict[str, Any] = cluster.client.wait_for(found, timeout=timeout)
    return result


def quota_reserved(workload: dict[str, Any]) -> tuple[str, str, str]:
    found = kueue.condition(workload["status"]["conditions"], "QuotaReserved")
    assert found is not None
    return found["status"], found["reason"], found["message"]


def wait_succeeded(cluster: LocalCluster, name: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = cluster.client.get(JOBS, name, NS) or {}
        return job if (job.get("status") or {}).get("succeeded") == 1 else None

    result: dict[str, Any] = cluster.client.wait_for(done, timeout=timeout)
    return result


def pods_of(cluster: LocalCluster, job: str) -> list[dict[str, Any]]:
    return cluster.client.list(PODS, NS, label_selector=f"job-name={job}")


def test_a_queued_job_waits_suspended_with_kueues_message_until_quota_frees(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    gate = tmp_path / "release"  # the first Job holds its quota until the test lets it finish
    holder = f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)"
    created = cluster.client.create(JOBS, queued_job("first", "team", 8, holder), NS)
    assert created["spec"]["suspend"] is True  # Kueue's webhook, at creation
    first = workload_of(cluster, "first")
    assert quota_reserved(first)[0] == "True"
    assert first["metadata"]["name"] == kueue.workload_name("first", created["metadata"]["uid"])
    assert first["metadata"]["labels"][kueue.JOB_UID_LABEL] == created["metadata"]["uid"]
    assert first["spec"]["podSets"][0]["count"] == 1
    cluster.client.wait_for(lambda: pods_of(cluster, "first"), timeout=30)  # unsuspended: it runs

    cluster.client.create(JOBS, queued_job("second", "team", 4), NS)
    second = workload_of(cluster, "second")
    assert quota_reserved(second) == (
        "False",
        "Pending",
        f"couldn't assign flavors to pod set main: insufficient unused quota for {GPU} in flavor default-flavor, "
        "4 more needed",
    )
    job = cluster.client.get(JOBS, "second", NS)
    assert job is not None and job["spec"]["suspend"] is True and not pods_of(cluster, "second")
    assert "startTime" not in (job.get("status") or {})  # the time bound has not started

    gate.touch()
    wait_succeeded(cluster, "first")
    wait_succeeded(cluster, "second")
    finished = cluster.client.get(kueue.WORKLOADS, first["metadata"]["name"], NS)
    assert finished is not None and kueue.is_true(finished, "Finished")
    # A deleted Job's Workload goes with it (the garbage collector, through the ownerReference).
    cluster.client.delete(JOBS, "first", NS)
    assert cluster.client.get(kueue.WORKLOADS, first["metadata"]["name"], NS) is None


def test_a_job_in_a_missing_local_queue_is_inadmissible(cluster: LocalCluster) -> None:
    cluster.client.create(JOBS, queued_job("lost", "nowhere", 1), NS)
    lost = workload_of(cluster, "lost")
    assert quota_reserved(lost) == ("False", "Inadmissible", "LocalQueue nowhere doesn't exist")
    job = cluster.client.get(JOBS, "lost", NS)
    assert job is not None and job["spec"]["suspend"] is True and not pods_of(cluster, "lost")


def test_an_admission_check_holds_the_job_until_its_controller_says_ready(cluster: LocalCluster) -> None:
    cluster.client.create(JOBS, queued_job("train", "trained", 2), NS)
    workload = workload_of(cluster, "train")
    name = workload["metadata"]["name"]

    def checks() -> list[dict[str, Any]] | None:
        current = cluster.client.get(kueue.WORKLOADS, name, NS) or {}
        return (current.get("status") or {}).get("admissionChecks")

    (check,) = cluster.client.wait_for(checks, timeout=30)
    assert (check["name"], check["state"]) == ("warm-cache", "Pending")
    current = cluster.client.get(kueue.WORKLOADS, name, NS)
    assert current is not None and quota_reserved(current)[0] == "True" and not kueue.is_true(current, "Admitted")
    # Passes of the controllers later, the Job is still held (the stand-in reads a check, never writes it).
    for _ in range(3):
        cluster.step()
    job = cluster.client.get(JOBS, "train", NS)
    assert job is not None and job["spec"]["suspend"] is True and not pods_of(cluster, "train")

    # The operator, as the check's controller, writes it Ready: the Workload is admitted, the Job runs.
    ready = [{**check, "state": "Ready", "message": "the cache is Ready"}]
    cluster.client.patch(kueue.WORKLOADS, name, {"status": {"admissionChecks": ready}}, NS, "status")
    wait_succeeded(cluster, "train")
    admitted = cluster.client.get(kueue.WORKLOADS, name, NS)
    assert admitted is not None and kueue.is_true(admitted, "Admitted")
