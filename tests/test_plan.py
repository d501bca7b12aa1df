"""plan(): the whole decision of a pass, driven directly over snapshots (no server).

Examples first (a new cache, refusals by the API, expiry of a Degraded cache, a failed
pass), then a property test: valid specs × generated cluster states, evolved for a few
passes as a cluster would (Jobs created, running, finishing, refused, cleaned up).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compilecache.controller import admission, expiryjob, gates, indexes, plan, policy, status
from compilecache.controller.kube import JOBS, PVCS, SERVICES, ApiError
from compilecache.controller.snapshot import Cache, Snapshot
from specs import GPU, PRODUCT, cache, cache_spec, cluster, node

NOW = "2026-11-21T10:00:00Z"
PHASES = {status.PENDING, status.WARMING, status.EXPIRING, status.READY, status.DEGRADED, status.FAILED}
SUMMARY = {"schema": "compilecache.dev/expiry/v1", "ok": True, "after": {"entries": 2, "bytes": 2048}}
OURS = {"compilecache.dev/cache": "llama"}  # the label the operator puts on the claims it creates


# The default policy, with the GCS writer of SPECS allowed.
RULES = policy.parse({"serviceAccounts": {"allow": ["default", "cache-writer"]}})


def snapshot(obj: dict[str, Any] | None = None, **parts: Any) -> Snapshot:
    parts.setdefault("nodes", tuple(cluster()))
    parts.setdefault("policy", RULES)
    return Snapshot(Cache.read(obj or cache()), **parts)


def with_status(obj: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj) | {"status": copy.deepcopy(dict(new))}


def job_from(create: plan.Create, condition: str | None = None, *, active: int = 0) -> dict[str, Any]:
    """The Job as the API returns it after the create, with the Job controller's status."""
    job = copy.deepcopy(dict(create.manifest))
    job_status: dict[str, Any] = {"startTime": "2026-11-21T09:00:00Z", "active": active}
    if condition:
        job_status["conditions"] = [
            {"type": condition, "status": "True", "reason": f"Job{condition}", "lastTransitionTime": NOW}
        ]
        if condition == "Complete":
            job_status["completionTime"] = "2026-11-21T09:30:00Z"
    job["status"] = job_status
    return job


def expiry_pod(job: dict[str, Any], message: str) -> dict[str, Any]:
    terminated = {"exitCode": 0, "finishedAt": NOW, "message": message}
    return {
        "metadata": {"name": job["metadata"]["name"] + "-x", "labels": {"job-name": job["metadata"]["name"]}},
        "status": {"containerStatuses": [{"name": expiryjob.CONTAINER, "state": {"terminated": terminated}}]},
    }


def gated_pod(name: str, created: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created, "labels": {"compilecache.dev/cache": "llama"}},
        "spec": {"schedulingGates": [{"name": admission.GATE}]},
    }


# --- examples ---------------------------------------------------------------------------------------


def test_a_new_cache_creates_its_claim_and_one_owned_job_per_pool() -> None:
    decided = plan.plan(snapshot(), NOW)
    assert [c.resource for c in decided.creates] == [PVCS, JOBS, JOBS]
    for create in decided.creates[1:]:
        [owner] = create.manifest["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"]) == ("uid-1", True)
    assert decided.status["phase"] == status.WARMING
    assert {p["reason"] for p in decided.status["pools"]} == {"JobCreated"}
    assert decided.deletes == () and decided.releases == ()
    assert [(e.type, e.reason) for e in decided.events][-1] == ("Normal", "Warming")


def test_planning_again_after_the_creates_creates_nothing() -> None:
    first = plan.plan(snapshot(), NOW)
    claim = {"metadata": {"name": "jax-cache", "labels": OURS}, "status": {"phase": "Bound"}}
    jobs_ = tuple(job_from(c) for c in first.creates if c.resource == JOBS)
    second = plan.plan(snapshot(with_status(cache(), first.status), claim=claim, jobs=jobs_), NOW)
    assert second.creates == () and second.deletes == ()
    assert second.status["phase"] == status.WARMING and second.events == ()


