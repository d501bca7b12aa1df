"""Status computation: pool states from Jobs, phases, conditions and transition Events."""

import pytest

from compilecache.controller import api, jobs, status
from compilecache.controller.pools import Pool, resolve_pools
from specs import cache, cluster

POOL = Pool("h100", {"p": "h100"}, (), "nvidia.com/gpu", nodes=3, gpus_per_node=8, gpus_per_pod=8, workloads=())


def _job(*, active=0, condition=None, reason=None):
    job_status = {"startTime": "2026-11-21T10:00:00Z", "active": active}
    if condition:
        job_status["conditions"] = [
            {"type": condition, "status": "True", "reason": reason, "lastTransitionTime": "2026-11-21T10:05:00Z"}
        ]
    return {"metadata": {"name": "j"}, "status": job_status}


@pytest.mark.parametrize(
    ("job", "state", "reason"),
    [
        ({"metadata": {"name": "j"}}, "Pending", "JobPending"),
        (_job(active=1), "Running", "JobRunning"),
        (_job(condition="Complete"), "Succeeded", "JobSucceeded"),
        (_job(condition="Failed", reason="BackoffLimitExceeded"), "Failed", "BackoffLimitExceeded"),
        (_job(condition="Failed", reason="DeadlineExceeded"), "Failed", "DeadlineExceeded"),
    ],
)
def test_pool_state_follows_the_job(job, state, reason):
    entry = status.pool_status(POOL, "j", job, None)
    assert (entry["state"], entry["reason"], entry["job"]) == (state, reason, "j")
    if state in ("Succeeded", "Failed"):
        assert entry["finishedAt"] == "2026-11-21T10:05:00Z"


def _pod(finished, *, init=(), main=()):
    def states(items):
        return [
            {"name": name, "state": {"terminated": {"exitCode": code, "message": message, "finishedAt": finished}}}
            for name, code, message in items
        ]

    return {"status": {"initContainerStatuses": states(init), "containerStatuses": states(main)}}


def test_a_failed_pool_says_what_its_command_said():
    failed = _job(condition="Failed", reason="BackoffLimitExceeded")
    retried = [
        _pod("2026-11-21T10:01:00Z", main=[("warm", 1, "Traceback ...\nWarmError: first try")]),
        _pod("2026-11-21T10:04:00Z", main=[("warm", 1, "compilecache warm: no module 'mypkg'\n")]),
    ]
    entry = status.pool_status(POOL, "j", failed, None, retried)
    assert entry["reason"] == "BackoffLimitExceeded"  # the Job's reason stays; the newest pod says why
    assert entry["message"].startswith("compilecache warm: no module 'mypkg' (")
    # A script runs in an init container; a container that exited 0 says nothing about the failure.
    script = _pod("2026-11-21T10:04:00Z", init=[("script-0", 2, "train.py: bad shape"), ("script-1", 0, "ok")])
    assert status.pool_status(POOL, "j", failed, None, [script])["message"].startswith("train.py: bad shape (")
    # No message from any pod: the Job's own words.
    silent = status.pool_status(POOL, "j", failed, None, [_pod("t", main=[("warm", 0, "fine")])])
    assert silent["message"] == status.pool_status(POOL, "j", failed, None)["message"]
    # A running or successful Job's pods are not read for a reason.
    assert status.pool_status(POOL, "j", _job(active=1), None, retried)["message"] == "the warm-up pod is running"


def test_warm_containers_fall_back_to_their_log_when_they_fail():
    """What a kubelet copies from the log tail into the termination message (the message above)."""
    obj = cache()
    spec = api.parse_cache(obj)
    job = jobs.warmup_job(obj, spec, resolve_pools(spec, cluster())[0])
    pod = job["spec"]["template"]["spec"]
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_finished_record_survives_job_ttl_but_not_a_new_hash():
    done = status.pool_status(POOL, "j", _job(condition="Complete"), None)
    assert status.pool_status(POOL, "j", None, done)["state"] == "Succeeded"
    assert status.pool_status(POOL, "j2", None, done)["state"] == "Pending"


