"""Pools that scale from zero, capacity bounds, disruptions and the gates of a cache that can warm nothing
(issue 31): pure plans over snapshots shaped as the scheduler, the kubelet and the Job controller write them."""

from __future__ import annotations

import copy
import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.controller import expiryjob, gates, jobs, plan, podstate, provisioning, status
from compilecache.controller.api import Consumers, parse_cache
from compilecache.controller.kube import JOBS, PROVISIONING_REQUESTS
from compilecache.controller.snapshot import Cache, Snapshot
from compilecache.controller.template import PODTEMPLATES
from specs import PRODUCT, cache, cluster

NOW = "2026-11-21T10:00:00Z"
CLAIM = {"metadata": {"name": "jax-cache", "labels": {"compilecache.dev/cache": "llama"}}, "status": {"phase": "Bound"}}
L4 = {
    "name": "l4",
    "nodeSelector": {PRODUCT: "NVIDIA-L4"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
}


def scaled(gpus: int | None = 1, **warmup: Any) -> dict[str, Any]:
    """A cache whose only pool (l4) has no node in ``cluster()``; ``gpus``: its declared gpusPerPod."""
    obj = cache()
    pool = dict(L4) | ({"gpusPerPod": gpus} if gpus is not None else {})
    obj["spec"]["warmup"].pop("discover")
    obj["spec"]["warmup"] |= {"pools": [pool], **warmup}
    return obj


def decide(obj: dict[str, Any], now: str = NOW, **parts: Any) -> plan.Plan:
    return plan.plan(Snapshot(Cache.read(obj), claim=CLAIM, nodes=tuple(cluster()), **parts), now)


def recorded(obj: dict[str, Any], decided: plan.Plan) -> dict[str, Any]:
    return obj | {"status": copy.deepcopy(dict(decided.status))}


def job_of(decided: plan.Plan, **job_status: Any) -> dict[str, Any]:
    [create] = [c for c in decided.creates if c.resource == JOBS]
    job = copy.deepcopy(dict(create.manifest))
    job["status"] = {"startTime": "2026-11-21T09:59:00Z", **job_status}
    return job


def pod(job: dict[str, Any], name: str, created: str, phase: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    labels = {"job-name": job["metadata"]["name"]}
    meta = {"name": name, "uid": f"uid-{name}", "creationTimestamp": created, "labels": labels}
    return {"metadata": meta, "status": {"phase": phase, "conditions": list(conditions)}}


def unschedulable(since: str = "2026-11-21T09:59:00Z") -> dict[str, Any]:
    message = "0/6 nodes are available: 6 node(s) didn't match Pod's node affinity/selector."
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": since,
    }


def disrupted(when: str) -> dict[str, Any]:
    # As the kubelet writes it on graceful node shutdown (a spot reclaim): "Pod disruption conditions".
    message = "Pod was terminated in response to imminent node shutdown."
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "TerminationByKubelet",
        "message": message,
        "lastTransitionTime": when,
    }


def test_a_pool_with_no_node_and_declared_gpus_gets_its_job_with_the_placement_an_autoscaler_reads() -> None:
    decided = decide(scaled(gpus=4))
    [entry] = decided.status["pools"]
    assert (entry["state"], entry["reason"], entry["nodes"]) == (status.POOL_PENDING, "JobCreated", 0)
    assert entry["gpusPerPod"] == 4
    job = job_of(decided)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {PRODUCT: "NVIDIA-L4"}
    assert pod_spec["tolerations"] == L4["tolerations"]
    assert pod_spec["containers"][-1]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert decided.status["phase"] == status.WARMING


def test_a_pool_with_no_node_and_no_declared_gpus_stays_no_nodes_and_says_how_to_warm_it() -> None:
    decided = decide(scaled(gpus=None))
    [entry] = decided.status["pools"]
    assert entry["state"] == status.POOL_NO_NODES and "declare gpusPerPod" in entry["message"]
    assert [c for c in decided.creates if c.resource == JOBS] == []
    assert decided.status["phase"] == status.PENDING


