"""A running warm-up Job whose pod is stuck says so within one pass (pure: plan over snapshots, no server).

The pods are shaped as a kubelet and the scheduler write them (reasons and messages as
``kubectl describe pod`` shows them); the printer columns' JSONPaths are evaluated on the status.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from compilecache.controller import expiryjob, metrics, metricsfeed, plan, podstate, status
from compilecache.controller.kube import JOBS
from compilecache.controller.snapshot import Cache, Snapshot
from specs import cache, cluster

NOW = "2026-11-21T10:00:00Z"
CLAIM = {"metadata": {"name": "jax-cache", "labels": {"compilecache.dev/cache": "llama"}}, "status": {"phase": "Bound"}}
PULL = 'Back-off pulling image "registry.example/nonexistent:1.2"'
SCHEDULER = "0/6 nodes are available: 4 node(s) didn't match Pod's node affinity/selector, 2 Insufficient cpu."
CRD = yaml.safe_load((Path(__file__).resolve().parent.parent / "crds" / "compilecache.yaml").read_text())


def running(create: plan.Create) -> dict[str, Any]:
    job = copy.deepcopy(dict(create.manifest))
    job["status"] = {"startTime": "2026-11-21T09:59:00Z", "active": 1}  # the Job controller counts a Pending pod
    return job


def pod_of(job: dict[str, Any], created: str = "2026-11-21T09:59:00Z", **pod_status: Any) -> dict[str, Any]:
    name = job["metadata"]["name"]
    meta = {"name": f"{name}-abcde", "creationTimestamp": created, "labels": {"job-name": name}}
    return {"metadata": meta, "status": {"phase": "Pending", **pod_status}}


def image_pull(reason: str = "ImagePullBackOff") -> dict[str, Any]:
    waiting = {"reason": reason, "message": PULL}
    return {"containerStatuses": [{"name": "warm", "ready": False, "state": {"waiting": waiting}}]}


def unschedulable(since: str = "2026-11-21T09:59:00Z") -> dict[str, Any]:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": SCHEDULER,
        "lastTransitionTime": since,
    }
    return {"conditions": [condition]}


def first_pass() -> tuple[plan.Plan, list[dict[str, Any]]]:
    first = plan.plan(Snapshot(Cache.read(cache()), nodes=tuple(cluster())), NOW)
    return first, [running(c) for c in first.creates if c.resource == JOBS]


def next_pass(previous: plan.Plan, jobs_: list[dict[str, Any]], pods: list[dict[str, Any]], now: str = NOW) -> Any:
    obj = cache() | {"status": copy.deepcopy(dict(previous.status))}
    parts = {"claim": CLAIM, "nodes": tuple(cluster()), "jobs": tuple(jobs_), "warmup_pods": tuple(pods)}
    return plan.plan(Snapshot(Cache.read(obj), **parts), now)


def column(name: str, obj_status: dict[str, Any]) -> Any:
    """A printer column's value, its JSONPath evaluated on the status as kubectl does for these simple paths."""
    [version] = CRD["spec"]["versions"]
    [path] = [c["jsonPath"] for c in version["additionalPrinterColumns"] if c["name"] == name]
    value: Any = {"status": obj_status}
    for part in path.lstrip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def pool_of(decided: plan.Plan, job: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in decided.status["pools"] if p.get("job") == job["metadata"]["name"])


