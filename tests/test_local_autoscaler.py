"""The local autoscaler's and the cloud's decisions, without running the cluster (``local/autoscaler.py``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.local import autoscaler, nodes

LABEL = "batch.kubernetes.io/job-name"
PRODUCT = "nvidia.com/gpu.product"
L4 = nodes.NodePool("l4", "NVIDIA-L4", count=0, gpus=1, max_count=1, scale_up_seconds=2.0)
A100 = nodes.NodePool("a100", "NVIDIA-A100", count=0, gpus=8, max_count=2, refuse="in backoff after failed scale-up")
CPU = nodes.NodePool("cpu", "", count=1, gpus=0)
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}


def pending(name: str, product: str = "NVIDIA-L4", job: str | None = None, **spec: Any) -> dict[str, Any]:
    """A pod the scheduler marked Unschedulable, asking for ``product`` (and repelling its Job's pods with ``job``)."""
    pod_spec: dict[str, Any] = {
        "nodeSelector": {PRODUCT: product},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        **spec,
    }
    labels = {}
    if job is not None:
        labels[LABEL] = job
        term = {"labelSelector": {"matchLabels": {LABEL: job}}, "topologyKey": "kubernetes.io/hostname"}
        pod_spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels},
        "spec": pod_spec,
        "status": {"phase": "Pending", "conditions": [dict(UNSCHEDULABLE)]},
    }


def run_plan(
    pools: tuple[nodes.NodePool, ...],
    pods: list[dict[str, Any]],
    upcoming: tuple[autoscaler.Upcoming, ...] = (),
    serving: dict[str, str] | None = None,
) -> autoscaler.Plan:
    sizes = {pool.name: pool.count + sum(1 for u in upcoming if u.pool == pool.name) for pool in pools}
    index = {pool.name: pool.count + sum(1 for u in upcoming if u.pool == pool.name) for pool in pools}
    return autoscaler.plan(pools, sizes, index, nodes.nodes(pools), upcoming, pods, serving or {}, now=100.0)


def said(plan: autoscaler.Plan) -> dict[str, tuple[str, str]]:
    return {pod["metadata"]["name"]: (reason, message) for pod, reason, message in plan.said}


def test_a_pod_a_pool_at_zero_would_take_adds_its_node_after_the_pools_delay() -> None:
    plan = run_plan((L4, A100, CPU), [pending("p")])
    assert plan.grow == [autoscaler.Upcoming("l4", 0, 102.0)]
    assert plan.serving == {"uid-p": "l4-0"}
    assert said(plan) == {"p": ("TriggeredScaleUp", "pod triggered scale-up: [{l4 0->1 (max: 1)}]")}


@pytest.mark.parametrize(
    "change",
    [
        {"spec": {"schedulingGates": [{"name": "compilecache.dev/warm"}]}},  # gated: CA leaves it alone
        {"status": {"phase": "Pending", "conditions": [{**UNSCHEDULABLE, "reason": "SchedulingGated"}]}},
        {"status": {"phase": "Pending", "conditions": []}},  # not yet tried by the scheduler
        {"spec": {"nodeName": "cpu-0"}},  # bound
        {"status": {"phase": "Failed", "conditions": [UNSCHEDULABLE]}},
    ],
)
def test_only_ungated_unschedulable_pending_pods_ask_for_nodes(change: dict[str, Any]) -> None:
    pod = pending("p")
    for key, value in change.items():
        pod[key] = {**pod[key], **value}
    plan = run_plan((L4, CPU), [pod])
    assert (plan.grow, plan.said, plan.serving) == ([], [], {})


def test_the_pods_of_a_multi_host_warm_up_ask_for_one_node_each_in_one_scale_up() -> None:
    pool = nodes.NodePool("h100", "NVIDIA-H100", count=0, gpus=8, max_count=2)
    pods = [pending(f"w-{i}", "NVIDIA-H100", job="w") for i in range(2)]
    plan = run_plan((pool, CPU), pods)
    assert [u.name for u in plan.grow] == ["h100-0", "h100-1"]
    assert plan.serving == {"uid-w-0": "h100-0", "uid-w-1": "h100-1"}
    message = "pod triggered scale-up: [{h100 0->2 (max: 2)}]"  # one decision: every pod gets its message
    assert said(plan) == {"w-0": ("TriggeredScaleUp", message), "w-1": ("TriggeredScaleUp", message)}