@settings(max_examples=60, deadline=None)
@given(timeout=st.integers(min_value=1, max_value=14 * 86400), waited=st.integers(min_value=0, max_value=15 * 86400))
def test_a_waiting_pool_fails_exactly_when_it_waited_past_its_capacity_timeout(timeout: int, waited: int) -> None:
    obj = scaled(capacityTimeout=f"{timeout}s")
    first = decide(obj)
    job = job_of(first, active=1)
    since = datetime.datetime(2026, 11, 21, 9, 59, tzinfo=datetime.UTC)
    now = (since + datetime.timedelta(seconds=waited)).strftime("%Y-%m-%dT%H:%M:%SZ")
    waiting = pod(job, "w", "2026-11-21T09:59:00Z", "Pending", unschedulable())
    decided = decide(recorded(obj, first), now, jobs=(job,), warmup_pods=(waiting,))
    [entry] = decided.status["pools"]
    assert entry["reason"] == podstate.WAITING_FOR_CAPACITY
    assert entry["state"] == (status.POOL_FAILED if waited > timeout else status.POOL_PENDING), (timeout, waited)


def test_a_cache_that_can_warm_nothing_releases_its_gated_pods_at_the_bound() -> None:
    obj = scaled(capacityTimeout="10m")
    first = decide(obj)
    job = job_of(first, active=1)
    waiting = pod(job, "w", "2026-11-21T09:59:00Z", "Pending", unschedulable())
    trainer = {
        "metadata": {
            "name": "trainer",
            "creationTimestamp": "2026-11-21T09:58:00Z",
            "labels": {"compilecache.dev/cache": "llama"},
        },
        "spec": {"schedulingGates": [{"name": "compilecache.dev/warm"}]},
    }
    before = decide(recorded(obj, first), "2026-11-21T10:08:00Z", jobs=(job,), warmup_pods=(waiting,), pods=(trainer,))
    assert before.releases == ()  # still waiting for the node: held
    after = decide(recorded(obj, before), "2026-11-21T10:09:30Z", jobs=(job,), warmup_pods=(waiting,), pods=(trainer,))
    assert after.status["phase"] == status.FAILED
    assert [(r.pod, r.reason) for r in after.releases] == [("trainer", gates.CACHE_FAILED)]


def test_only_a_warm_up_that_ended_on_every_pool_releases_a_failed_caches_pods() -> None:
    trainer = {
        "metadata": {"name": "t", "creationTimestamp": "2026-11-21T09:59:00Z"},
        "spec": {"schedulingGates": [{"name": "compilecache.dev/warm"}]},
    }
    now = datetime.datetime(2026, 11, 21, 10, 0, tzinfo=datetime.UTC)
    ended = {"phase": "Failed", "pools": [{"name": "a", "state": "Failed"}, {"name": "b", "state": "NoNodes"}]}
    bad_input = {"phase": "Failed"}  # no pools: an invalid spec, the policy, a pass's error
    assert status.settled(ended) and not status.settled(bad_input)
    assert not status.settled(
        {"phase": "Failed", "pools": [{"name": "a", "state": "Failed"}, {"name": "b", "state": "Running"}]}
    )
    assert gates.reason_to_release(trainer, Consumers(), phase="Failed", now=now, settled=True) == gates.CACHE_FAILED
    assert gates.reason_to_release(trainer, Consumers(), phase="Failed", now=now, settled=False) is None