def test_an_image_that_cannot_be_pulled_shows_in_the_pool_the_columns_the_condition_and_one_event() -> None:
    first, jobs_ = first_pass()
    stuck = next_pass(first, jobs_, [pod_of(jobs_[0], **image_pull())])
    pool = pool_of(stuck, jobs_[0])
    assert (pool["state"], pool["reason"]) == (status.POOL_PENDING, "ImagePullBackOff")  # not "Running"
    assert PULL in pool["message"] and "container warm" in pool["message"]
    assert pool_of(stuck, jobs_[1])["reason"] == "JobRunning"  # the other pool's pod is fine
    assert column("Reason", stuck.status) == "ImagePullBackOff"
    assert "(ImagePullBackOff)" in column("Message", stuck.status)
    progressing = next(c for c in stuck.status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ImagePullBackOff")
    assert PULL in progressing["message"]
    pulls = [(e.type, e.reason) for e in stuck.events if e.reason == "ImagePullBackOff"]
    assert pulls == [("Warning", "ImagePullBackOff")]
    # The kubelet alternates ErrImagePull and ImagePullBackOff: no Event storm.
    again = next_pass(stuck, jobs_, [pod_of(jobs_[0], **image_pull("ErrImagePull"))])
    assert pool_of(again, jobs_[0])["reason"] == "ErrImagePull" and again.events == ()
    # The image came: the pod runs, the condition says so.
    fixed = next_pass(again, jobs_, [pod_of(jobs_[0], phase="Running")])
    assert pool_of(fixed, jobs_[0])["reason"] == "JobRunning" and "reason" not in fixed.status
    progressing = next(c for c in fixed.status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", podstate.NO_STUCK_PODS)


def test_a_pod_that_fits_no_node_waits_for_capacity_and_fails_the_pool_at_capacity_timeout() -> None:
    first, jobs_ = first_pass()
    pods = [pod_of(job, **unschedulable()) for job in jobs_]
    stuck = next_pass(first, jobs_, pods, "2026-11-21T10:05:00Z")
    assert {(p["reason"], p["message"]) for p in stuck.status["pools"]} == {
        ("WaitingForCapacity", f"waiting for a node: {SCHEDULER}")
    }
    assert stuck.status["phase"] == status.WARMING and column("Reason", stuck.status) == "WaitingForCapacity"
    # Past the old 10-minute deadline, within capacityTimeout (15m by default): still waiting.
    waiting = next_pass(stuck, jobs_, pods, "2026-11-21T10:13:00Z")
    assert {p["state"] for p in waiting.status["pools"]} == {status.POOL_PENDING}
    late = next_pass(waiting, jobs_, pods, "2026-11-21T10:14:01Z")  # more than 15 min after 09:59
    assert {p["state"] for p in late.status["pools"]} == {status.POOL_FAILED}
    assert all(p["message"].endswith("(for more than 15 min (capacityTimeout))") for p in late.status["pools"])
    assert late.status["phase"] == status.FAILED and late.creates == () and late.deletes == ()
    assert column("Reason", late.status) == "WaitingForCapacity"
    assert ("Warning", "PoolFailed") in [(e.type, e.reason) for e in late.events]


def test_capacity_timeout_is_the_caches_own() -> None:
    obj = cache()
    obj["spec"]["warmup"]["capacityTimeout"] = "1h"
    first = plan.plan(Snapshot(Cache.read(obj), nodes=tuple(cluster())), NOW)
    jobs_ = [running(c) for c in first.creates if c.resource == JOBS]
    pods = tuple(pod_of(job, **unschedulable()) for job in jobs_)
    parts = {"claim": CLAIM, "nodes": tuple(cluster()), "jobs": tuple(jobs_), "warmup_pods": pods}
    recorded = obj | {"status": copy.deepcopy(dict(first.status))}
    at = plan.plan(Snapshot(Cache.read(recorded), **parts), "2026-11-21T10:58:00Z")
    assert {p["state"] for p in at.status["pools"]} == {status.POOL_PENDING}
    past = plan.plan(Snapshot(Cache.read(recorded), **parts), "2026-11-21T11:00:01Z")
    assert {p["state"] for p in past.status["pools"]} == {status.POOL_FAILED}
    assert all("(for more than 60 min (capacityTimeout))" in p["message"] for p in past.status["pools"])


def event(
    pod: dict[str, Any], reason: str, message: str, when: str, source: str = "cluster-autoscaler"
) -> dict[str, Any]:
    """An Event on the pod as Cluster Autoscaler or Karpenter posts it (core v1, as `kubectl get events` lists)."""
    involved = {"kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    return {
        "metadata": {"name": f"{pod['metadata']['name']}.{reason.lower()}", "creationTimestamp": when},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": source},
        "lastTimestamp": when,
        "count": 1,
    }


SCALE_UP = "pod triggered scale-up: [{h100-pool 0->1 (max: 4)}]"
NO_SCALE_UP = (
    "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector, 1 max node group size reached"
)


@pytest.mark.parametrize(
    ("said", "reason", "words"),
    [
        ([("TriggeredScaleUp", SCALE_UP, "cluster-autoscaler")], "WaitingForCapacity", f"TriggeredScaleUp: {SCALE_UP}"),
        ([("NotTriggerScaleUp", NO_SCALE_UP, "cluster-autoscaler")], "NotTriggerScaleUp", NO_SCALE_UP),
        # The newest word counts: a refusal, then a scale-up once the group's max was raised.
        (
            [("NotTriggerScaleUp", NO_SCALE_UP, "cluster-autoscaler"), ("TriggeredScaleUp", SCALE_UP, "x")],
            "WaitingForCapacity",
            SCALE_UP,
        ),
        (
            [("Nominated", "Pod should schedule on: nodeclaim/gpu-x7k2p", "karpenter")],
            "WaitingForCapacity",
            "nodeclaim",
        ),
        (
            [("FailedScheduling", 'Failed to schedule pod, incompatible with nodepool "gpu"', "karpenter")],
            "NotTriggerScaleUp",
            "incompatible with nodepool",
        ),
        # The scheduler's own FailedScheduling is no autoscaler's word.
        ([("FailedScheduling", "0/3 nodes are available", "default-scheduler")], "WaitingForCapacity", SCHEDULER),
    ],
)
def test_the_pool_says_what_the_autoscaler_said(said: list[tuple[str, str, str]], reason: str, words: str) -> None:
    first, jobs_ = first_pass()
    pods = [
        pod_of(job, **unschedulable()) | {"metadata": {**pod_of(job)["metadata"], "uid": f"u-{i}"}}
        for i, job in enumerate(jobs_)
    ]
    times = ["2026-11-21T09:59:10Z", "2026-11-21T09:59:40Z"]
    events = {
        f"u-{i}": tuple(event(pod, r, m, times[k], src) for k, (r, m, src) in enumerate(said))
        for i, pod in enumerate(pods)
    }
    obj = cache() | {"status": copy.deepcopy(dict(first.status))}
    parts = {
        "claim": CLAIM,
        "nodes": tuple(cluster()),
        "jobs": tuple(jobs_),
        "warmup_pods": tuple(pods),
        "events": events,
    }
    decided = plan.plan(Snapshot(Cache.read(obj), **parts), "2026-11-21T10:01:00Z")
    for pool in decided.status["pools"]:
        assert (pool["state"], pool["reason"]) == (status.POOL_PENDING, reason), pool
        assert words in pool["message"] and SCHEDULER in pool["message"], pool["message"]
    assert column("Reason", decided.status) == reason
    progressing = next(c for c in decided.status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == reason


def test_an_oom_kill_names_itself_while_the_job_retries_and_when_it_failed() -> None:
    first, jobs_ = first_pass()
    killed = {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-21T09:59:30Z"}
    old = pod_of(jobs_[0], phase="Failed", containerStatuses=[{"name": "warm", "state": {"terminated": killed}}])
    old["status"]["phase"] = "Failed"
    retry = pod_of(jobs_[0], "2026-11-21T09:59:40Z", phase="Running")
    retrying = next_pass(first, jobs_, [old, retry])
    pool = pool_of(retrying, jobs_[0])
    assert (pool["state"], pool["reason"]) == (status.POOL_RUNNING, "OOMKilled") and "memory limit" in pool["message"]
    failed_job = copy.deepcopy(jobs_[0])
    failed_job["status"] = {
        "active": 0,
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}],
    }
    done = next_pass(retrying, [failed_job, jobs_[1]], [old])
    pool = pool_of(done, failed_job)
    assert (pool["state"], pool["reason"]) == (status.POOL_FAILED, "OOMKilled")
    assert done.status["reason"] == "OOMKilled"  # the Reason column says what the pool died of
    progressing = next(c for c in done.status["conditions"] if c["type"] == "Progressing")
    assert progressing["status"] == "True"  # history: nothing is stuck now


def test_one_stuck_process_of_a_multi_host_job_is_the_pools_reason() -> None:
    first, jobs_ = first_pass()
    placed = pod_of(jobs_[0], "2026-11-21T09:59:00Z", phase="Running")
    waiting = pod_of(jobs_[0], "2026-11-21T09:59:00Z", **unschedulable())
    waiting["metadata"]["name"] += "-1"
    stuck = next_pass(first, jobs_, [placed, waiting])
    assert pool_of(stuck, jobs_[0])["reason"] == "WaitingForCapacity"
    assert podstate.problem([placed]) is None


@pytest.mark.parametrize("reason", ["CreateContainerConfigError", "CrashLoopBackOff", "InvalidImageName"])
def test_other_waiting_reasons_reach_the_pool(reason: str) -> None:
    first, jobs_ = first_pass()
    waiting = {"containerStatuses": [{"name": "warm", "state": {"waiting": {"reason": reason, "message": "m"}}}]}
    stuck = next_pass(first, jobs_, [pod_of(jobs_[0], **waiting)])
    assert pool_of(stuck, jobs_[0])["reason"] == reason and stuck.status["reason"] == reason


def test_a_stuck_expiry_pod_reaches_the_expired_condition() -> None:
    job = {"metadata": {"name": "e"}, "status": {"active": 1}}
    outcome = expiryjob.outcome(job, [pod_of(job, **image_pull())], NOW)
    assert (outcome.phase, outcome.reason) == (status.EXPIRING, "ImagePullBackOff")
    late = expiryjob.outcome(job, [pod_of(job, "2026-11-21T09:40:00Z", **image_pull())], NOW)
    assert (late.phase, late.reason) == (status.FAILED, "ImagePullBackOff")


def test_the_stuck_pods_gauge_counts_by_reason() -> None:
    first, jobs_ = first_pass()
    stuck = next_pass(first, jobs_, [pod_of(job, **unschedulable()) for job in jobs_])
    m = metrics.Metrics()
    metricsfeed.observe_cache(m, "ns", "c", dict(stuck.status))
    values = {
        sample.labels["reason"]: sample.value
        for family in m.registry.collect()
        if family.name == "compilecache_stuck_pods"
        for sample in family.samples
    }
    assert values["WaitingForCapacity"] == 2 and values["ImagePullBackOff"] == 0
    assert set(values) == set(podstate.REASONS)