def test_a_refused_job_fails_its_pool_with_the_apis_message_and_is_not_retried() -> None:
    first = plan.plan(snapshot(), NOW)
    refused = first.creates[1].name
    message = 'Job.batch "x" is invalid: spec.template.spec.containers[0].resources.requests: Invalid value'
    after = snapshot().after(frozenset({first.creates[0].key}), {first.creates[1].key: message})
    second = plan.plan(after, NOW)
    assert [c.name for c in second.creates] == [first.creates[2].name]  # only the other pool's Job
    pool = next(p for p in second.status["pools"] if p.get("job") == refused)
    assert (pool["state"], pool["reason"]) == (status.POOL_FAILED, plan.JOB_REJECTED)
    assert message in pool["message"]
    assert ("Warning", "PoolFailed") in [(e.type, e.reason) for e in second.events]
    # The next pass (the status recorded) does not create it again: the record stands until the spec changes.
    claim = {"metadata": {"name": "jax-cache", "labels": OURS}, "status": {"phase": "Bound"}}
    other = job_from(first.creates[2])
    third = plan.plan(snapshot(with_status(cache(), second.status), claim=claim, jobs=(other,)), NOW)
    assert third.creates == ()
    assert next(p for p in third.status["pools"] if p.get("job") == refused)["reason"] == plan.JOB_REJECTED


def test_a_refused_claim_fails_the_cache_and_creates_no_job() -> None:
    first = plan.plan(snapshot(), NOW)
    second = plan.plan(
        snapshot().after(frozenset(), {"persistentvolumeclaims/jax-cache": "exceeded quota: storage"}), NOW
    )
    assert second.creates == ()
    assert second.status["phase"] == status.FAILED and "exceeded quota" in second.status["message"]
    assert first.creates[0].resource == PVCS


def degraded(expiry: str | None) -> tuple[Snapshot, plan.Plan]:
    """A cache whose H100 pool warmed and A100 pool failed; its expiry Job absent, running or done."""
    first = plan.plan(snapshot(), NOW)
    claim = {"metadata": {"name": "jax-cache", "labels": OURS}, "status": {"phase": "Bound"}}
    a100, h100 = (c for c in first.creates if c.resource == JOBS)
    jobs_ = (job_from(a100, "Failed"), job_from(h100, "Complete"))
    snap = snapshot(with_status(cache(), first.status), claim=claim, jobs=jobs_)
    decided = plan.plan(snap, NOW)
    if expiry is None:
        return snap, decided
    [create] = decided.creates
    job = job_from(create, expiry)
    pods = (expiry_pod(job, json.dumps(SUMMARY)),) if expiry else ()
    snap = snapshot(with_status(cache(), decided.status), claim=claim, jobs=jobs_, expiry_jobs=(job,), expiry_pods=pods)
    return snap, plan.plan(snap, NOW)


def test_a_degraded_cache_expires_what_warmed_and_stays_degraded() -> None:
    _, decided = degraded(None)
    [create] = decided.creates
    h100_job = next(p["job"] for p in decided.status["pools"] if p["state"] == status.POOL_SUCCEEDED)
    assert create.name == expiryjob.expiry_job(cache(), Cache.read(cache()).spec, [h100_job])["metadata"]["name"]
    assert decided.status["phase"] == status.EXPIRING
    _, done = degraded("Complete")
    assert done.creates == ()
    assert done.status["phase"] == status.DEGRADED
    assert "warm-up failed on 1 of 2 pools" in done.status["message"] and "expired" in done.status["message"]
    expired = next(c for c in done.status["conditions"] if c["type"] == "Expired")
    assert expired["status"] == "True" and done.status["cache"]["entries"] == 2