def test_a_disrupted_warm_up_pod_is_counted_and_said_while_its_retry_waits_and_runs() -> None:
    obj = scaled()
    first = decide(obj)
    job = job_of(first, active=0)  # the Job controller ignored the disrupted pod: no failure counted
    cut = pod(job, "a", "2026-11-21T09:59:00Z", "Failed", disrupted("2026-11-21T09:59:30Z"))
    retry = pod(job, "b", "2026-11-21T09:59:31Z", "Pending")
    waiting = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut, retry))
    [entry] = waiting.status["pools"]
    assert (entry["state"], entry["reason"], entry["disruptions"]) == (status.POOL_PENDING, status.PREEMPTED, 1)
    assert "preempted once, retrying" in entry["message"] and "TerminationByKubelet" in entry["message"]
    assert ("Warning", status.PREEMPTED) in [(e.type, e.reason) for e in waiting.events]
    # The retry waits for a new node (the old one is gone): that is the reason, the disruption is said too.
    stuck = pod(job, "b", "2026-11-21T09:59:31Z", "Pending", unschedulable("2026-11-21T09:59:32Z"))
    again = decide(recorded(obj, waiting), jobs=(job,), warmup_pods=(cut, stuck))
    [entry] = again.status["pools"]
    assert entry["reason"] == podstate.WAITING_FOR_CAPACITY and entry["message"].startswith("preempted once")
    assert status.PREEMPTED not in [e.reason for e in again.events]  # counted once
    # It runs: the Job's own state, the count stays.
    running_job = job_of(first, active=1)
    runs = pod(job, "b", "2026-11-21T09:59:31Z", "Running")
    running = decide(recorded(obj, again), jobs=(running_job,), warmup_pods=(cut, runs))
    [entry] = running.status["pools"]
    assert (entry["state"], entry["reason"], entry["disruptions"]) == (status.POOL_RUNNING, "JobRunning", 1)
    # Succeeded, its pods collected (TTL or PodGC): the count stands as the record.
    done_job = job_of(first, succeeded=1, conditions=[{"type": "Complete", "status": "True"}])
    done = decide(recorded(obj, running), jobs=(done_job,), warmup_pods=())
    assert done.status["pools"][0]["disruptions"] == 1


def test_warm_up_and_expiry_jobs_retry_a_disrupted_pod_without_counting_it() -> None:
    decided = decide(scaled())
    job = job_of(decided)
    assert job["spec"]["podFailurePolicy"] == jobs.POD_FAILURE_POLICY
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # what a podFailurePolicy requires
    [rule] = jobs.POD_FAILURE_POLICY["rules"]
    assert rule["action"] == "Ignore" and rule["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    expiry = expiryjob.expiry_job(cache(), parse_cache(cache()), ["a"])
    assert expiry["spec"]["podFailurePolicy"] == jobs.POD_FAILURE_POLICY


# --- capacity on request: ProvisioningRequests (provisioning.py) -----------------------------------------

QUEUED = {"className": "queued-provisioning.gke.io", "parameters": {"maxRunDurationSeconds": "7200"}}


def request_of(decided: plan.Plan, at: str = NOW, **conditions: tuple[str, str]) -> dict[str, Any]:
    """The plan's ProvisioningRequest as the API holds it, with ``conditions`` (type → (status, reason))."""
    [create] = [c for c in decided.creates if c.resource == PROVISIONING_REQUESTS]
    obj = copy.deepcopy(dict(create.manifest))
    obj["metadata"]["creationTimestamp"] = "2026-11-21T09:59:00Z"
    obj["status"] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": f"{r} said", "lastTransitionTime": at}
            for t, (s, r) in conditions.items()
        ]
    }
    return obj