def test_a_pool_at_its_max_says_so_and_the_pods_it_can_take_still_get_theirs() -> None:
    pool = nodes.NodePool("h100", "NVIDIA-H100", count=1, gpus=8, max_count=2)
    pods = [pending(f"w-{i}", "NVIDIA-H100", job="w") for i in range(3)]
    running = pods[0] | {"spec": {**pods[0]["spec"], "nodeName": "h100-0"}, "status": {"phase": "Running"}}
    plan = run_plan((pool, CPU), [running, *pods[1:]])
    assert [u.name for u in plan.grow] == ["h100-1"]
    assert said(plan) == {
        "w-1": ("TriggeredScaleUp", "pod triggered scale-up: [{h100 1->2 (max: 2)}]"),
        "w-2": ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached"),
    }


def test_no_scale_up_names_each_pools_reason_counted_and_sorted_as_cluster_autoscaler() -> None:
    full = nodes.NodePool("v100", "NVIDIA-V100", count=1, gpus=8, max_count=1)
    plan = run_plan((L4, A100, full, CPU), [pending("p", "NVIDIA-A100")])
    assert plan.grow == [] and plan.serving == {}
    assert said(plan) == {
        "p": (
            "NotTriggerScaleUp",
            "pod didn't trigger scale-up: 1 in backoff after failed scale-up, 1 max node group size reached, "
            "1 node(s) didn't match Pod's node affinity/selector",
        )
    }
    # The fixed pool (no max, no refuse) is no node group of the autoscaler's: it adds no reason.
    assert autoscaler.not_triggered_message([]) == "pod didn't trigger scale-up: "


def test_a_pod_waiting_for_a_coming_node_asks_nothing_more_and_a_pod_that_fits_it_shares_it() -> None:
    coming = (autoscaler.Upcoming("l4", 0, 101.0),)
    plan = run_plan((L4, CPU), [pending("p"), pending("q")], coming, {"uid-p": "l4-0"})
    assert plan.grow == [] and plan.said == []
    assert plan.serving == {"uid-p": "l4-0", "uid-q": "l4-0"}  # no resource accounting: the node takes both
    # Once the node is here, nothing is coming: the scheduler binds the pods on its next pass.
    landed = autoscaler.plan(
        (L4, CPU),
        {"l4": 1},
        {"l4": 1},
        [*nodes.nodes((CPU,)), nodes.node(L4, 0)],
        (),
        [pending("p")],
        {"uid-p": "l4-0"},
        0.0,
    )
    assert (landed.grow, landed.said, landed.serving) == ([], [], {})


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(0, 3),
    extra=st.integers(0, 3),
    hosts=st.integers(1, 6),
    refuse=st.booleans(),
)
def test_any_scale_up_stays_within_max_and_every_pod_is_served_or_told_why(
    count: int, extra: int, hosts: int, refuse: bool
) -> None:
    pool = nodes.NodePool("h100", "NVIDIA-H100", count=count, gpus=8, max_count=count + extra)
    if refuse:
        pool = nodes.NodePool("h100", "NVIDIA-H100", count=count, gpus=8, max_count=count + extra, refuse="no quota")
    placed = [
        pending(f"w-{i}", "NVIDIA-H100", job="w") | {"status": {"phase": "Running"}} for i in range(min(count, hosts))
    ]
    for i, pod in enumerate(placed):
        pod["spec"] = {**pod["spec"], "nodeName": f"h100-{i}"}
    waiting = [pending(f"w-{i}", "NVIDIA-H100", job="w") for i in range(len(placed), hosts)]
    plan = run_plan((pool, CPU), placed + waiting)
    grown = 0 if refuse else min(extra, len(waiting))
    assert len(plan.grow) == grown and len({u.name for u in plan.grow}) == grown
    assert all(u.name not in {n["metadata"]["name"] for n in nodes.nodes((pool,))} for u in plan.grow)
    told = said(plan)
    assert set(told) == {pod["metadata"]["name"] for pod in waiting}  # each waiting pod hears once
    assert sum(reason == "TriggeredScaleUp" for reason, _ in told.values()) == grown
    assert len(plan.serving) == grown and len(set(plan.serving.values())) == grown  # one node per host
    for reason, message in told.values():
        if reason == "NotTriggerScaleUp":
            assert message.endswith("1 no quota" if refuse else "1 max node group size reached")