def test_gated_pods_wait_while_a_degraded_cache_expires_and_start_once_it_settles() -> None:
    snap, _ = degraded("")
    pod = gated_pod("p", NOW)
    waiting = plan.plan(dataclasses.replace(snap, pods=(pod,)), NOW)
    assert waiting.status["phase"] == status.EXPIRING and waiting.releases == ()
    snap, _ = degraded("Complete")
    settled = plan.plan(dataclasses.replace(snap, pods=(pod,)), NOW)
    assert settled.status["phase"] == status.DEGRADED
    assert [(r.pod, r.reason) for r in settled.releases] == [("p", gates.CACHE_DEGRADED)]
    # A failed pass keeps a settled Degraded cache serving.
    error = ApiError(500, "Internal Server Error", "etcd timeout")
    hiccup = plan.failed(Cache.read(with_status(cache(), settled.status)), [pod], error, NOW)
    assert hiccup.status["phase"] == status.DEGRADED
    assert [r.reason for r in hiccup.releases] == [gates.CACHE_DEGRADED]


def test_a_refused_expiry_job_is_failed_and_not_retried() -> None:
    snap, decided = degraded(None)
    [create] = decided.creates
    refused = plan.plan(snap.after(frozenset(), {create.key: "forbidden: exceeded quota"}), NOW)
    assert refused.creates == () and refused.status["phase"] == status.FAILED
    assert "exceeded quota" in refused.status["message"]
    again = plan.plan(snapshot(with_status(cache(), refused.status), **_parts(snap)), NOW)
    assert again.creates == () and again.status["phase"] == status.FAILED


def _parts(snap: Snapshot) -> dict[str, Any]:
    return {"claim": snap.claim, "nodes": snap.nodes, "jobs": snap.jobs}