def test_a_cache_that_asks_for_capacity_makes_the_template_the_request_and_a_suspended_job_in_that_order() -> None:
    obj = scaled(gpus=2, provisioningRequest=QUEUED, topologies=[{"hosts": 2}])
    decided = decide(obj)
    kinds = [c.resource.plural for c in decided.creates if c.resource.plural != "persistentvolumeclaims"]
    assert kinds == ["podtemplates", "provisioningrequests", "services", "jobs"]
    template, request, _, job = [c.manifest for c in decided.creates if c.resource.plural != "persistentvolumeclaims"]
    name = job["metadata"]["name"]
    assert template["metadata"]["name"] == request["metadata"]["name"] == name
    assert template["template"] == job["spec"]["template"]  # what the autoscaler simulates is what will run
    assert request["spec"] == {
        "provisioningClassName": "queued-provisioning.gke.io",
        "parameters": {"maxRunDurationSeconds": "7200"},
        "podSets": [{"podTemplateRef": {"name": name}, "count": 2}],  # every host at once
    }
    assert job["spec"]["suspend"] is True
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations[provisioning.CONSUME] == name and annotations[provisioning.CLASS] == "queued-provisioning.gke.io"
    for made in (template, request):
        assert made["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert made["metadata"]["labels"]["compilecache.dev/cache"] == "llama"


def test_the_request_decides_the_pool_and_the_job_starts_once_it_is_provisioned() -> None:
    obj = scaled(provisioningRequest=QUEUED, capacityTimeout="1h")
    first = decide(obj)
    job = job_of(first)
    accepted = request_of(first, Accepted=("True", "Accepted"), Provisioned=("False", "CapacityIsNotFound"))
    waiting = decide(recorded(obj, first), jobs=(job,), requests=(accepted,))
    [entry] = waiting.status["pools"]
    assert (entry["state"], entry["reason"]) == (status.POOL_PENDING, podstate.WAITING_FOR_CAPACITY)
    assert "Provisioned=False (CapacityIsNotFound: CapacityIsNotFound said)" in entry["message"], entry
    assert waiting.patches == () and waiting.creates == ()  # nothing made twice
    late = decide(recorded(obj, waiting), "2026-11-21T11:00:01Z", jobs=(job,), requests=(accepted,))
    assert (
        late.status["pools"][0]["state"] == status.POOL_FAILED
        and "capacityTimeout" in late.status["pools"][0]["message"]
    )
    done = request_of(first, Accepted=("True", "Accepted"), Provisioned=("True", "Provisioned"))
    go = decide(recorded(obj, waiting), jobs=(job,), requests=(done,))
    assert [(p.resource, p.name, p.patch) for p in go.patches] == [
        (JOBS, job["metadata"]["name"], {"spec": {"suspend": False}})
    ]
    refused = request_of(first, Failed=("True", "CapacityIsNotFound"))
    failed = decide(recorded(obj, waiting), jobs=(job,), requests=(refused,))
    assert (failed.status["pools"][0]["state"], failed.status["pools"][0]["reason"]) == (
        "Failed",
        provisioning.PROVISIONING_FAILED,
    )
    assert failed.patches == ()
    # Let go and finished: the request and its template go; a running Job keeps its own.
    running = copy.deepcopy(job) | {"spec": {**job["spec"], "suspend": False}}
    running["status"] = {"active": 1}
    kept = decide(recorded(obj, go), jobs=(running,), requests=(done,))
    assert [d for d in kept.deletes if d.resource == PROVISIONING_REQUESTS] == []
    running["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    ended = decide(recorded(obj, kept), jobs=(running,), requests=(done,))
    gone = {(d.resource.plural, d.name) for d in ended.deletes}
    assert {("provisioningrequests", job["metadata"]["name"]), ("podtemplates", job["metadata"]["name"])} <= gone


def test_a_cluster_without_provisioning_requests_says_so_in_the_pool() -> None:
    obj = scaled(provisioningRequest=QUEUED)
    first = decide(obj)
    [request] = [c for c in first.creates if c.resource == PROVISIONING_REQUESTS]
    answer = 'the server could not find the requested resource (404: "provisioningrequests.autoscaling.x-k8s.io")'
    parts = {"claim": CLAIM, "nodes": tuple(cluster()), "created": frozenset({f"podtemplates/{request.name}"})}
    snapshot = Snapshot(Cache.read(obj), **parts).after(frozenset(), {request.key: answer})
    decided = plan.plan(snapshot, NOW)
    [entry] = decided.status["pools"]
    assert (entry["state"], entry["reason"]) == (status.POOL_FAILED, provisioning.REQUEST_REJECTED)
    assert "ProvisioningRequest" in entry["message"] and "404" in entry["message"]
    assert [c for c in decided.creates if c.resource == JOBS] == []


def test_a_multi_host_warm_up_a_disruption_failed_starts_again_as_a_whole_group_a_bounded_number_of_times() -> None:
    obj = scaled(gpus=2, topologies=[{"hosts": 2}])
    first = decide(obj)
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}]}
    job = job_of(first, **failed)
    cut = pod(job, "p0", "2026-11-21T09:59:00Z", "Failed", disrupted("2026-11-21T09:59:30Z"))
    peer = pod(job, "p1", "2026-11-21T09:59:00Z", "Failed")  # lost its member: its failure counted
    decided = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut, peer))
    [entry] = decided.status["pools"]
    assert (entry["state"], entry["reason"], entry["disruptions"]) == (status.POOL_PENDING, status.PREEMPTED, 1)
    assert "regroup" not in entry and "starts again in a new Job" in entry["message"]
    assert [(d.resource, d.name) for d in decided.deletes if d.resource == JOBS] == [(JOBS, job["metadata"]["name"])]
    assert decided.status["phase"] == status.WARMING  # not Failed: training stays held for the retry
    # The same Job seen again before its deletion shows: not counted twice.
    stale = decide(recorded(obj, decided), jobs=(job,), warmup_pods=(cut, peer))
    assert stale.status["pools"][0]["disruptions"] == 1
    # Gone: made again under its name, the count carried.
    again = decide(recorded(obj, stale))
    [entry] = again.status["pools"]
    assert (entry["reason"], entry["disruptions"]) == ("JobCreated", 1)
    assert [c.name for c in again.creates if c.resource == JOBS] == [job["metadata"]["name"]]
    # Past the bound: the failure stands.
    worn = recorded(obj, again)
    worn["status"]["pools"][0]["disruptions"] = status.REGROUP_MAX
    later = job_of(first, **failed) | {}
    later["status"]["startTime"] = "2026-11-21T10:30:00Z"
    done = decide(worn, jobs=(later,), warmup_pods=(cut, peer))
    assert done.status["pools"][0]["state"] == status.POOL_FAILED
    assert [d for d in done.deletes if d.resource == JOBS] == []
    # A failure without a disruption is one, as before.
    plain = decide(recorded(obj, first), jobs=(job,), warmup_pods=(peer,))
    assert plain.status["pools"][0]["state"] == status.POOL_FAILED


