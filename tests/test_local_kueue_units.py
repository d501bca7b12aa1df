"""The local Kueue stand-in's decisions (``compilecache.local.kueue``), pure: no cluster."""

from __future__ import annotations

import datetime
import hashlib
import re
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.local import jobrunner, kueue
from compilecache.local.apiserver import merge_patch

NOW = "2026-01-01T00:00:00Z"
GPU = "nvidia.com/gpu"
FLAVOR = "default-flavor"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def job(name: str = "warm", uid: str = "u-1", labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {GPU: "8"}, "requests": {"cpu": "500m"}}}
    body = {"template": {"spec": {"containers": [container]}}, **spec}
    meta = {"name": name, "namespace": "ns", "uid": uid, "labels": {kueue.QUEUE_LABEL: "q", **(labels or {})}}
    return {"metadata": meta, "spec": body}


def cluster_queue(gpus: str = "8", checks: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    resources = [{"name": GPU, "nominalQuota": gpus}, {"name": "cpu", "nominalQuota": "64"}]
    spec: dict[str, Any] = {
        "resourceGroups": [{"coveredResources": [GPU, "cpu"], "flavors": [{"name": FLAVOR, "resources": resources}]}],
        **extra,
    }
    if checks is not None:
        spec["admissionChecks"] = checks
    return {"metadata": {"name": "cq"}, "spec": spec}


def admission_check(name: str, active: bool = True) -> dict[str, Any]:
    """An AdmissionCheck; ``active``: its controller has written ``Active=True``."""
    conditions = [{"type": "Active", "status": "True", "reason": "Active"}] if active else []
    return {"metadata": {"name": name}, "spec": {"controllerName": "x/y"}, "status": {"conditions": conditions}}


def queues(cq: dict[str, Any] | None = None, checks: dict[str, dict[str, Any]] | None = None) -> kueue.Queues:
    """The queues; ``checks`` by name, by default an active one for each check the ClusterQueue lists."""
    cq = cq or cluster_queue()
    local = {("ns", "q"): {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"clusterQueue": "cq"}}}
    if checks is None:
        checks = {name: admission_check(name) for name in kueue.check_names(cq)}
    return kueue.Queues(local=local, cluster={"cq": cq}, checks=checks)


def workload(name: str, gpus: int = 8, priority: int = 0, created: str = NOW, queue: str = "q") -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "c", "resources": {"limits": {GPU: str(gpus)}}}]}}
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created, "generation": 1},
        "spec": {
            "queueName": queue,
            "podSets": [{"name": "main", "count": 1, "template": template}],
            "priority": priority,
        },
    }


def apply(workloads: list[dict[str, Any]], q: kueue.Queues) -> list[dict[str, Any]]:
    changed = kueue.schedule(workloads, q, NOW)
    return [
        {**w, "status": changed.get((w["metadata"]["namespace"], w["metadata"]["name"]), w.get("status"))}
        for w in workloads
    ]


def reserved(w: dict[str, Any]) -> tuple[str, str, str]:
    found = kueue.condition((w.get("status") or {}).get("conditions") or [], "QuotaReserved")
    assert found is not None
    return found["status"], found["reason"], found["message"]


def test_a_queued_job_is_suspended_at_creation_and_others_are_not() -> None:
    assert kueue.suspend_on_create(job())["spec"]["suspend"] is True
    plain = job()
    plain["metadata"]["labels"] = {}
    assert "suspend" not in kueue.suspend_on_create(plain)["spec"]
    assert kueue.suspend_on_create(job(suspend=True))["spec"]["suspend"] is True


def test_the_workload_is_named_and_owned_as_kueues_job_integration_makes_it() -> None:
    made = kueue.workload_for(job(parallelism=2, labels={kueue.PRIORITY_LABEL: "high"}), {"high": 1000})
    # jobframework.GetWorkloadNameForOwnerWithGVK: "job-<name>-" + sha1("Job\nbatch\n<name>\n<uid>")[:5]
    digest = hashlib.sha1(b"Job\nbatch\nwarm\nu-1").hexdigest()[:5]
    assert made["metadata"]["name"] == f"job-warm-{digest}"
    assert made["metadata"]["labels"] == {kueue.JOB_UID_LABEL: "u-1"}
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Job", "u-1", True)
    assert made["spec"]["queueName"] == "q"
    assert made["spec"]["podSets"][0]["count"] == 2 and made["spec"]["podSets"][0]["name"] == "main"
    assert made["spec"]["priority"] == 1000
    assert made["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    # No parallelism: one pod; an unknown priority class: no priority.
    other = kueue.workload_for(job(labels={kueue.PRIORITY_LABEL: "nope"}), {})
    assert other["spec"]["podSets"][0]["count"] == 1 and "priority" not in other["spec"]


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=253), st.uuids())
def test_a_workload_name_is_a_dns_subdomain_of_at_most_253(name: str, uid: Any) -> None:
    name = name.strip("-") or "a"
    made = kueue.workload_name(name, str(uid))
    assert len(made) <= 253 and DNS_SUBDOMAIN.fullmatch(made), made


