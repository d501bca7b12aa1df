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
        activate(client, "warm-cache")
        client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}}, NS)
        client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "trained"}, "spec": {"clusterQueue": "checked"}}, NS)
        yield running


def activate(client: Any, check: str) -> None:
    """Write the AdmissionCheck's ``Active=True``, as its controller (here, the test) does."""
    active = {"type": "Active", "status": "True", "reason": "Active", "message": "The admission check is active"}
    client.patch(kueue.ADMISSION_CHECKS, check, {"status": {"conditions": [active]}}, subresource="status")


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


def holding(gate: Path) -> str:
    """A container's code that runs until ``gate`` exists (the Job holds its quota meanwhile)."""
    return f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)"


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
    created = cluster.client.create(JOBS, queued_job("first", "team", 8, holding(gate)), NS)
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


RELEASED = "compilecache.dev/released"


@pytest.fixture(scope="module")
def gated(cluster: LocalCluster) -> str:
    """A LocalQueue ``gated`` whose ClusterQueue lists the check ``cache-gate``, made with no ``Active`` condition."""
    resources = [{"name": GPU, "nominalQuota": "8"}]
    group = {"coveredResources": [GPU], "flavors": [{"name": "default-flavor", "resources": resources}]}
    spec = {"resourceGroups": [group], "admissionChecks": ["cache-gate"]}
    cluster.client.create(kueue.CLUSTER_QUEUES, {"metadata": {"name": "gated"}, "spec": spec})
    check = {"metadata": {"name": "cache-gate"}, "spec": {"controllerName": "compilecache.dev/warm"}}
    cluster.client.create(kueue.ADMISSION_CHECKS, check)
    cluster.client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": "gated"}, "spec": {"clusterQueue": "gated"}}, NS)
    return "gated"


def cluster_queue_active(cluster: LocalCluster, name: str, status: str) -> dict[str, Any]:
    """The ClusterQueue's ``Active`` condition once its status is ``status``."""

    def found() -> dict[str, Any] | None:
        cq = cluster.client.get(kueue.CLUSTER_QUEUES, name) or {}
        active = kueue.condition((cq.get("status") or {}).get("conditions") or [], "Active")
        return dict(active) if active is not None and active.get("status") == status else None

    result: dict[str, Any] = cluster.client.wait_for(found, timeout=30)
    return result


def pending_check(cluster: LocalCluster, workload: str) -> dict[str, Any]:
    """The Workload's one check, once it holds quota and the check is ``Pending`` (no pass writes it then)."""

    def found() -> dict[str, Any] | None:
        current = cluster.client.get(kueue.WORKLOADS, workload, NS) or {}
        checks = (current.get("status") or {}).get("admissionChecks") or []
        if kueue.holds_quota(current) and len(checks) == 1 and checks[0]["state"] == "Pending":
            return dict(checks[0])
        return None

    result: dict[str, Any] = cluster.client.wait_for(found, timeout=30)
    return result


def set_check(cluster: LocalCluster, workload: str, check: dict[str, Any], state: str, released: str = "") -> None:
    """Write the check's state as its controller does; ``released``: the annotation its podSetUpdates give pods."""
    entry = {**check, "state": state, "message": f"test says {state}"}
    if released:
        entry["podSetUpdates"] = [{"name": "main", "annotations": {RELEASED: released}}]
    cluster.client.patch(kueue.WORKLOADS, workload, {"status": {"admissionChecks": [entry]}}, NS, "status")


def finished_condition(cluster: LocalCluster, workload: str) -> dict[str, Any] | None:
    """The Workload's ``Finished`` condition once it is ``True``."""
    current = cluster.client.get(kueue.WORKLOADS, workload, NS) or {}
    found = kueue.condition((current.get("status") or {}).get("conditions") or [], "Finished")
    return dict(found) if found is not None and found.get("status") == "True" else None


def job_of(cluster: LocalCluster, name: str) -> dict[str, Any]:
    job = cluster.client.get(JOBS, name, NS)
    assert job is not None, f"Job {name} is gone"
    return job