def test_a_provisioned_node_lost_to_a_disruption_is_asked_for_again() -> None:
    obj = scaled(provisioningRequest=QUEUED)
    first = decide(obj)
    job = job_of(first, active=1)
    job["spec"]["suspend"] = False
    provisioned_at = "2026-11-21T09:59:10Z"
    done = request_of(first, provisioned_at, Accepted=("True", "Accepted"), Provisioned=("True", "Provisioned"))
    cut = pod(job, "a", "2026-11-21T09:59:00Z", "Failed", disrupted("2026-11-21T09:59:30Z"))
    retry = pod(job, "b", "2026-11-21T09:59:31Z", "Pending", unschedulable("2026-11-21T09:59:32Z"))
    decided = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut, retry), requests=(done,))
    assert [(d.resource, d.name) for d in decided.deletes] == [(PROVISIONING_REQUESTS, job["metadata"]["name"])]
    # Gone: made again (its PodTemplate exists: a 409 the pass reads as made), not deleted again.
    again = decide(recorded(obj, decided), jobs=(job,), warmup_pods=(cut, retry))
    assert [c.resource for c in again.creates] == [PODTEMPLATES, PROVISIONING_REQUESTS]
    waiting = request_of(first, Accepted=("True", "Accepted"))
    settled = decide(recorded(obj, again), jobs=(job,), warmup_pods=(cut, retry), requests=(waiting,))
    assert settled.deletes == () and settled.creates == ()
    # Running on the first node: nothing lost.
    runs = pod(job, "b", "2026-11-21T09:59:31Z", "Running")
    fine = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut, runs), requests=(done,))
    assert fine.deletes == ()
    # The request made again is provisioned after the disruption: its retry not yet placed is no new loss.
    anew = request_of(first, "2026-11-21T09:59:40Z", Provisioned=("True", "Provisioned"))
    coming = decide(recorded(obj, settled), jobs=(job,), warmup_pods=(cut, retry), requests=(anew,))
    assert coming.deletes == ()


def test_a_disruption_seen_while_the_group_runs_is_counted_once_when_the_group_fails_and_starts_again() -> None:
    # The lost member is seen while its peers still run (they fail later, on its heartbeat): counted then,
    # not again when the Job fails and the group starts again.
    obj = scaled(gpus=2, topologies=[{"hosts": 2}])
    first = decide(obj)
    job = job_of(first, active=1)
    cut = pod(job, "p0", "2026-11-21T09:59:00Z", "Failed", disrupted("2026-11-21T09:59:30Z"))
    peer = pod(job, "p1", "2026-11-21T09:59:00Z", "Running")
    retry = pod(job, "p0b", "2026-11-21T09:59:31Z", "Running")  # the Job controller's replacement of p0
    running = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut, peer, retry))
    assert running.status["pools"][0]["disruptions"] == 1
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}]}
    ended = job_of(first, **failed)
    lost = pod(job, "p1", "2026-11-21T09:59:00Z", "Failed")
    gone = pod(job, "p0b", "2026-11-21T09:59:31Z", "Failed")
    decided = decide(recorded(obj, running), jobs=(ended,), warmup_pods=(cut, lost, gone))
    [entry] = decided.status["pools"]
    assert (entry["reason"], entry["disruptions"]) == (status.PREEMPTED, 1), entry
    assert [e.reason for e in decided.events].count(status.PREEMPTED) == 0  # said once, when it was counted
    assert [d.name for d in decided.deletes if d.resource == JOBS] == [job["metadata"]["name"]]