def test_requests_come_from_limits_for_extended_resources_and_times_the_count() -> None:
    made = kueue.workload_for(job(parallelism=3), {})
    assert kueue.workload_requests(made) == {"main": {GPU: Decimal(24), "cpu": Decimal("1.5")}}
    init = {"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
                     "initContainers": [{"resources": {"requests": {"cpu": "4"}}}]}}  # fmt: skip
    assert kueue.pod_requests(init) == {"cpu": Decimal(4)}  # max(sum of containers, each init container)


def test_a_workload_that_fits_is_admitted_and_the_next_waits_with_kueues_message() -> None:
    first, second = apply([workload("a"), workload("b", created="2026-01-01T00:00:01Z")], queues())
    assert reserved(first) == ("True", "QuotaReserved", "Quota reserved in ClusterQueue cq")
    assert kueue.is_true(first, "Admitted")
    assert first["status"]["admission"]["podSetAssignments"][0]["flavors"] == {GPU: FLAVOR}
    assert reserved(second) == (
        "False",
        "Pending",
        f"couldn't assign flavors to pod set main: insufficient unused quota for {GPU} in flavor {FLAVOR}, "
        "8 more needed",
    )
    # Once the first finishes, its quota frees and the second is admitted.
    first["status"] = kueue.finished_status(
        first, {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, NOW
    )
    _, second = apply([first, second], queues())
    assert reserved(second)[0] == "True" and kueue.is_true(second, "Admitted")


def test_a_workload_that_could_never_fit_and_an_uncovered_resource_say_so() -> None:
    (big,) = apply([workload("big", gpus=16)], queues())
    assert reserved(big)[2] == (
        f"couldn't assign flavors to pod set main: insufficient quota for {GPU} in flavor {FLAVOR}, previously "
        "considered podsets requests (0) + current podset request (16) > maximum capacity (8)"
    )
    cq = cluster_queue()
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"] = [{"name": "cpu", "nominalQuota": "8"}]
    (uncovered,) = apply([workload("w")], queues(cq))
    assert (
        reserved(uncovered)[2] == f"couldn't assign flavors to pod set main: resource {GPU} unavailable in ClusterQueue"
    )


def test_a_missing_local_queue_or_cluster_queue_is_inadmissible() -> None:
    (lost,) = apply([workload("w", queue="nope")], queues())
    assert reserved(lost) == ("False", "Inadmissible", "LocalQueue nope doesn't exist")
    q = queues()
    (orphan,) = apply([workload("w")], kueue.Queues(local=q.local, cluster={}))
    assert reserved(orphan) == ("False", "Inadmissible", "ClusterQueue cq doesn't exist")


def test_higher_priority_goes_first_then_the_older() -> None:
    old_low = workload("old-low", created="2026-01-01T00:00:00Z")
    new_high = workload("new-high", priority=100, created="2026-01-01T00:00:09Z")
    low, high = apply([old_low, new_high], queues())
    assert kueue.is_true(high, "Admitted") and not kueue.is_true(low, "QuotaReserved")


def test_checks_hold_admission_until_every_one_is_ready() -> None:
    cq = cluster_queue(checks=["warm-cache"], admissionChecksStrategy={"admissionChecks": [{"name": "capacity"}]})
    (w,) = apply([workload("w")], queues(cq))
    assert reserved(w)[0] == "True" and not kueue.is_true(w, "Admitted")
    assert [(c["name"], c["state"]) for c in w["status"]["admissionChecks"]] == [
        ("warm-cache", "Pending"),
        ("capacity", "Pending"),
    ]
    assert kueue.job_action({"spec": {"suspend": True}}, w) is None
    w["status"]["admissionChecks"][0]["state"] = "Ready"
    (w,) = apply([w], queues(cq))
    assert not kueue.is_true(w, "Admitted")
    w["status"]["admissionChecks"][1]["state"] = "Ready"
    (w,) = apply([w], queues(cq))
    assert kueue.is_true(w, "Admitted")
    assert kueue.job_action({"spec": {"suspend": True}}, w) == "unsuspend"


def test_retry_releases_the_quota_and_rejected_deactivates() -> None:
    cq = cluster_queue(checks=["warm-cache"])
    first, second = apply([workload("a"), workload("b", created="2026-01-01T00:00:01Z")], queues(cq))
    assert reserved(first)[0] == "True" and reserved(second)[0] == "False"
    first["status"]["admissionChecks"][0]["state"] = "Retry"
    first, second = apply([first, second], queues(cq))
    assert reserved(first)[0] == "False" and reserved(second)[0] == "True"  # the freed quota went to b
    assert first["status"]["admissionChecks"][0]["state"] == "Pending"
    second["status"]["admissionChecks"][0] |= {"state": "Rejected", "message": "cache failed"}
    (second,) = apply([second], queues(cq))
    assert kueue.is_rejected(second) and not kueue.holds_quota(second)
    assert "cache failed" in kueue.condition(second["status"]["conditions"], "Evicted")["message"]  # type: ignore[index]


def test_an_admitted_workload_that_loses_its_admission_suspends_its_job() -> None:
    (w,) = apply([workload("w")], queues())
    assert kueue.job_action({"spec": {"suspend": False}}, w) is None
    w["status"]["conditions"] = [c for c in w["status"]["conditions"] if c["type"] != "Admitted"]
    assert kueue.job_action({"spec": {"suspend": False}}, w) == "suspend"
    assert kueue.job_action({"spec": {"suspend": False}}, None) is None  # not Kueue's Job


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.integers(-5, 5), st.integers(0, 59), st.booleans()), max_size=12),
    st.integers(0, 16),
)
def test_admitted_usage_never_exceeds_the_quota_and_order_is_priority_then_age(
    specs: list[tuple[int, int, int, bool]], quota: int
) -> None:
    workloads = [
        workload(f"w{i}", gpus=gpus, priority=priority, created=f"2026-01-01T00:00:{second:02d}Z")
        for i, (gpus, priority, second, _) in enumerate(specs)
    ]
    q = queues(cluster_queue(gpus=str(quota)))
    # Some finish after the first pass: their quota frees for the second.
    once = apply(workloads, q)
    for w, (_, _, _, finishes) in zip(once, specs, strict=True):
        if finishes and kueue.holds_quota(w):
            w["status"] = kueue.finished_status(
                w, {"status": {"conditions": [{"type": "Failed", "status": "True"}]}}, NOW
            )
    for state in (apply(workloads, q), apply(once, q)):
        holding = [w for w in state if kueue.holds_quota(w)]
        assert sum(kueue.usage(w).get(GPU, Decimal(0)) for w in holding) <= quota
        # BestEffortFIFO: nothing left waiting would fit in what is left.
        left = quota - sum(kueue.usage(w).get(GPU, Decimal(0)) for w in holding)
        for w in state:
            if not kueue.holds_quota(w) and not kueue.is_true(w, "Finished"):
                assert kueue.usage(w).get(GPU, Decimal(0)) > left
    # First pass, from nothing: whoever is admitted outranks every equal-or-bigger one left waiting.
    ranks = {f"w{i}": (-priority, second, f"w{i}") for i, (_, priority, second, _) in enumerate(specs)}  # ties: by name
    first = apply(workloads, q)
    for winner in (w for w in first if kueue.holds_quota(w)):
        for loser in (w for w in first if not kueue.holds_quota(w)):
            if kueue.usage(loser).get(GPU, 0) <= kueue.usage(winner).get(GPU, 0):
                assert ranks[winner["metadata"]["name"]] < ranks[loser["metadata"]["name"]]


