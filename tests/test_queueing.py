"""Warm-ups in a Kueue queue (issue 32, item 1): the Jobs' labels, suspension and metadata, the policy on
queues and priority classes, and what a pool says while Kueue has not admitted its Job (pure plans)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compilecache.controller import expiryjob, jobs, plan, policy, queueing, status
from compilecache.controller.api import SpecError, parse_cache
from compilecache.controller.kube import JOBS
from compilecache.controller.pools import resolve_pools
from compilecache.controller.snapshot import Cache, Snapshot
from specs import cache, cluster

NOW = "2026-11-21T10:00:00Z"
CLAIM = {"metadata": {"name": "jax-cache", "labels": {"compilecache.dev/cache": "llama"}}, "status": {"phase": "Bound"}}
QUEUE = {"name": "gpu-queue", "expiryName": "cpu-queue", "priorityClass": "warmup-low"}
# As Kueue writes a Workload that does not fit its ClusterQueue's quota (its QuotaReserved condition).
NO_QUOTA = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default-flavor, "
    "8 more needed"
)


def queued_cache(**warmup: Any) -> dict[str, Any]:
    obj = cache()
    obj["spec"]["warmup"] |= {"queue": QUEUE, **warmup}
    return obj


def decide(obj: dict[str, Any], **parts: Any) -> plan.Plan:
    return plan.plan(Snapshot(Cache.read(obj), claim=CLAIM, nodes=tuple(cluster()), **parts), NOW)


def workload(job: dict[str, Any], **conditions: tuple[str, str, str]) -> dict[str, Any]:
    """The Workload Kueue made for ``job``, with conditions type → (status, reason, message)."""
    return {
        "metadata": {
            "name": f"job-{job['metadata']['name']}-1a2b3",
            "labels": {queueing.JOB_UID: job["metadata"]["uid"]},
        },
        "status": {
            "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, (s, r, m) in conditions.items()]
        },
    }


def created_jobs(obj: dict[str, Any]) -> tuple[plan.Plan, list[dict[str, Any]]]:
    """The first plan of ``obj`` and the Jobs it creates, as the API server returns them (each with a uid)."""
    first = decide(obj)
    made = [copy.deepcopy(dict(c.manifest)) for c in first.creates if c.resource == JOBS]
    for index, job in enumerate(made):
        job["metadata"]["uid"] = f"job-uid-{index}"
    return first, made


def test_queued_jobs_carry_the_queue_and_priority_labels_and_are_created_suspended() -> None:
    obj = queued_cache(
        priorityClassName="batch-low", jobMetadata={"labels": {"team": "ml"}, "annotations": {"cost-center": "42"}}
    )
    spec = parse_cache(obj)
    [pool, *_] = resolve_pools(spec, cluster())
    job = jobs.warmup_job(obj, spec, pool)
    assert job["metadata"]["labels"][queueing.QUEUE_NAME] == "gpu-queue"
    assert job["metadata"]["labels"][queueing.PRIORITY_CLASS] == "warmup-low"
    assert job["spec"]["suspend"] is True
    template = job["spec"]["template"]
    assert template["spec"]["priorityClassName"] == "batch-low"
    for meta in (job["metadata"], template["metadata"]):
        assert meta["labels"]["team"] == "ml" and meta["annotations"]["cost-center"] == "42"
    assert template["metadata"]["labels"][jobs.LABEL_ROLE] == "warmup"  # the operator's own labels stand
    # What is compiled did not change: the same Job name as without a queue.
    plain = cache()
    assert job["metadata"]["name"] == jobs.warmup_job(plain, parse_cache(plain), pool)["metadata"]["name"]
    expiry = expiryjob.expiry_job(obj, spec, [job["metadata"]["name"]])
    assert expiry["metadata"]["labels"][queueing.QUEUE_NAME] == "cpu-queue"  # its own queue: it needs no GPU
    assert expiry["spec"]["suspend"] is True and expiry["spec"]["template"]["spec"]["priorityClassName"] == "batch-low"


def test_without_a_queue_nothing_changes() -> None:
    obj = cache()
    spec = parse_cache(obj)
    [pool, *_] = resolve_pools(spec, cluster())
    job = jobs.warmup_job(obj, spec, pool)
    assert "suspend" not in job["spec"] and queueing.QUEUE_NAME not in job["metadata"]["labels"]
    assert "priorityClassName" not in job["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"labels": {"compilecache.dev/cache": "other"}}, "spec.warmup.jobMetadata.labels.compilecache.dev/cache"),
        ({"labels": {"kueue.x-k8s.io/queue-name": "free"}}, "spec.warmup.jobMetadata.labels.kueue.x-k8s.io/queue-name"),
        (
            {"annotations": {"batch.kubernetes.io/job-tracking": "x"}},
            "spec.warmup.jobMetadata.annotations.batch.kubernetes.io/job-tracking",
        ),
        ({"labels": {"node.k8s.io/x": "y"}}, "spec.warmup.jobMetadata.labels.node.k8s.io/x"),
        ({"labels": {"job-name": "other"}}, "spec.warmup.jobMetadata.labels.job-name"),
    ],
)
def test_metadata_of_a_reserved_domain_is_refused_naming_it(metadata: dict[str, Any], field: str) -> None:
    obj = cache()
    obj["spec"]["warmup"]["jobMetadata"] = metadata
    with pytest.raises(SpecError) as raised:
        parse_cache(obj)
    assert raised.value.field == field


def test_a_queue_and_a_provisioning_request_exclude_each_other() -> None:
    obj = queued_cache(provisioningRequest={"className": "queued-provisioning.gke.io"})
    with pytest.raises(SpecError) as raised:
        parse_cache(obj)
    assert raised.value.field == "spec.warmup.queue" and "admission check" in str(raised.value)


def test_the_policy_bounds_queues_and_priority_classes() -> None:
    spec = parse_cache(queued_cache(priorityClassName="system-node-critical"))
    refused = policy.violations(spec, policy.DEFAULT)
    assert [path for path, _ in refused] == ["spec.warmup.priorityClassName"]
    rules = policy.parse({"queues": {"allow": ["gpu-*"]}, "priorityClasses": {"allow": ["batch-*"]}})
    refused = dict(policy.violations(parse_cache(queued_cache()), rules))
    assert set(refused) == {"spec.warmup.queue.expiryName", "spec.warmup.queue.priorityClass"}
    # Without expiryName the expiry joins name's queue: a refused name is named once, where it was written.
    alone = queued_cache()
    alone["spec"]["warmup"]["queue"] = {"name": "cpu-queue"}
    assert [path for path, _ in policy.violations(parse_cache(alone), rules)] == ["spec.warmup.queue.name"]


def test_a_queued_pool_says_what_kueue_says_and_warms_once_admitted() -> None:
    obj = queued_cache()
    first, made = created_jobs(obj)
    recorded = obj | {"status": copy.deepcopy(dict(first.status))}
    pending = ("False", "Pending", NO_QUOTA)
    waiting = decide(recorded, jobs=tuple(made), workloads=(workload(made[0], QuotaReserved=pending),))
    first_pool, second_pool = waiting.status["pools"]
    assert (first_pool["state"], first_pool["reason"]) == (status.POOL_PENDING, queueing.QUEUED)
    assert first_pool["message"] == f"queued in LocalQueue gpu-queue: {NO_QUOTA}"
    assert second_pool["reason"] == queueing.QUEUED and "no Workload yet" in second_pool["message"]
    assert "(Queued)" in waiting.status["message"] and waiting.status["phase"] == status.WARMING
    assert waiting.creates == () and waiting.deletes == ()  # nothing made twice, nothing torn down
    # Quota reserved, an admission check still Pending: that is what it waits for.
    checked = workload(made[0], QuotaReserved=("True", "QuotaReserved", ""), Admitted=("False", "NoChecks", "x"))
    checked["status"]["admissionChecks"] = [{"name": "capacity", "state": "Pending", "message": "no node yet"}]
    again = decide(recorded, jobs=tuple(made), workloads=(checked,))
    assert again.status["pools"][0]["message"].endswith("admission checks: capacity: Pending (no node yet)")
    # Admitted: Kueue unsuspended the Jobs; from here the warm-up is what it always was.
    running = [job | {"spec": {**job["spec"], "suspend": False}, "status": {"active": 1}} for job in made]
    admitted = decide(recorded, jobs=tuple(running))
    assert {p["reason"] for p in admitted.status["pools"]} == {"JobRunning"}


def test_a_queued_expiry_says_so() -> None:
    obj = queued_cache()
    first = decide(obj)
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
    # Admitted, ran and finished: Kueue had unsuspended them.
    warmed = tuple(
        dict(c.manifest) | {"spec": {**c.manifest["spec"], "suspend": False}} | done
        for c in first.creates
        if c.resource == JOBS
    )
    recorded = obj | {"status": copy.deepcopy(dict(first.status))}
    second = decide(recorded, jobs=warmed)
    [expiry] = [dict(c.manifest) for c in second.creates if c.resource == JOBS]
    expiry["metadata"]["uid"] = "expiry-uid"
    third = decide(recorded | {"status": dict(second.status)}, jobs=warmed, expiry_jobs=(expiry,))
    expired = next(c for c in third.status["conditions"] if c["type"] == expiryjob.EXPIRED_CONDITION)
    assert expired["reason"] == queueing.QUEUED and "LocalQueue cpu-queue" in expired["message"]
    assert third.status["phase"] == status.EXPIRING


def test_a_job_whose_workload_kueue_deactivated_fails_the_pool_and_the_expiry() -> None:
    # Kueue deactivates a Workload an admission check Rejected (spec.active: false): it admits it no
    # more and the Job stays suspended, so the pool is not queued but failed, with Kueue's words.
    obj = queued_cache()
    first, made = created_jobs(obj)
    said = "The workload is deactivated due to AdmissionCheck capacity: no such GPU"
    rejected = workload(made[0], QuotaReserved=("False", "Pending", "x"), Evicted=("True", "InactiveWorkload", said))
    rejected["spec"] = {"active": False}
    recorded = obj | {"status": copy.deepcopy(dict(first.status))}
    decided = decide(recorded, jobs=tuple(made), workloads=(rejected,))
    failed, other = decided.status["pools"]
    assert (failed["state"], failed["reason"]) == (status.POOL_FAILED, queueing.DEACTIVATED)
    assert failed["message"].endswith(f"LocalQueue gpu-queue, and admits it no more: {said}")
    assert other["reason"] == queueing.QUEUED  # its Workload is active: still queued
    # The expiry Job's Workload deactivated: the expiry failed, it does not stay Expiring.
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
    warmed = tuple(job | {"spec": {**job["spec"], "suspend": False}} | done for job in made)
    second = decide(recorded, jobs=warmed)
    [expiry] = [dict(c.manifest) for c in second.creates if c.resource == JOBS]
    expiry["metadata"]["uid"] = "expiry-uid"
    gone = workload(expiry, Evicted=("True", "InactiveWorkload", said)) | {"spec": {"active": False}}
    third = decide(recorded | {"status": dict(second.status)}, jobs=warmed, expiry_jobs=(expiry,), workloads=(gone,))
    expired = next(c for c in third.status["conditions"] if c["type"] == expiryjob.EXPIRED_CONDITION)
    assert expired["reason"] == queueing.DEACTIVATED and expired["message"].startswith("expiry failed: Kueue")