def test_a_second_disruption_is_counted_after_the_first_pod_was_collected() -> None:
    # PodGC deletes the pods of a Node that is gone (a reclaimed spot node), Failed ones too: the next
    # disruption's pod is then the only one a pass sees, and is counted on top of the first.
    obj = scaled()
    first = decide(obj)
    job = job_of(first, active=1)
    cut = pod(job, "a", "2026-11-21T09:59:00Z", "Failed", disrupted("2026-11-21T09:59:30Z"))
    retry = pod(job, "b", "2026-11-21T09:59:31Z", "Running")
    once = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut, retry))
    assert once.status["pools"][0]["disruptions"] == 1
    collected = decide(recorded(obj, once), jobs=(job,), warmup_pods=(retry,))
    assert collected.status["pools"][0]["disruptions"] == 1
    cut_again = pod(job, "b", "2026-11-21T09:59:31Z", "Failed", disrupted("2026-11-21T09:59:50Z"))
    third = pod(job, "c", "2026-11-21T09:59:51Z", "Pending")
    twice = decide(recorded(obj, collected), jobs=(job,), warmup_pods=(cut_again, third))
    [entry] = twice.status["pools"]
    assert (entry["disruptions"], entry["reason"]) == (2, status.PREEMPTED), entry
    assert "preempted 2 times" in entry["message"]
    assert status.PREEMPTED in [e.reason for e in twice.events]


def test_a_group_made_again_that_fails_by_itself_is_not_made_again_for_its_predecessors_disruption() -> None:
    # The deleted Job's pods carry the same job-name until the garbage collector deletes them: the new
    # Job's own failure (a crash, no disruption since it started) is a failure, not a lost member.
    obj = scaled(gpus=2, topologies=[{"hosts": 2}])
    first = decide(obj)
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}]}
    job = job_of(first, **failed)
    cut = pod(job, "p0", "2026-11-21T09:59:00Z", "Failed", disrupted("2026-11-21T09:59:30Z"))
    regrouped = decide(recorded(obj, first), jobs=(job,), warmup_pods=(cut,))
    again = decide(recorded(obj, regrouped))  # the old Job gone: made again
    crashed = job_of(first, **failed)
    crashed["status"]["startTime"] = "2026-11-21T10:01:00Z"
    peer = pod(job, "q1", "2026-11-21T10:01:00Z", "Failed")
    decided = decide(recorded(obj, again), jobs=(crashed,), warmup_pods=(cut, peer))
    [entry] = decided.status["pools"]
    assert (entry["state"], entry["disruptions"]) == (status.POOL_FAILED, 1), entry
    assert [d for d in decided.deletes if d.resource == JOBS] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.booleans()), min_size=1, max_size=12))
def test_each_disruption_is_counted_once_whatever_passes_see_of_the_pods(steps: list[tuple[int, bool]]) -> None:
    # Disruptions in distinct seconds; after each, a pass sees the Job's pods, some of them collected meanwhile.
    job = {"metadata": {"name": "j"}}
    record: dict[str, Any] = {}
    alive: list[dict[str, Any]] = []
    second = 0
    for gap, collect in steps:
        second += gap
        when = (datetime.datetime(2026, 11, 21, 9) + datetime.timedelta(seconds=second)).strftime("%Y-%m-%dT%H:%M:%SZ")
        alive.append(pod(job, f"p{second}", when, "Failed", disrupted(when)))
        record |= status.preempted(alive, record, {"state": status.POOL_PENDING})
        if collect:
            alive = alive[-1:]  # PodGC took the older pods
        record |= status.preempted(alive, record, {"state": status.POOL_PENDING})
    assert record["disruptions"] == len(steps)