def test_a_suspended_job_has_no_start_time_nor_deadline_and_loses_its_pods() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    queued = {"metadata": {"name": "j"}, "spec": {"suspend": True, "activeDeadlineSeconds": 1}}
    queued["status"] = {"startTime": "2020-01-01T00:00:00Z"}  # long past its deadline, had it been running
    pod = {"metadata": {"name": "j-abc"}, "status": {"phase": "Running"}}
    verdict = jobrunner.job_verdict(queued, [pod], now)
    assert verdict["status"]["startTime"] is None and "conditions" not in verdict["status"]
    assert verdict["kill"] == ["j-abc"] and verdict["create"] == []


def test_a_cluster_queue_with_a_missing_or_inactive_check_admits_nothing_until_all_are_active() -> None:
    cq = cluster_queue(checks=["warm-cache", "capacity", "zeta"])
    checks = {"warm-cache": admission_check("warm-cache", active=False), "capacity": admission_check("capacity")}
    assert kueue.inactive_reason(cq, checks) == (
        "AdmissionCheckNotFound",
        "Can't admit new workloads: references missing AdmissionCheck(s): zeta, "
        "references inactive AdmissionCheck(s): warm-cache.",
    )
    (w,) = apply([workload("w")], queues(cq, checks))
    assert reserved(w) == ("False", "Inadmissible", "ClusterQueue cq is inactive")
    status = kueue.cluster_queue_status(cq, checks, NOW)
    assert status is not None
    active = kueue.condition(status["conditions"], "Active")
    assert active is not None and (active["status"], active["reason"]) == ("False", "AdmissionCheckNotFound")

    checks["zeta"] = admission_check("zeta")
    assert kueue.inactive_reason(cq, checks) == (
        "AdmissionCheckInactive",
        "Can't admit new workloads: references inactive AdmissionCheck(s): warm-cache.",
    )
    checks["warm-cache"] = admission_check("warm-cache")  # its controller says Active
    assert kueue.inactive_reason(cq, checks) is None
    (w,) = apply([w], queues(cq, checks))
    assert reserved(w)[0] == "True"
    status = kueue.cluster_queue_status({**cq, "status": status}, checks, NOW)
    assert status is not None
    active = kueue.condition(status["conditions"], "Active")
    assert active is not None and (active["status"], active["reason"], active["message"]) == (
        "True",
        "Ready",
        "Can admit new workloads",
    )
    assert kueue.cluster_queue_status({**cq, "status": status}, checks, NOW) is None  # nothing to write again
    # A check that goes inactive stops new admissions only: a Workload holding quota keeps it.
    checks["warm-cache"] = admission_check("warm-cache", active=False)
    held, waiting = apply([w, workload("v", created="2026-01-01T00:00:01Z")], queues(cq, checks))
    assert kueue.holds_quota(held) and reserved(waiting) == ("False", "Inadmissible", "ClusterQueue cq is inactive")