@pytest.mark.parametrize("schedule", ["60 * * * *", "0 3 * * 8", "*/0 * * * *", "5-1 * * * *"])
def test_a_schedule_that_cannot_be_evaluated_is_invalid_input_naming_the_field(schedule: str) -> None:
    # The parser (or the CRD) may let these through; the old pass raised a ValueError and recorded nothing.
    decided = plan.plan(snapshot(cache(schedule=schedule)), NOW)
    assert decided.status["phase"] == status.FAILED and decided.creates == ()
    ready = next(c for c in decided.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and ready["message"].startswith("spec.schedule")
    assert [(e.type, e.reason) for e in decided.events] == [("Warning", "InvalidSpec")]


def test_a_failed_pass_says_what_failed_and_still_releases_timed_out_pods() -> None:
    obj = cache(consumers={"gateTimeout": "10m"})
    pods = [gated_pod("old", "2026-11-21T09:00:00Z"), gated_pod("new", "2026-11-21T09:59:00Z")]
    error = ValueError("a bug")
    decided = plan.failed(Cache.read(obj), pods, error, NOW)
    assert decided.status["phase"] == status.FAILED and "ValueError: a bug" in decided.status["message"]
    conditions = {c["type"]: c for c in decided.status["conditions"]}
    assert (conditions["Ready"]["reason"], conditions["Reconciled"]["status"]) == ("ReconcileError", "False")
    assert [(e.type, e.reason) for e in decided.events] == [("Warning", "ReconcileError")]
    assert [(r.pod, r.reason) for r in decided.releases] == [("old", gates.GATE_TIMEOUT)]
    assert decided.creates == () and decided.deletes == ()
    # The same failure again: no new Event (the retries are not an Event storm).
    again = plan.failed(Cache.read(with_status(obj, decided.status)), pods, error, NOW)
    assert again.events == () and again.status["phase"] == status.FAILED


def test_a_failed_pass_keeps_a_ready_cache_ready() -> None:
    ready = {
        "phase": "Ready",
        "message": "all good",
        "specHash": "h",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    error = ApiError(500, "Internal Server Error", "etcd timeout")
    decided = plan.failed(Cache.read(with_status(cache(), ready)), [gated_pod("p", NOW)], error, NOW)
    assert decided.status["phase"] == status.READY
    assert "etcd timeout" in decided.status["message"]
    assert [(r.pod, r.reason) for r in decided.releases] == [("p", gates.CACHE_READY)]
    assert [(e.type, e.reason) for e in decided.events] == [("Warning", "ReconcileError")]
    # The next good pass drops the Reconciled condition.
    good = plan.plan(snapshot(with_status(cache(), decided.status)), NOW)
    assert "Reconciled" not in {c["type"] for c in good.status["conditions"]}


def test_a_spec_the_parser_cannot_read_is_failed_and_pods_get_the_default_timeout() -> None:
    obj = cache()
    obj["spec"] = "not a mapping"
    decided = plan.plan(snapshot(obj, pods=(gated_pod("p", "2026-11-21T09:00:00Z"),)), NOW)
    assert decided.status["phase"] == status.FAILED
    assert [r.reason for r in decided.releases] == [gates.GATE_TIMEOUT]  # 30 min default: 1 h old


# --- property: any valid spec × any cluster state --------------------------------------------------

SPECS = [
    cache_spec(),
    cache_spec(storage={"gcs": {"bucket": "my-caches", "prefix": "c/llama", "serviceAccountName": "cache-writer"}}),
    cache_spec(storage={"pvc": {"claimName": "brought"}}, lifecycle={"maxAge": "7d", "keepVersions": 2}),
    cache_spec(schedule="0 3 * * *", consumers={"gateTimeout": "1m"}),
    cache_spec(
        warmup=cache_spec()["warmup"]
        | {
            "pools": [
                {"name": "b200", "nodeSelector": {PRODUCT: "NVIDIA-B200"}},
                {"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}, "gpusPerPod": 16},
            ]
        }
    ),
    cache_spec(
        warmup=cache_spec()["warmup"]
        | {
            "workloads": [
                {"name": "a", "entrypoint": "m:f", "pools": ["h100"]},
                {"name": "b", "script": "/w/b.py", "args": ["--x"]},
            ],
            "pools": [{"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}, "gpusPerPod": 8}],
        }
    ),
    # Multi-host (issue 12): Indexed Jobs with a Service where a pool has the nodes, TooFewNodes elsewhere.
    cache_spec(warmup=cache_spec()["warmup"] | {"topologies": [{"hosts": 1}, {"hosts": 2}]}),
    cache_spec(
        warmup=cache_spec()["warmup"]
        | {
            "topologies": [{"hosts": 3}],
            "pools": [{"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}}],
        }
    ),
]
PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "nvidia-h100-80gb-hbm3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-B200", None]
# Weighted towards success, so that the passes often get as far as expiry and Ready.
JOB_FATES = ["absent", "pending", "running", "Complete", "Complete", "Complete", "Complete", "Failed", "refused"]

nodes_st = st.lists(
    st.tuples(st.sampled_from(PRODUCTS), st.sampled_from([8, 4, 0]), st.sampled_from([False, False, True])),
    min_size=1,
    max_size=6,
).map(
    lambda specs: tuple(
        node(f"n{index}", product, gpus) | ({"spec": {"unschedulable": True}} if cordoned else {})
        for index, (product, gpus, cordoned) in enumerate(specs)
    )
)
old_status_st = st.one_of(
    st.just({}),
    st.builds(
        lambda phase, spec_hash: {"phase": phase, "message": "before", "specHash": spec_hash},
        st.sampled_from(sorted(PHASES)),
        st.sampled_from(["", "stale"]),
    ),
)
pods_st = st.lists(st.tuples(st.integers(0, 7200), st.booleans()), max_size=3).map(
    lambda items: tuple(
        gated_pod(
            f"p{index}",
            (datetime.datetime(2026, 11, 21, 10, tzinfo=datetime.UTC) - datetime.timedelta(seconds=age)).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        )
        if gated
        else {"metadata": {"name": f"p{index}", "labels": {}}, "spec": {}}
        for index, (age, gated) in enumerate(items)
    )
)


def projected(snap: Snapshot) -> Snapshot:
    """The snapshot as the operator's indexes hold its objects (``indexes.slim*``)."""
    return dataclasses.replace(
        snap,
        pods=tuple(map(indexes.slim_pod, snap.pods)),
        claim=None if snap.claim is None else indexes.slim_claim(snap.claim),
        nodes=tuple(map(indexes.slim_node, snap.nodes)),
        jobs=tuple(map(indexes.slim_job, snap.jobs)),
        warmup_pods=tuple(map(indexes.slim_pod, snap.warmup_pods)),
        expiry_jobs=tuple(map(indexes.slim_job, snap.expiry_jobs)),
        expiry_pods=tuple(map(indexes.slim_pod, snap.expiry_pods)),
        services=tuple(map(indexes.slim, snap.services)),
    )


def check(snap: Snapshot, decided: plan.Plan) -> None:
    """The invariants of every plan."""
    uid = snap.cache.uid
    existing = {obj["metadata"]["name"] for obj in (*snap.jobs, *snap.expiry_jobs)}
    if snap.claim is not None:
        existing.add(snap.claim["metadata"]["name"])
    names = [create.key for create in decided.creates]
    assert len(names) == len(set(names)), names
    for create in decided.creates:
        assert create.name not in existing and create.key not in snap.created and create.key not in snap.rejected
        if create.resource == JOBS:
            owners = create.manifest["metadata"]["ownerReferences"]
            assert [(o["uid"], o["controller"]) for o in owners] == [(uid, True)]
            assert len(create.name) <= 63
            # The policy holds on the pod itself, whatever field of the spec made it.
            pod_spec = create.manifest["spec"]["template"]["spec"]
            assert policy.pod_violations(pod_spec, snap.policy, GPU, create.name) == [], create.name
    owned = {job["metadata"]["name"] for job in (*snap.jobs, *snap.expiry_jobs)}
    assert {delete.name for delete in decided.deletes if delete.resource == JOBS} <= owned
    services = {service["metadata"]["name"] for service in snap.services}
    assert {delete.name for delete in decided.deletes if delete.resource == SERVICES} <= services
    for create in decided.creates:  # a multi-host Job's Service is created before it, or exists
        if create.resource == JOBS and create.manifest["spec"].get("completionMode") == "Indexed":
            before = [c.key for c in decided.creates[: decided.creates.index(create)]]
            assert (
                SERVICES.key(create.name) in before
                or create.name in services
                or SERVICES.key(create.name) in snap.created
            )
    gated = {pod["metadata"]["name"] for pod in snap.pods if gates.is_gated(pod)}
    assert {release.pod for release in decided.releases} <= gated
    new = decided.status
    phase = new["phase"]
    assert phase in PHASES
    # The spec's own checks catch all the policy refuses: the last check, on the pods, never has to.
    assert "refused by the operator's policy: Job " not in str(new.get("message", "")), new["message"]
    event(f"phase {phase}")  # hypothesis statistics: every phase is reached
    pools = new.get("pools") or []
    active = [p for p in pools if p.get("state") != status.POOL_NO_NODES]
    succeeded = [p for p in active if p.get("state") == status.POOL_SUCCEEDED]
    finished = [p for p in active if p.get("state") in (*status.FINISHED, *status.NOT_WARMED)]
    ready = next(c for c in new["conditions"] if c["type"] == "Ready")
    assert (ready["status"] == "True") == (phase == status.READY)
    if ready["reason"] == "InvalidSpec":
        assert phase == status.FAILED and ready["message"].startswith("spec")
        return
    if "pools" in new and "poolsReady" in new:
        assert new["poolsReady"] == f"{len(succeeded)}/{len(active)}"
    serving = str(new.get("message", "")).startswith("ready; refreshing")
    if phase == status.READY and not serving:
        assert active and len(succeeded) == len(active)
    if phase == status.DEGRADED:
        assert succeeded and len(finished) == len(active) > len(succeeded)
    if phase == status.WARMING:
        assert len(finished) < len(active)
    if phase == status.EXPIRING:
        assert active and len(finished) == len(active) and succeeded
    assert len({status.key(p) for p in pools}) == len(pools)


@settings(
    derandomize=True,
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    spec=st.sampled_from(SPECS),
    nodes=nodes_st,
    old=old_status_st,
    pods=pods_st,
    claim=st.sampled_from(["Bound", None, "Pending", "Lost"]),
    fates=st.lists(st.sampled_from(JOB_FATES), min_size=8, max_size=8),
    strays=st.lists(st.tuples(st.sampled_from(["llama-old-1", "other-x"]), st.booleans()), max_size=2),
    passes=st.integers(3, 8),
    now=st.sampled_from([NOW, "2026-11-21T03:00:00Z", "2026-11-22T03:01:00Z"]),
)
def test_any_valid_spec_and_cluster_state_gives_a_valid_plan(
    spec: dict[str, Any],
    nodes: tuple[dict[str, Any], ...],
    old: dict[str, Any],
    pods: tuple[dict[str, Any], ...],
    claim: str | None,
    fates: list[str],
    strays: list[tuple[str, bool]],
    passes: int,
    now: str,
) -> None:
    obj = cache(**spec) | {"status": old}
    parsed = Cache.read(obj).spec
    assert parsed is not None
    claim_name = parsed.pvc.claim_name if parsed.pvc is not None else None
    claim_obj = (
        None
        if claim is None or claim_name is None
        else {"metadata": {"name": claim_name, "labels": OURS}, "status": {"phase": claim}}
    )
    stray_jobs = tuple(
        {"metadata": {"name": name, "ownerReferences": [{"uid": "uid-1" if ours else "uid-0"}]}}
        for name, ours in strays
    )
    snap = Snapshot(Cache.read(obj), pods=pods, claim=claim_obj, nodes=nodes, jobs=stray_jobs, policy=RULES)
    fate = itertools.cycle(fates)
    for _ in range(passes):
        decided = plan.plan(snap, now)
        check(snap, decided)
        # The operator's indexes keep only what passes read (indexes.py): the plan is the same from them.
        assert plan.plan(projected(snap), now) == decided
        # The API refuses some creations: the pass plans again with each refusal, as reconcile does.
        refused = {c.key: "refused" for c in decided.creates if next(fate) == "refused"}
        if refused:
            first = next(iter(refused))
            snap = snap.after(frozenset(), {first: "refused"})
            decided = plan.plan(snap, now)
            check(snap, decided)
        # The cluster moves on: created objects appear with some state (or are gone again, by a TTL).
        jobs_ = list(snap.jobs)
        expiry_jobs, expiry_pods = list(snap.expiry_jobs), list(snap.expiry_pods)
        services_ = list(snap.services)
        claim_obj = snap.claim
        for create in decided.creates:
            if create.resource == PVCS:
                claim_obj = {"metadata": {"name": create.name}, "status": {"phase": "Bound"}}
                continue
            if create.resource == SERVICES:
                services_.append(dict(create.manifest))
                continue
            state = next(fate)
            if state in ("absent", "refused"):
                continue
            job = job_from(
                create,
                state if state in ("Complete", "Failed") else None,
                active=1 if state == "running" else 0,
            )
            if expiryjob.LABEL_EXPIRY_OF in create.manifest["metadata"]["labels"]:
                expiry_jobs.append(job)
                if state == "Complete":
                    expiry_pods.append(expiry_pod(job, json.dumps(SUMMARY)))
            else:
                jobs_.append(job)
        deleted = {delete.name for delete in decided.deletes if delete.resource == JOBS}
        gone = {delete.name for delete in decided.deletes if delete.resource == SERVICES}
        snap = Snapshot(
            Cache.read(with_status(obj, decided.status)),
            pods=pods,
            claim=claim_obj,
            nodes=nodes,
            jobs=tuple(j for j in jobs_ if j["metadata"]["name"] not in deleted),
            expiry_jobs=tuple(j for j in expiry_jobs if j["metadata"]["name"] not in deleted),
            expiry_pods=tuple(expiry_pods),
            services=tuple(s for s in services_ if s["metadata"]["name"] not in gone),
            policy=RULES,
        )