def test_a_check_admits_only_once_active_and_ready_and_its_pod_set_updates_reach_the_pods(
    cluster: LocalCluster, gated: str
) -> None:
    inactive = cluster_queue_active(cluster, gated, "False")
    assert (inactive["reason"], inactive["message"]) == (
        "AdmissionCheckInactive",
        "Can't admit new workloads: references inactive AdmissionCheck(s): cache-gate.",
    )
    cluster.client.create(JOBS, queued_job("trained", gated, 2), NS)
    workload = workload_of(cluster, "trained")
    assert quota_reserved(workload) == ("False", "Inadmissible", f"ClusterQueue {gated} is inactive")
    for _ in range(3):  # passes later, still nothing runs
        cluster.step()
    assert job_of(cluster, "trained")["spec"]["suspend"] is True and not pods_of(cluster, "trained")

    activate(cluster.client, "cache-gate")  # the check's controller is up
    assert cluster_queue_active(cluster, gated, "True")["reason"] == "Ready"
    name = workload["metadata"]["name"]
    check = pending_check(cluster, name)
    assert job_of(cluster, "trained")["spec"]["suspend"] is True and not pods_of(cluster, "trained")

    set_check(cluster, name, check, "Ready", "Ready 2026-01-01T00:00:00Z")
    wait_succeeded(cluster, "trained")
    (pod,) = pods_of(cluster, "trained")
    assert pod["metadata"]["annotations"][RELEASED] == "Ready 2026-01-01T00:00:00Z"
    assert pod["metadata"]["labels"][kueue.PODSET_LABEL] == "main"
    template = job_of(cluster, "trained")["spec"]["template"]
    assert template["metadata"]["annotations"] == {RELEASED: "Ready 2026-01-01T00:00:00Z"}


def test_a_retry_suspends_the_job_and_restores_its_template_for_the_next_admission(
    cluster: LocalCluster, gated: str, tmp_path: Path
) -> None:
    activate(cluster.client, "cache-gate")
    gate = tmp_path / "release"
    cluster.client.create(JOBS, queued_job("retried", gated, 2, holding(gate)), NS)
    name = workload_of(cluster, "retried")["metadata"]["name"]
    set_check(cluster, name, pending_check(cluster, name), "Ready", "first")
    cluster.client.wait_for(lambda: pods_of(cluster, "retried"), timeout=30)

    # The controller asks for a Retry: Kueue gives the quota back and stops the Job, and the template is
    # the Job's own again, so the next admission's different annotation is no conflict.
    admitted = cluster.client.get(kueue.WORKLOADS, name, NS)
    assert admitted is not None and kueue.is_true(admitted, "Admitted")  # stable: no pass writes it now
    set_check(cluster, name, admitted["status"]["admissionChecks"][0], "Retry")

    def restored() -> dict[str, Any] | None:
        job = job_of(cluster, "retried")
        meta = job["spec"]["template"].get("metadata") or {}
        stopped = job["spec"]["suspend"] is True and not meta.get("annotations")
        return job if stopped and kueue.PODSET_LABEL not in (meta.get("labels") or {}) else None

    cluster.client.wait_for(restored, timeout=30)
    cluster.client.wait_for(lambda: not pods_of(cluster, "retried"), timeout=30)
    set_check(cluster, name, pending_check(cluster, name), "Ready", "second")
    cluster.client.wait_for(lambda: pods_of(cluster, "retried"), timeout=30)
    gate.touch()
    wait_succeeded(cluster, "retried")
    released = {pod["metadata"]["annotations"][RELEASED] for pod in pods_of(cluster, "retried")}
    assert released == {"second"}
    finished = cluster.client.wait_for(lambda: finished_condition(cluster, name), timeout=30)
    assert finished["reason"] == "Succeeded"


def test_a_pod_set_update_that_conflicts_with_the_template_fails_the_start_for_good(
    cluster: LocalCluster, gated: str
) -> None:
    activate(cluster.client, "cache-gate")
    body = queued_job("clash", gated, 2)
    body["spec"]["template"]["metadata"] = {"annotations": {RELEASED: "set by the author"}}
    cluster.client.create(JOBS, body, NS)
    name = workload_of(cluster, "clash")["metadata"]["name"]
    set_check(cluster, name, pending_check(cluster, name), "Ready", "Ready now")

    done = cluster.client.wait_for(lambda: finished_condition(cluster, name), timeout=30)
    assert (done["reason"], done["message"]) == (
        "FailedToStart",
        f"invalid admission check PodSetUpdate: conflict for annotations: conflict for key={RELEASED}, "
        "value1=set by the author, value2=Ready now",
    )
    for _ in range(3):
        cluster.step()
    job = job_of(cluster, "clash")
    assert job["spec"]["suspend"] is True and not pods_of(cluster, "clash")
    assert job["spec"]["template"]["metadata"]["annotations"] == {RELEASED: "set by the author"}