def admitted_with(updates: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """An admitted Workload whose checks (name, podSetUpdate for ``main``) are all Ready."""
    cq = cluster_queue(checks=[name for name, _ in updates])
    (w,) = apply([workload("w")], queues(cq))
    w["status"]["admissionChecks"] = [
        {"name": name, "state": "Ready", "podSetUpdates": [{"name": "main", **update}]} for name, update in updates
    ]
    (w,) = apply([w], queues(cq))
    assert kueue.is_true(w, "Admitted")
    return w


def test_start_merges_the_checks_pod_set_updates_into_the_template_and_stop_restores_it() -> None:
    queued = job(suspend=True)
    queued["spec"]["template"]["metadata"] = {"labels": {"app": "train", "job-name": "warm"}}
    queued["spec"]["template"]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    w = kueue.workload_for(queued, {})  # the Workload keeps the template as the Job was made
    update = {
        "annotations": {"compilecache.dev/released": "Ready 2026-01-01T00:00:00Z"},
        "labels": {"app": "train", "tier": "gold"},  # the same value as the template's: no conflict
        "nodeSelector": {"pool": "h100"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "Exists"}],
    }
    w = {**w, **{k: v for k, v in admitted_with([("warm-cache", update)]).items() if k == "status"}}
    started = merge_patch(queued, kueue.start_patch(queued, w))
    template = started["spec"]["template"]
    assert started["spec"]["suspend"] is False
    assert template["metadata"]["annotations"] == {"compilecache.dev/released": "Ready 2026-01-01T00:00:00Z"}
    assert template["metadata"]["labels"] == {
        "app": "train",
        "job-name": "warm",
        "tier": "gold",
        kueue.PODSET_LABEL: "main",
    }
    assert template["spec"]["nodeSelector"] == {"pool": "h100"}
    assert template["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert template["spec"]["containers"] == queued["spec"]["template"]["spec"]["containers"]
    # Evicted (a Retry, a lost reservation): suspended, and the template is the Workload's again.
    stopped = merge_patch(started, kueue.stop_patch(started, w))
    assert stopped["spec"]["suspend"] is True
    assert stopped["spec"]["template"]["metadata"]["labels"] == {"app": "train", "job-name": "warm"}
    assert not stopped["spec"]["template"]["metadata"].get("annotations")
    assert not stopped["spec"]["template"]["spec"].get("nodeSelector")
    assert stopped["spec"]["template"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]


def test_an_update_that_conflicts_fails_the_start_for_good_with_kueues_error() -> None:
    queued = job(suspend=True)
    queued["spec"]["template"]["metadata"] = {"annotations": {"compilecache.dev/released": "mine"}}
    w = admitted_with([("warm-cache", {"annotations": {"compilecache.dev/released": "Ready now"}})])
    try:
        kueue.start_patch(queued, w)
    except kueue.CannotStart as exc:
        message = str(exc)
    else:
        raise AssertionError("a conflicting podSetUpdate started the Job")
    assert message == (
        "invalid admission check PodSetUpdate: conflict for annotations: "
        "conflict for key=compilecache.dev/released, value1=mine, value2=Ready now"
    )
    status = kueue.failed_to_start_status(w, message, NOW)
    finished = kueue.condition(status["conditions"], "Finished")
    assert finished is not None and (finished["status"], finished["reason"]) == ("True", "FailedToStart")
    failed = {**w, "status": status}
    assert not kueue.holds_quota(failed) and kueue.job_action(queued, failed) is None  # quota freed, Job left
    # Two checks that disagree: the later one is named.
    w = admitted_with([("a", {"labels": {"k": "1"}}), ("b", {"labels": {"k": "2"}})])
    try:
        kueue.admitted_info(w)
    except kueue.CannotStart as exc:
        assert str(exc) == (
            'in admission check "b": invalid admission check PodSetUpdate: conflict for labels: '
            "conflict for key=k, value1=1, value2=2"
        )
    else:
        raise AssertionError("two checks' conflicting updates were merged")


KEYS = st.sampled_from(["a", "b", "c", "compilecache.dev/released"])
VALUES = st.sampled_from(["x", "y"])
MAPS = st.dictionaries(KEYS, VALUES, max_size=4)
TOLERATIONS = st.lists(st.fixed_dictionaries({"key": KEYS, "operator": st.just("Exists")}), max_size=3)


@settings(max_examples=300, deadline=None)
@given(MAPS, MAPS, MAPS, TOLERATIONS, MAPS, MAPS, MAPS, TOLERATIONS)
def test_pod_set_updates_are_additive_only_and_a_stop_restores_the_template_exactly(
    labels: dict[str, str],
    annotations: dict[str, str],
    selector: dict[str, str],
    tolerations: list[dict[str, str]],
    new_labels: dict[str, str],
    new_annotations: dict[str, str],
    new_selector: dict[str, str],
    new_tolerations: list[dict[str, str]],
) -> None:
    queued = job(suspend=True)
    queued["spec"]["template"]["metadata"] = {"labels": labels, "annotations": annotations}
    queued["spec"]["template"]["spec"] |= {"nodeSelector": selector, "tolerations": tolerations}
    w = kueue.workload_for(queued, {})
    update = {
        "labels": new_labels,
        "annotations": new_annotations,
        "nodeSelector": new_selector,
        "tolerations": new_tolerations,
    }
    w["status"] = admitted_with([("warm-cache", update)])["status"]
    pairs = [
        (annotations, new_annotations),
        ({**labels}, {**new_labels, kueue.PODSET_LABEL: "main"}),
        (selector, new_selector),
    ]
    clashes = [(old, new) for old, new in pairs if any(k in new and new[k] != v for k, v in old.items())]
    try:
        started = merge_patch(queued, kueue.start_patch(queued, w))
    except kueue.CannotStart as exc:
        assert clashes, f"no conflict, yet: {exc}"
        key, first, second = re.fullmatch(r".*key=(.*), value1=(.*), value2=(.*)", str(exc)).groups()  # type: ignore[union-attr]
        assert any(old.get(key) == first and new.get(key) == second != first for old, new in clashes)
        return
    assert not clashes
    template = started["spec"]["template"]
    # Every update lands, and nothing the template had is overwritten.
    for before, update_map, after in (
        (labels, new_labels, template["metadata"].get("labels") or {}),
        (annotations, new_annotations, template["metadata"].get("annotations") or {}),
        (selector, new_selector, template["spec"].get("nodeSelector") or {}),
    ):
        assert after.items() >= before.items() and after.items() >= update_map.items()
    assert template["metadata"]["labels"][kueue.PODSET_LABEL] == "main"
    merged = template["spec"].get("tolerations") or []
    assert merged[: len(tolerations)] == tolerations and all(t in merged for t in new_tolerations)
    # A stop puts the template back as the Job was made.
    stopped = merge_patch(started, kueue.stop_patch(started, w))
    for path in (
        ("metadata", "labels"),
        ("metadata", "annotations"),
        ("spec", "nodeSelector"),
        ("spec", "tolerations"),
    ):
        got = stopped["spec"]["template"][path[0]].get(path[1])
        want = queued["spec"]["template"][path[0]].get(path[1])
        assert (got or None) == (want or None), path
