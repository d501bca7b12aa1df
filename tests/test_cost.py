"""The GPU-seconds of warm-up pods (``status.pool_cost``, ``status.cache_cost``) and the counter fed from them.

Pods are written as the kubelet writes a finished pod (each container's ``startedAt``/``finishedAt``)
with the termination message a warm-up writes (``jobtools.warm.termination_summary``, plus the
``runs`` field of the warmer's contract: wall seconds of each run made). The pod writes its own
message, so hostile ``runs`` values are generated too.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.controller import metrics, metricsfeed, status
from compilecache.controller.pools import Pool
from compilecache.jobtools.warm import termination_summary

EPOCH = datetime.datetime(2026, 11, 21, 10, 0, tzinfo=datetime.UTC)
RUN_PARTS = ("first", "resumed", "verify", "other")


def stamp(seconds: float) -> str:
    return (EPOCH + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def summary(runs: Any = None, **extra: Any) -> str:
    """A warm-up container's termination message; ``runs`` as the warmer's contract has it (absent: None)."""
    text = termination_summary({"ok": True, "entries": 1, "bytes": 10, "targets": []})
    document = json.loads(text) | extra
    if runs is not None:
        document["runs"] = runs
    return json.dumps(document, separators=(",", ":"))


def pod(
    start: int,
    end: int,
    runs: Any = None,
    *,
    phase: str = "Succeeded",
    uid: str = "u1",
    init: tuple[tuple[int, int, Any], ...] = (),
) -> dict[str, Any]:
    """A finished warm-up pod: its container ran from ``start`` to ``end`` (seconds after EPOCH)."""

    def container(name: str, began: int, ended: int, said: Any) -> dict[str, Any]:
        terminated = {
            "exitCode": 0,
            "reason": "Completed",
            "startedAt": stamp(began),
            "finishedAt": stamp(ended),
            "message": summary(said),
        }
        return {"name": name, "ready": False, "restartCount": 0, "state": {"terminated": terminated}}

    return {
        "metadata": {"name": f"j-{uid}", "uid": uid, "labels": {"job-name": "j"}},
        "status": {
            "phase": phase,
            "initContainerStatuses": [container(f"warm-{i}", *item) for i, item in enumerate(init)],
            "containerStatuses": [container("warm", start, end, runs)],
        },
    }


SUCCEEDED = {"state": status.POOL_SUCCEEDED}
FAILED = {"state": status.POOL_FAILED}


def assert_adds_up(seconds: dict[str, float]) -> None:
    assert all(seconds[part] >= 0 for part in ("total", *RUN_PARTS)), seconds
    assert math.isclose(sum(seconds[part] for part in RUN_PARTS), seconds["total"], abs_tol=0.002), seconds


def test_one_pod_splits_its_gpu_seconds_into_its_runs():
    # DESIGN.md's H200 figures: 66.6 s first run, 8.0 s resumed, 94.9 s in all (verify and the rest 20.3)
    found = status.pool_cost([pod(0, 95, runs={"first": 66.6, "resumed": 8.0, "verify": 14.1})], 2, None, SUCCEEDED)
    assert found["gpuPods"] == 1
    assert found["gpuSeconds"] == {"total": 190.0, "first": 133.2, "resumed": 16.0, "verify": 28.2, "other": 12.6}


def test_without_runs_everything_is_other_and_a_running_job_costs_nothing_yet():
    found = status.pool_cost([pod(0, 30)], 4, None, SUCCEEDED)
    assert found["gpuSeconds"] == {"total": 120.0, "first": 0.0, "resumed": 0.0, "verify": 0.0, "other": 120.0}
    assert status.pool_cost([pod(0, 30, phase="Running")], 1, None, SUCCEEDED) == {}
    assert status.pool_cost([pod(0, 30)], 1, None, {"state": status.POOL_RUNNING}) == {}


def test_a_retried_pod_and_every_process_of_a_group_count():
    preempted = pod(0, 40, phase="Failed", uid="a", runs={"first": 39})
    retry = pod(100, 160, uid="b", runs={"first": 50, "verify": 5})
    other_host = pod(100, 150, uid="c", runs={"first": 45, "verify": 4})
    found = status.pool_cost([preempted, retry, other_host], 8, None, SUCCEEDED)
    assert found["gpuPods"] == 3
    assert found["gpuSeconds"]["total"] == 8 * (40 + 60 + 50)
    assert found["gpuSeconds"]["first"] == 8 * (39 + 50 + 45)
    assert found["gpuSeconds"]["verify"] == 8 * 9
    assert_adds_up(found["gpuSeconds"])


def test_init_containers_run_in_turn_and_the_pod_holds_its_gpus_throughout():
    # two scripts in init containers, then the main container: the pod ran from 0 to 50
    found = status.pool_cost(
        [pod(40, 50, runs={"verify": 9}, init=((0, 20, {"first": 18}), (21, 39, {"first": 15, "resumed": 2})))],
        1,
        None,
        SUCCEEDED,
    )
    assert found["gpuSeconds"] == {"total": 50.0, "first": 33.0, "resumed": 2.0, "verify": 9.0, "other": 6.0}


def test_a_container_that_never_started_and_a_pod_without_gpus():
    never = pod(0, 30)
    never["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"] = "1970-01-01T00:00:00Z"
    assert status.pool_cost([never], 1, None, FAILED) == {}
    assert status.pool_cost([pod(0, 30)], 0, None, SUCCEEDED)["gpuSeconds"]["total"] == 0


def test_a_record_of_the_same_job_never_shrinks():
    before = status.pool_cost([pod(0, 100, uid="a"), pod(100, 200, uid="b")], 1, None, FAILED)
    # a failed Job's pods are read each pass; one was collected since
    assert status.pool_cost([pod(100, 200, uid="b")], 1, before, FAILED) == before
    assert status.pool_cost([], 1, before, SUCCEEDED) == before
    more = status.pool_cost([pod(0, 100, uid="a"), pod(100, 200, uid="b"), pod(200, 250, uid="c")], 1, before, FAILED)
    assert more["gpuSeconds"]["total"] == 250 and more["gpuPods"] == 3


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.integers(-(10**400), 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
RUNS = st.one_of(
    HOSTILE,
    st.dictionaries(st.sampled_from(["first", "resumed", "verify", "other", "total", "x"]), HOSTILE, max_size=6),
)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    st.integers(0, 16),
    st.lists(
        st.tuples(
            st.integers(0, 10**6), st.integers(0, 10**5), RUNS, st.sampled_from(["Succeeded", "Failed", "Running"])
        ),
        max_size=6,
    ),
)
def test_any_pods_and_any_runs_field_give_parts_that_add_up_to_gpus_times_run_time(gpus, pods):
    made = [
        pod(start, start + length, runs, phase=phase, uid=str(i)) for i, (start, length, runs, phase) in enumerate(pods)
    ]
    finished = [length for _, length, _, phase in pods if phase != "Running"]
    found = status.pool_cost(made, gpus, None, SUCCEEDED)
    if not finished:
        assert found == {}
        return
    seconds = found["gpuSeconds"]
    assert found["gpuPods"] == len(finished)
    assert seconds["total"] == gpus * sum(finished)
    assert_adds_up(seconds)
    # a run is never more than the pods ran, and nothing where no finished pod said it
    for run in ("first", "resumed", "verify"):
        said = [runs for _, _, runs, phase in pods if phase != "Running" and isinstance(runs, dict) and run in runs]
        assert seconds[run] <= gpus * sum(finished) + 0.002
        if not said:
            assert seconds[run] == 0
    status.within({"gpuSeconds": seconds, "gpuPods": found["gpuPods"]}, "pools[]")  # the CRD holds it


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.integers(1, 10**5), st.integers(1, 8), st.lists(st.floats(0, 10**6), min_size=3, max_size=3))
def test_runs_the_pod_could_have_run_are_taken_as_said_and_more_is_scaled_down(length, gpus, values):
    runs = dict(zip(("first", "resumed", "verify"), values, strict=True))
    seconds = status.pool_cost([pod(0, length, runs)], gpus, None, SUCCEEDED)["gpuSeconds"]
    assert_adds_up(seconds)
    if sum(values) <= length:
        for run, value in runs.items():
            assert math.isclose(seconds[run], round(gpus * value, 3), abs_tol=0.002)
    else:  # the pod says more than it ran: nothing is left for other, and the split keeps its proportions
        assert seconds["other"] <= 0.002
        assert math.isclose(sum(seconds[run] for run in runs), gpus * length, abs_tol=0.004)


def test_the_cache_sums_its_pools_and_an_expiry_summary_has_no_runs():
    one = status.pool_cost([pod(0, 10, {"first": 8})], 2, None, SUCCEEDED)
    two = status.pool_cost([pod(0, 20, {"first": 5, "verify": 5}), pod(0, 5, uid="b")], 1, None, SUCCEEDED)
    cost = status.cache_cost([{"name": "a"} | one, {"name": "b"} | two, {"name": "c", "state": "Pending"}])
    assert cost == {
        "gpuSeconds": {"total": 45.0, "first": 21.0, "resumed": 0.0, "verify": 5.0, "other": 19.0},
        "pools": 2,
        "pods": 3,
    }
    assert status.warm_runs({"schema": "compilecache.dev/expire/v1", "deleted": 3}) == {}


def _pool() -> Pool:
    return Pool(
        name="h100",
        node_selector={},
        tolerations=(),
        gpu_resource="nvidia.com/gpu",
        nodes=1,
        gpus_per_node=8,
        gpus_per_pod=2,
        workloads=(),
    )


def _job(done: bool = True) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True", "lastTransitionTime": stamp(100)}] if done else []
    return {
        "metadata": {"name": "j"},
        "status": {"startTime": stamp(0), "conditions": conditions, "active": 0 if done else 1},
    }


def test_pool_status_records_the_cost_with_the_report_and_keeps_it_after_the_pods_and_the_job_are_gone():
    pods = [pod(0, 60, {"first": 40, "verify": 10})]
    entry = status.pool_status(_pool(), "j", _job(), None, pods)
    assert entry["gpuSeconds"] == {"total": 120.0, "first": 80.0, "resumed": 0.0, "verify": 20.0, "other": 20.0}
    assert entry["gpuPods"] == 1 and entry["entries"] == 1
    assert status.pool_status(_pool(), "j", _job(), entry, [])["gpuSeconds"] == entry["gpuSeconds"]  # pods not read
    assert status.pool_status(_pool(), "j", None, entry, [])["gpuSeconds"] == entry["gpuSeconds"]  # Job gone (TTL)
    assert "gpuSeconds" not in status.pool_status(_pool(), "j2", None, entry, [])  # a new pass: its own cost
    assert "gpuSeconds" not in status.pool_status(_pool(), "j", _job(done=False), None, pods)  # still running


def test_a_hostile_runs_field_refuses_nothing_of_the_report():
    pods = [pod(0, 60, {"first": float("nan"), "resumed": -5, "verify": "10", "other": 10**400})]
    entry = status.pool_status(_pool(), "j", _job(), None, pods)
    assert entry["entries"] == 1 and entry.get("reason") != status.REPORT_REFUSED
    assert entry["gpuSeconds"] == {"total": 120.0, "first": 0.0, "resumed": 0.0, "verify": 0.0, "other": 120.0}


def _record(job: str, seconds: dict[str, float] | None, name: str = "h100", hosts: int = 1) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name, "hosts": hosts, "job": job}
    return {"pools": [pool | ({"gpuSeconds": seconds} if seconds else {})]}


def test_the_counter_counts_what_a_record_adds_once_whatever_passes_replicas_and_restarts_see():
    first = {"total": 100.0, "first": 60.0, "resumed": 0.0, "verify": 30.0, "other": 10.0}
    grown = first | {"total": 150.0, "first": 100.0, "other": 20.0}
    m = metrics.Metrics()

    def counted() -> dict[str, float]:
        return {
            run: m.registry.get_sample_value(
                "compilecache_warmup_gpu_seconds_total",
                {"namespace": "ns", "name": "c", "pool": "h100", "hosts": "1", "run": run},
            )
            or 0.0
            for run in RUN_PARTS
        }

    def observe(before: dict[str, Any], after: dict[str, Any]) -> None:
        metricsfeed.observe_cache(m, "ns", "c", after, before=before, after=after)

    observe(_record("j", None), _record("j", None))
    assert counted() == dict.fromkeys(RUN_PARTS, 0.0)  # the series exist before anything is counted
    observe(_record("j", None), _record("j", first))  # the pass that records the Job's pods
    observe(_record("j", first), _record("j", first))  # later passes, another replica, a restarted operator
    observe(_record("j", first), _record("j", first))
    assert counted() == {"first": 60.0, "resumed": 0.0, "verify": 30.0, "other": 10.0}
    observe(_record("j", first), _record("j", grown))  # more of the same Job's pods: only what they add
    assert counted() == {"first": 100.0, "resumed": 0.0, "verify": 30.0, "other": 20.0}
    observe(_record("j", grown), _record("j2", first))  # the next pass's Job counts whole
    assert counted() == {"first": 160.0, "resumed": 0.0, "verify": 60.0, "other": 30.0}
    metricsfeed.observe_cache(
        m, "ns", "c", _record("j3", first), before=_record("j2", first), after=_record("j2", first)
    )
    assert counted()["first"] == 160.0  # the record was not written: nothing counted
    m.forget("ns", "c")
    assert (
        m.registry.get_sample_value(
            "compilecache_warmup_gpu_seconds_total",
            {"namespace": "ns", "name": "c", "pool": "h100", "hosts": "1", "run": "first"},
        )
        is None
    )
