"""Issue 32 end to end: the real operator on a local cluster with the Kueue stand-in (``local/kueue.py``:
Kueue's Job integration, a ClusterQueue's quota and admission checks, admission by priority then time),
run as the chart runs it with ``kueue.enabled`` (``COMPILECACHE_KUEUE=true``).

Item 1: a cache whose warm-ups join a LocalQueue without the GPU quota they need: its Jobs are created
suspended, no pod runs, the pool is ``Queued`` with Kueue's own message; once the ClusterQueue has the
quota, Kueue admits them, and the cache becomes Ready through the real warm-up and expiry (the expiry Job
in its own CPU queue).

Item 2: training Jobs in a ClusterQueue that lists the operator's AdmissionCheck: the check stays
``Pending`` (no pod exists) until the cache is Ready, then the Job starts, its pods carry the release
annotation Kueue applied, get the cache without a gate, and hit; with a cache that never warms, the check
turns Ready at ``gateTimeout``, and training runs cold with its misses named.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from compilecache.controller import admission, checks
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
    training_result,
    wait_phase,
    wait_pod,
)
from test_examples import EXAMPLE_POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]

GPU = "nvidia.com/gpu"
CHECK = "compilecache-warm"  # the AdmissionCheck the chart creates with kueue.enabled (kueue.admissionCheck.name)


def cluster_queue(name: str, gpus: str, *admission_checks: str) -> dict[str, Any]:
    """A ClusterQueue of one flavor with plenty of CPU and memory, and ``gpus`` GPUs; with ``admission_checks``
    as v1beta2 lists them (``admissionChecksStrategy``)."""
    quotas = {"cpu": "256", "memory": "2Ti", GPU: gpus}
    resources = [{"name": key, "nominalQuota": value} for key, value in quotas.items()]
    group = {"coveredResources": list(quotas), "flavors": [{"name": "default-flavor", "resources": resources}]}
    spec: dict[str, Any] = {"resourceGroups": [group]}
    if admission_checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": name} for name in admission_checks]}
    return {"metadata": {"name": name}, "spec": spec}


def queue(client: Any, name: str, gpus: str, *admission_checks: str) -> None:
    """A ClusterQueue and the LocalQueue of the same name in NS."""
    client.create(kueue.CLUSTER_QUEUES, cluster_queue(name, gpus, *admission_checks))
    client.create(kueue.LOCAL_QUEUES, {"metadata": {"name": name}, "spec": {"clusterQueue": name}}, NS)


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
        # As the chart renders it with kueue.enabled: the AdmissionCheck of the operator's controller.
        client.create(
            kueue.ADMISSION_CHECKS, {"metadata": {"name": CHECK}, "spec": {"controllerName": checks.CONTROLLER_NAME}}
        )
        queue(client, "training", "64", CHECK)  # where training Jobs queue, through the operator's check
        operator = stack.enter_context(
            run_operator(
                cluster,
                webhooks=webhooks,
                resync_seconds=0.5,
                policy=EXAMPLE_POLICIES["cache-gcs.yaml"],
                env={checks.KUEUE_ENV: "true"},
            )
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


# --- item 2: training admitted through the operator's AdmissionCheck -----------------------------------


def training_job(name: str, cache: str) -> dict[str, Any]:
    """``examples/training-job.yaml`` in the LocalQueue ``training``, using ``cache``."""
    job = example("training-job.yaml")
    job["metadata"]["name"] = name
    job["metadata"]["labels"] = {kueue.QUEUE_LABEL: "training"}
    job["spec"]["template"]["metadata"]["labels"]["compilecache.dev/cache"] = cache
    return job


def our_check(client: Any, job: dict[str, Any]) -> dict[str, Any] | None:
    """Our check's entry on the Job's Workload, once Kueue listed it."""
    uid = job["metadata"]["uid"]
    for workload in client.list(kueue.WORKLOADS, NS):
        if (workload["metadata"].get("labels") or {}).get(kueue.JOB_UID_LABEL) == uid:
            found = [c for c in (workload.get("status") or {}).get("admissionChecks") or [] if c["name"] == CHECK]
            return {**found[0], "workload": workload} if found else None
    return None


def test_the_operator_keeps_its_admission_check_active(queued: Setup) -> None:
    client = queued.cluster.client

    def active() -> bool:
        conditions = (client.get(kueue.ADMISSION_CHECKS, CHECK).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "True" and c["reason"] == "Active" for c in conditions)

    assert client.wait_for(active, timeout=30), "the operator did not mark its AdmissionCheck Active"


def test_training_waits_in_the_check_until_the_cache_is_ready_then_starts_ungated_and_hits(queued: Setup) -> None:
    client = queued.cluster.client
    # The cache's warm-ups wait in a queue without GPUs: the cache stays Warming until the test gives it quota.
    queue(client, "held", "0")
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = "checked"
    cache["spec"]["storage"]["pvc"]["claimName"] = "checked-cache"
    cache["spec"]["warmup"]["queue"] = {"name": "held", "expiryName": "cpu-queue"}
    client.create(CC, cache, NS)
    job = client.create(JOBS, training_job("checked-train", "checked"), NS)
    check = client.wait_for(
        lambda: (c := our_check(client, job)) and c["message"].startswith("waiting for CompileCache checked") and c,
        timeout=60,
    )
    assert check["state"] == "Pending", check
    # The Workload holds its quota, and Kueue made no pod: nothing waits behind a gate, nothing is evicted.
    assert kueue.is_true(check["workload"], "QuotaReserved") and not kueue.is_true(check["workload"], "Admitted")
    assert pods_of(queued, "checked-train") == []
    assert client.wait_for(
        lambda: (status_of(queued, "checked").get("consumers") or {}).get("workloads") == 1, timeout=30
    )
    # The warm-ups get their quota; once the cache is Ready, the check is, and Kueue starts the Job.
    client.patch(kueue.CLUSTER_QUEUES, "held", cluster_queue("held", "64"))
    assert wait_phase(queued, "checked", ("Ready", "Failed", "Degraded"), timeout=240)["phase"] == "Ready"
    check = client.wait_for(lambda: (c := our_check(client, job)) and c["state"] == "Ready" and c, timeout=60)
    assert check["message"].startswith("CacheReady: "), check
    pod = wait_pod(queued, "checked-train", lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    log = queued.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    # Kueue applied the check's podSetUpdates to the template; the webhook mounted the cache without a gate.
    assert pod["metadata"]["annotations"][admission.ANNOTATION_RELEASED].startswith("CacheReady ")
    assert not pod["spec"].get("schedulingGates")
    assert any(v["name"] == admission.VOLUME for v in pod["spec"]["volumes"])
    result = training_result(log)
    assert result["requests"] > 0 and result["hits"] == result["requests"], result
    assert client.wait_for(
        lambda: (status_of(queued, "checked").get("consumers") or {}).get("workloads") == 0, timeout=30
    )


def test_a_cache_that_never_warms_lets_training_through_at_gate_timeout_and_it_runs_cold_named(queued: Setup) -> None:
    client = queued.cluster.client
    queue(client, "never", "0")  # its warm-ups never get quota: the cache warms for ever
    cache = example("cache-pvc.yaml")
    cache["metadata"]["name"] = "cold"
    cache["spec"]["storage"]["pvc"]["claimName"] = "cold-cache"
    cache["spec"]["warmup"]["queue"] = {"name": "never", "expiryName": "cpu-queue"}
    cache["spec"]["consumers"]["gateTimeout"] = "20s"
    client.create(CC, cache, NS)
    job = client.create(JOBS, training_job("cold-train", "cold"), NS)
    check = client.wait_for(lambda: (c := our_check(client, job)) and c["state"] == "Ready" and c, timeout=120)
    assert check["message"].startswith("GateTimeout: CompileCache cold was not Ready within gateTimeout (20s)"), check
    assert status_of(queued, "cold")["phase"] != "Ready"
    events = client.list("v1/events", NS)
    assert any(
        e["reason"] == "GateTimeout" and e["involvedObject"]["kind"] == "Workload" and e["type"] == "Warning"
        for e in events
    ), [e["reason"] for e in events]
    pod = wait_pod(queued, "cold-train", lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    log = queued.cluster.logs(NS, pod["metadata"]["name"], "train")
    assert pod["status"]["phase"] == "Succeeded", log[-3000:]
    assert pod["metadata"]["annotations"][admission.ANNOTATION_RELEASED].startswith("GateTimeout ")
    assert not pod["spec"].get("schedulingGates")
    result = training_result(log)
    assert result["requests"] > 0 and result["hits"] == 0, result  # cold: every compile missed
    # The misses are named: the trainer's report reached the cache's status.
    consumers = client.wait_for(
        lambda: (c := status_of(queued, "cold").get("consumers") or {}).get("lastMissReason") and c, timeout=60
    )
    assert consumers["requests"] == result["requests"] and consumers["hits"] == 0, consumers