def test_pool_without_nodes_or_with_too_many_gpus():
    empty = Pool("b200", {"p": "b200"}, (), "nvidia.com/gpu", 0, 0, 0, ())
    assert status.pool_status(empty, "j", None, None)["state"] == "NoNodes"
    greedy = Pool("h100", {}, (), "nvidia.com/gpu", 2, 8, 16, ())
    entry = status.pool_status(greedy, "j", None, None)
    assert (entry["state"], entry["reason"]) == ("Failed", "TooManyGPUs")
    assert "job" not in entry


@pytest.mark.parametrize(
    ("states", "phase"),
    [
        ([], "Pending"),
        (["NoNodes"], "Pending"),
        (["Pending", "Succeeded"], "Warming"),
        (["Running", "Failed"], "Warming"),
        (["Succeeded", "Succeeded", "NoNodes"], "Ready"),
        (["Succeeded", "Failed"], "Degraded"),
        (["Failed", "Failed", "NoNodes"], "Failed"),
    ],
)
def test_phase_of_pools(states, phase):
    pools = [{"name": f"p{i}", "state": state} for i, state in enumerate(states)]
    assert status.phase_of(pools)[0] == phase


@pytest.mark.parametrize(
    ("old", "phase", "serving"),
    [
        ({"phase": "Ready", "specHash": "h"}, "Warming", True),  # a scheduled re-warm, a new pool
        ({"phase": "Ready", "specHash": "h"}, "Expiring", True),  # a lifecycle-only change
        ({"phase": "Ready", "specHash": "other"}, "Warming", False),  # what is compiled changed
        ({"phase": "Warming", "specHash": "h"}, "Expiring", False),  # never was Ready
        ({"phase": "Ready", "specHash": "h"}, "Failed", False),  # a failed refresh is told as it is
    ],
)
def test_a_ready_cache_keeps_serving_while_it_refreshes(old, phase, serving):
    assert status.keeps_serving(old, "h", phase) is serving


def test_pools_ready_counts_pools_with_nodes():
    pools = [{"name": "a", "state": "Succeeded"}, {"name": "b", "state": "Running"}, {"name": "c", "state": "NoNodes"}]
    assert status.pools_ready(pools) == "1/2"


def test_condition_transition_time_moves_only_on_change():
    first = status.condition("Ready", False, "Warming", "m", now="t1", generation=1)
    same = status.condition("Ready", False, "Warming", "m2", now="t2", generation=2, previous=[first])
    flipped = status.condition("Ready", True, "Ready", "m3", now="t3", generation=2, previous=[same])
    times = [first["lastTransitionTime"], same["lastTransitionTime"], flipped["lastTransitionTime"]]
    assert times == ["t1", "t1", "t3"]
    assert same["observedGeneration"] == 2


def test_transitions_post_one_event_per_change():
    old = {"phase": "Warming", "message": "m", "pools": [{"name": "a", "state": "Running", "job": "j"}]}
    new = {"phase": "Degraded", "message": "n", "pools": [{"name": "a", "state": "Failed", "job": "j", "message": "x"}]}
    events = status.transitions(old, new)
    assert [(e.type, e.reason) for e in events] == [("Warning", "PoolFailed"), ("Warning", "Degraded")]
    assert status.transitions(new, new) == []


def test_invalid_spec_event_uses_the_condition_reason_and_repeats_on_new_errors():
    bad = {"phase": "Failed", "message": "a", "conditions": [{"type": "Ready", "reason": "InvalidSpec"}]}
    worse = bad | {"message": "b"}
    assert [(e.type, e.reason) for e in status.transitions({}, bad)] == [("Warning", "InvalidSpec")]
    assert [e.reason for e in status.transitions(bad, worse)] == ["InvalidSpec"]


def test_pools_that_change_alike_share_one_event_and_a_long_list_is_cut() -> None:
    new_pool = {"state": status.POOL_PENDING, "job": "j", "message": "the warm-up Job was created"}
    pools = [new_pool | {"name": f"p{index}", "job": f"j{index}"} for index in range(12)]
    pools.append({"name": "q", "job": "jq", "state": status.POOL_NO_NODES, "message": "no node matches"})
    events = status.transitions({}, {"phase": "Warming", "pools": pools})
    reasons = [(e.reason, e.message) for e in events]
    assert reasons[0] == (
        "PoolPending",
        "pools p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 and 2 more: Pending (the warm-up Job was created)",
    )
    assert reasons[1] == ("PoolNoNodes", "pool q: NoNodes (no node matches)")
    assert [e.reason for e in events].count("PoolPending") == 1
