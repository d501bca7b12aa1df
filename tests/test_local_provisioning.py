"""The local autoscaler's answer to ProvisioningRequests, without running the cluster (``local/provisioning.py``)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.local import autoscaler, nodes, provisioning

PRODUCT = "nvidia.com/gpu.product"
GROUP = "compilecache.dev/warmup-job"
L4 = nodes.NodePool("l4", "NVIDIA-L4", count=0, gpus=1, max_count=2, scale_up_seconds=2.0)
REFUSED = nodes.NodePool("l4", "NVIDIA-L4", count=0, gpus=1, max_count=2, refuse="in backoff after failed scale-up")
CPU = nodes.NodePool("cpu", "", count=1, gpus=0)
CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
WALL = CREATED + datetime.timedelta(minutes=1)
STAMP = WALL.strftime("%Y-%m-%dT%H:%M:%SZ")
ATOMIC = sorted(provisioning.ATOMIC)


def template(name: str = "warm", product: str = "NVIDIA-L4", spread: bool = True) -> dict[str, Any]:
    """A PodTemplate of a warm-up pod for ``product``; with ``spread``, its pods repel one another (one per node)."""
    spec: dict[str, Any] = {
        "nodeSelector": {PRODUCT: product},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "warm", "image": "x:1"}],
    }
    if spread:
        term = {"labelSelector": {"matchLabels": {GROUP: name}}, "topologyKey": "kubernetes.io/hostname"}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    body = {"metadata": {"labels": {GROUP: name}}, "spec": spec}
    return {"metadata": {"name": name, "namespace": "ns"}, "template": body}


def request(
    class_name: str, count: int = 2, ref: str = "warm", conditions: Sequence[dict[str, Any]] = (), **parameters: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "provisioningClassName": class_name,
        "podSets": [{"podTemplateRef": {"name": ref}, "count": count}],
    }
    if parameters:
        spec["parameters"] = parameters
    meta = {"name": "warm", "namespace": "ns", "uid": "u1", "generation": 1, "creationTimestamp": CREATED.isoformat()}
    return {"metadata": meta, "spec": spec, "status": {"conditions": list(conditions)}}


def decide(
    req: dict[str, Any],
    pools: tuple[nodes.NodePool, ...] = (L4, CPU),
    present: Sequence[dict[str, Any]] | None = None,
    awaiting: Sequence[str] = (),
    coming: Sequence[str] = (),
    pods: Sequence[dict[str, Any]] = (),
    templates: dict[str, dict[str, Any]] | None = None,
    wall: datetime.datetime = WALL,
) -> provisioning.Decision:
    there = nodes.nodes(pools) if present is None else list(present)
    sizes = {pool.name: sum(n["metadata"]["name"].startswith(f"{pool.name}-") for n in there) for pool in pools}
    for name in coming:
        sizes[name.rsplit("-", 1)[0]] += 1
    index = {pool.name: sizes[pool.name] for pool in pools}
    return provisioning.decide(
        req,
        {"warm": template()} if templates is None else templates,
        pools,
        sizes,
        index,
        there,
        pods,
        awaiting,
        coming,
        now=100.0,
        wall=wall,
    )


def by_type(decision: provisioning.Decision) -> dict[str, tuple[str, str, str]]:
    assert decision.conditions is not None
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in decision.conditions}


ACCEPTED = ("True", "Accepted", "ProvisioningRequest is accepted by ClusterAutoscaler")


@pytest.mark.parametrize("class_name", ATOMIC)
def test_an_atomic_request_adds_every_node_then_is_provisioned_once_they_exist(class_name: str) -> None:
    first = decide(request(class_name))
    assert first.grow == [autoscaler.Upcoming("l4", 0, 102.0), autoscaler.Upcoming("l4", 1, 102.0)]
    assert first.awaiting == ("l4-0", "l4-1")
    assert by_type(first) == {"Accepted": ACCEPTED}  # not Provisioned while the nodes boot
    # One node here, one still coming: it waits, and asks for nothing more.
    half = decide(
        request(class_name, conditions=first.conditions or ()),
        present=[*nodes.nodes((CPU,)), nodes.node(L4, 0)],
        awaiting=first.awaiting,
        coming=["l4-1"],
    )
    assert half.grow == [] and half.awaiting == first.awaiting and half.conditions == first.conditions
    done = decide(
        request(class_name, conditions=first.conditions or ()),
        present=[*nodes.nodes((CPU,)), nodes.node(L4, 0), nodes.node(L4, 1)],
        awaiting=first.awaiting,
    )
    assert done.grow == [] and done.awaiting == ()
    assert by_type(done) == {
        "Accepted": ACCEPTED,
        "Provisioned": ("True", "CapacityIsProvisioned", "Capacity is found in the cluster"),
    }
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] == STAMP for c in done.conditions or ())
    # Provisioned: CA leaves it alone from now on.
    assert decide(request(class_name, conditions=done.conditions or ())) == provisioning.Decision()


@pytest.mark.parametrize("class_name", ATOMIC)
def test_an_atomic_request_adds_no_node_when_the_pools_cannot_add_them_all_and_says_why(class_name: str) -> None:
    small = nodes.NodePool("l4", "NVIDIA-L4", count=0, gpus=1, max_count=1)
    for pools, why in (
        ((small, CPU), "pod didn't trigger scale-up: 1 max node group size reached"),
        ((REFUSED, CPU), "pod didn't trigger scale-up: 1 in backoff after failed scale-up"),
    ):
        decision = decide(request(class_name), pools)
        assert decision.grow == [] and decision.awaiting == ()
        # CA fails no request for want of capacity: it says so and tries again.
        assert by_type(decision) == {
            "Accepted": ACCEPTED,
            "Provisioned": (
                "False",
                "CapacityIsNotFound",
                f"Capacity is not found, CA will try to find it later. {why}",
            ),
        }


@pytest.mark.parametrize("class_name", ATOMIC)
def test_the_pods_the_nodes_that_exist_take_need_no_new_node(class_name: str) -> None:
    one = nodes.NodePool("l4", "NVIDIA-L4", count=1, gpus=1, max_count=2, scale_up_seconds=2.0)
    decision = decide(request(class_name), (one, CPU))
    assert [u.name for u in decision.grow] == ["l4-1"]
    all_fit = decide(request(class_name, count=1), (one, CPU))
    assert all_fit.grow == []
    assert by_type(all_fit)["Provisioned"] == ("True", "CapacityIsFound", "Capacity is found in the cluster")
    # A running pod its template repels takes the node away from it.
    running = {
        "metadata": {"name": "r", "namespace": "ns", "labels": {GROUP: "warm"}},
        "spec": {"nodeName": "l4-0"},
        "status": {"phase": "Running"},
    }
    assert [u.name for u in decide(request(class_name, count=1), (one, CPU), pods=[running]).grow] == ["l4-1"]


def test_a_request_whose_awaited_node_went_away_asks_again_counting_the_nodes_still_coming() -> None:
    first = decide(request(provisioning.BEST_EFFORT_ATOMIC))
    # l4-0 was reclaimed before the request was provisioned; l4-1 still comes and counts towards the max.
    again = decide(request(provisioning.BEST_EFFORT_ATOMIC), awaiting=first.awaiting, coming=["l4-1"])
    assert again.grow == [] and again.awaiting == ()
    assert by_type(again)["Provisioned"] == (
        "False",
        "CapacityIsNotFound",
        "Capacity is not found, CA will try to find it later. "
        "pod didn't trigger scale-up: 1 max node group size reached",
    )


def test_check_capacity_looks_at_the_nodes_that_exist_and_never_adds_one() -> None:
    fixed = nodes.NodePool("l4", "NVIDIA-L4", count=1, gpus=1)
    found = decide(request(provisioning.CHECK_CAPACITY, count=1), (fixed, CPU))
    assert found.grow == []
    assert by_type(found) == {
        "Accepted": ACCEPTED,
        "Provisioned": ("True", "CapacityIsFound", "Capacity is found in the cluster"),
    }
    # Two pods that repel one another on a pool of one node; a pool at zero that could grow is no capacity.
    for pools in ((fixed, CPU), (L4, CPU)):
        missing = decide(request(provisioning.CHECK_CAPACITY), pools)
        assert missing.grow == []
        assert by_type(missing)["Provisioned"] == (
            "False",
            "CapacityIsNotFound",
            "Capacity is not found, CA will try to find it later.",
        )
        final = decide(request(provisioning.CHECK_CAPACITY, noRetry="true"), pools)
        assert final.grow == []
        assert by_type(final) == {
            "Accepted": ACCEPTED,
            "Failed": ("True", "CapacityIsNotFound", "CA could not find requested capacity"),
        }
        assert (
            by_type(decide(request(provisioning.CHECK_CAPACITY, noRetry="false"), pools))["Provisioned"][0] == "False"
        )


def test_requests_of_other_classes_and_finished_ones_are_left_alone() -> None:
    assert decide(request("example.com/mine")) == provisioning.Decision()
    for type_ in ("Provisioned", "Failed"):
        done = {"type": type_, "status": "True", "reason": "r", "message": "m", "lastTransitionTime": STAMP}
        assert decide(request(provisioning.BEST_EFFORT_ATOMIC, conditions=[done])) == provisioning.Decision()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"templates": {}}, 'podSets[0]: PodTemplate "ns/warm" not found'),
        ({"count": 0}, "every pod set needs a count of at least 1"),
        ({"count": provisioning.MAX_PODS + 1}, "the local cluster simulates at most 64 pods per ProvisioningRequest"),
    ],
)
def test_a_request_whose_pods_cannot_be_made_fails(change: dict[str, Any], message: str) -> None:
    decision = decide(
        request(provisioning.BEST_EFFORT_ATOMIC, count=change.get("count", 2)), templates=change.get("templates")
    )
    assert decision.grow == []
    assert by_type(decision) == {"Accepted": ACCEPTED, "Failed": ("True", "FailedToCreatePods", message)}


def test_a_request_not_provisioned_in_time_expires() -> None:
    late = CREATED + provisioning.EXPIRE_AFTER
    decision = decide(request(provisioning.BEST_EFFORT_ATOMIC), (REFUSED, CPU), wall=late)
    assert by_type(decision)["Failed"] == ("True", "Expired", "ProvisioningRequest is expired")
    assert decide(request(provisioning.BEST_EFFORT_ATOMIC), wall=late - datetime.timedelta(seconds=1)).grow


def test_the_pods_of_a_request_are_its_templates_counted_named_and_annotated_as_cluster_autoscaler_makes_them() -> None:
    req = request(provisioning.QUEUED_PROVISIONING)
    req["spec"]["podSets"].append({"podTemplateRef": {"name": "other"}, "count": 1})
    pods = provisioning.pods_for(req, {"warm": template(), "other": template("other", spread=False)})
    assert not isinstance(pods, str)
    assert [p["metadata"]["name"] for p in pods] == ["warm-0-0", "warm-0-1", "warm-1-0"]
    assert pods[2]["metadata"]["annotations"] == {
        "autoscaling.x-k8s.io/consume-provisioning-request": "warm",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io",
    }
    assert pods[0]["metadata"]["labels"] == {GROUP: "warm"} and pods[0]["spec"]["nodeSelector"] == {
        PRODUCT: "NVIDIA-L4"
    }


def test_a_condition_moves_its_transition_time_only_when_its_status_changes() -> None:
    old = [{"type": "Provisioned", "status": "False", "reason": "a", "message": "m", "lastTransitionTime": "t0"}]
    same = provisioning.set_condition(old, "Provisioned", False, "b", "n", generation=2, stamp="t1")
    assert same == [
        {
            "type": "Provisioned",
            "status": "False",
            "reason": "b",
            "message": "n",
            "lastTransitionTime": "t0",
            "observedGeneration": 2,
        }
    ]
    flipped = provisioning.set_condition(same, "Provisioned", True, "c", "o", generation=2, stamp="t1")
    assert flipped[0]["lastTransitionTime"] == "t1" and flipped[0]["status"] == "True"
    added = provisioning.set_condition(flipped, "Accepted", True, "Accepted", "", generation=None, stamp="t2")
    assert [c["type"] for c in added] == ["Provisioned", "Accepted"] and "observedGeneration" not in added[1]
    assert old[0]["lastTransitionTime"] == "t0" and old[0]["reason"] == "a"  # the input stays as it was


@settings(max_examples=80, deadline=None)
@given(
    count=st.integers(0, 3),
    extra=st.integers(0, 3),
    hosts=st.integers(1, 6),
    refuse=st.booleans(),
    atomic=st.booleans(),
)
def test_any_request_gets_all_its_nodes_or_none_within_max_and_check_capacity_gets_none(
    count: int, extra: int, hosts: int, refuse: bool, atomic: bool
) -> None:
    pool = nodes.NodePool(
        "l4", "NVIDIA-L4", count=count, gpus=1, max_count=count + extra, refuse="no quota" if refuse else None
    )
    class_name = provisioning.BEST_EFFORT_ATOMIC if atomic else provisioning.CHECK_CAPACITY
    decision = decide(request(class_name, count=hosts), (pool, CPU))
    need = max(hosts - count, 0)  # one pod per node: the nodes that exist take `count` of them
    conditions = by_type(decision)
    assert conditions["Accepted"] == ACCEPTED
    if need == 0:
        assert decision.grow == [] and conditions["Provisioned"][:2] == ("True", "CapacityIsFound")
    elif atomic and not refuse and need <= extra:
        assert len(decision.grow) == need and set(conditions) == {"Accepted"}
        assert {u.name for u in decision.grow} == {f"l4-{i}" for i in range(count, count + need)}
        assert decision.awaiting == tuple(u.name for u in decision.grow)
    else:
        assert decision.grow == [] and decision.awaiting == ()
        assert conditions["Provisioned"][:2] == ("False", "CapacityIsNotFound")


# --- the autoscaler leaves a request's pods to it ----------------------------------------------------


def test_a_pod_that_consumes_a_request_triggers_no_scale_up_and_is_told_so() -> None:
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    pod: dict[str, Any] = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "uid-p",
            "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": "warm"},
        },
        "spec": template()["template"]["spec"],
        "status": {"phase": "Pending", "conditions": [unschedulable]},
    }
    plan = autoscaler.plan((L4, CPU), {"l4": 0}, {"l4": 0}, nodes.nodes((L4, CPU)), (), [pod], {}, 0.0)
    assert plan.grow == [] and plan.serving == {}
    message = "Unschedulable pod didn't trigger scale-up, because it's consuming ProvisioningRequest ns/warm"
    assert [(p["metadata"]["name"], reason, said) for p, reason, said in plan.said] == [("p", "", message)]
    # The deprecated annotation counts too; without either, the pod brings up its node.
    pod["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/consume-provisioning-request": "warm"}
    assert autoscaler.plan((L4, CPU), {"l4": 0}, {"l4": 0}, nodes.nodes((L4, CPU)), (), [pod], {}, 0.0).grow == []
    pod["metadata"]["annotations"] = {}
    assert [u.name for u in autoscaler.plan((L4, CPU), {}, {}, nodes.nodes((L4, CPU)), (), [pod], {}, 0.0).grow] == [
        "l4-0"
    ]