def test_the_autoscalers_event_is_a_core_event_about_the_pod() -> None:
    body = autoscaler.event(pending("p"), "TriggeredScaleUp", "m", "p.1", "2026-01-01T00:00:00Z")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "uid-p"}
    assert (body["type"], body["source"], body["count"]) == ("Normal", {"component": "cluster-autoscaler"}, 1)
    assert body["metadata"] == {"name": "p.1", "namespace": "ns"}


# --- reclaims ---------------------------------------------------------------------------------------

START = datetime.datetime(2026, 1, 1, 0, 0, 0, tzinfo=datetime.UTC)


def running_on(name: str, node: str, started: datetime.datetime) -> dict[str, Any]:
    stamp = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": {"phase": "Running", "startTime": stamp}}


def test_a_pool_reclaims_the_node_of_its_first_running_pod_once_it_ran_long_enough() -> None:
    spot = nodes.NodePool("spot", "NVIDIA-L4", count=2, gpus=1, reclaim_after_seconds=5)
    members = {"spot-0": "spot", "spot-1": "spot", "cpu-0": "cpu"}
    pods = [
        running_on("late", "spot-0", START + datetime.timedelta(seconds=3)),
        running_on("first", "spot-1", START),
        running_on("cpu", "cpu-0", START - datetime.timedelta(seconds=60)),  # no reclaim on the fixed pool
        running_on("other", "gone", START - datetime.timedelta(seconds=60)),
    ]
    later = START + datetime.timedelta(seconds=4.9)
    assert autoscaler.due_reclaims((spot, CPU), members, pods, later) == []
    assert autoscaler.due_reclaims((spot, CPU), members, pods, START + datetime.timedelta(seconds=5)) == ["spot-1"]
    assert autoscaler.due_reclaims((spot, CPU), members, pods, START + datetime.timedelta(hours=1), {"spot"}) == []
    finished = [p | {"status": {**p["status"], "phase": "Succeeded"}} for p in pods]
    assert autoscaler.due_reclaims((spot, CPU), members, finished, START + datetime.timedelta(hours=1)) == []


# --- the config -------------------------------------------------------------------------------------


def test_pools_read_their_autoscaling_fields_and_refuse_bad_ones() -> None:
    [pool, cpu] = nodes.pools_from_config(
        {
            "pools": [
                {"name": "l4", "count": 0, "max": 2, "scaleUpSeconds": 0.5, "refuse": "no", "reclaimAfterSeconds": 3}
            ]
        }
    )
    assert (pool.count, pool.limit, pool.scale_up_seconds, pool.refuse, pool.reclaim_after_seconds) == (
        0,
        2,
        0.5,
        "no",
        3.0,
    )
    assert pool.autoscaled and not cpu.autoscaled and cpu.limit == 1
    assert nodes.nodes([pool]) == []
    assert nodes.node(pool, 3)["metadata"]["labels"]["kubernetes.io/hostname"] == "l4-3"
    for bad in (
        {"count": 2, "max": 1},
        {"count": -1},
        {"max": 1000},
        {"scaleUpSeconds": -1},
        {"scaleUpSeconds": 1e9},
        {"reclaimAfterSeconds": -2},
        {"refuse": ""},
        {"refuse": "x" * 1000},
    ):
        with pytest.raises(ValueError, match=r"pools\[0\]"):
            nodes.pools_from_config({"pools": [{"name": "l4", **bad}]})
