"""The local cluster's autoscaler: which pools grow for which Pending pods, and what it tells them (pure, no I/O).

It plays Cluster Autoscaler's scale-up loop over the pools that declare ``max`` or ``refuse``
(``nodes.NodePool.autoscaled``; a cluster with none runs no autoscaler, as one without CA). What it
does, and how we know the real one does it:

* it looks only at pods the scheduler marked ``PodScheduled=False``, reason ``Unschedulable`` (CA's
  FAQ, "How does scale-up work?": it acts on pods the scheduler could not place); a pod with
  ``schedulingGates`` is never one (the scheduler marks it ``SchedulingGated``) and is skipped outright:
  the Pod Scheduling Readiness docs name Cluster Autoscaler as the downstream integrator that gated
  pods must not churn;
* it simulates each pool's next node (a template built as ``nodes.node`` builds them) with the
  scheduler's own filters (``nodes.rejection``), counting the pods placed and the pods already
  waiting for an upcoming node, so the N pods of a multi-host warm-up, which repel one another
  (required anti-affinity on the host name), ask for N nodes; a pod that fits a node that exists or
  is coming asks for nothing (CA counts upcoming nodes in its simulation);
* a pool that can grow adds one node per pod that needs one, ``scaleUpSeconds`` later, and every pod of
  the decision gets a Normal Event ``TriggeredScaleUp`` from ``cluster-autoscaler``,
  ``pod triggered scale-up: [{<pool> <before>-><after> (max: <max>)}]``, the message shape CA writes
  (``ScaleUpInfo.String``; the same message on each pod of one scale-up, as in its FAQ's examples);
* a pod no pool takes gets ``NotTriggerScaleUp`` (type Normal, as CA's), ``pod didn't trigger scale-up:
  <count> <reason>, ...``: the scheduler's reasons for the pools whose node would not take it
  (``1 node(s) didn't match Pod's node affinity/selector``), ``max node group size reached`` for a pool
  at its ``max``, and a pool's ``refuse`` text (standing in for CA's skip reasons such as ``in backoff
  after failed scale-up``), counted and sorted as CA's ``ReasonsMessage`` does;
* a pod that consumes a ProvisioningRequest (annotation ``autoscaling.x-k8s.io/consume-provisioning-request``)
  asks for nothing: its request brings the capacity (``provisioning.py``), and the pod is told so in an Event
  without a reason, as CA's ``ProvisioningRequestPodsFilter`` does.

Among pools that would all take a pod it picks the first by name (CA's expander, ``random`` by
default, picks one; a fixed choice keeps tests deterministic). There is no scale-down, no resource
accounting (as the scheduler's: one node takes any number of pods its filters allow), no ``FailedScaleUp``.
:class:`Simulation` is the one simulation of nodes, pools and placed pods; ``provisioning.py`` uses it too.
"""

from __future__ import annotations

import copy
import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.local.nodes import NodePool, is_placed, node, rejection

TRIGGERED, NOT_TRIGGERED = "TriggeredScaleUp", "NotTriggerScaleUp"
COMPONENT = "cluster-autoscaler"
MAX_REACHED = "max node group size reached"  # CA's MaxLimitReachedReason
# The pod annotation naming the ProvisioningRequest a pod consumes, and its deprecated spelling (CA's
# apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go and provisioningrequest/pods/pods.go).
CONSUME_KEY = "autoscaling.x-k8s.io/consume-provisioning-request"
CONSUME_KEYS = (CONSUME_KEY, "cluster-autoscaler.kubernetes.io/consume-provisioning-request")


@dataclass(frozen=True)
class Upcoming:
    """A node the autoscaler decided to add, due at ``due`` (the controllers' monotonic clock)."""

    pool: str
    index: int
    due: float

    @property
    def name(self) -> str:
        return f"{self.pool}-{self.index}"


@dataclass
class Plan:
    """One pass's decisions: the nodes to add, which pod waits for which coming node, what each pod is told."""

    grow: list[Upcoming] = field(default_factory=list)
    serving: dict[str, str] = field(default_factory=dict)  # pod uid → the upcoming node it waits for
    said: list[tuple[Mapping[str, Any], str, str]] = field(default_factory=list)  # (pod, reason, message)


def waiting(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is one the autoscaler acts for: Pending, unbound, ungated, marked ``Unschedulable``."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or spec.get("schedulingGates") or status.get("phase") not in (None, "Pending"):
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


@dataclass
class Simulation:
    """One pass's picture of the cluster, as Cluster Autoscaler's snapshot: the nodes a pod may land on, the
    pods placed on them, each autoscaled pool's size (present and coming) and the index of its next node.

    :meth:`place` and :meth:`grow` change it; :meth:`fork` gives a copy to try something on and drop (an
    atomic scale-up: all of its nodes or none).
    """

    pools: dict[str, NodePool]  # the autoscaled pools, by name
    nodes: dict[str, Mapping[str, Any]]
    placed: list[Mapping[str, Any]]
    size: dict[str, int]
    index: dict[str, int]

    def fork(self) -> Simulation:
        """A copy whose changes leave this one as it is."""
        return Simulation(dict(self.pools), dict(self.nodes), list(self.placed), dict(self.size), dict(self.index))

    def fits(self, pod: Mapping[str, Any]) -> str | None:
        """The first node (by name) the scheduler's filters let the pod onto, or ``None``."""
        return next(
            (name for name in sorted(self.nodes) if rejection(pod, self.nodes[name], self.placed, self.nodes) is None),
            None,
        )

    def place(self, pod: Mapping[str, Any], node_name: str) -> None:
        """Count the pod as placed on ``node_name`` (its anti-affinity now repels, and is repelled)."""
        self.placed.append(_bound(pod, node_name))

    def grow(self, pod: Mapping[str, Any], now: float) -> Upcoming | list[str]:
        """Add the next node of the first pool (by name) that would take the pod, and place the pod there; or,
        when none would, each pool's reason (a ``refuse`` text, ``MAX_REACHED``, the scheduler's filter)."""
        reasons: list[str] = []
        for pool in sorted(self.pools.values(), key=lambda p: p.name):
            if pool.refuse is not None:
                reasons.append(pool.refuse)
                continue
            if self.size.get(pool.name, 0) >= pool.limit:
                reasons.append(MAX_REACHED)
                continue
            index = self.index.get(pool.name, pool.count)
            template = node(pool, index)
            why = rejection(pod, template, self.placed, self.nodes | {template["metadata"]["name"]: template})
            if why is not None:
                reasons.append(f"node(s) {why}")
                continue
            new = Upcoming(pool.name, index, now + pool.scale_up_seconds)
            self.size[pool.name] = self.size.get(pool.name, 0) + 1
            self.index[pool.name] = index + 1
            self.nodes[new.name] = template
            self.place(pod, new.name)
            return new
        return reasons


def simulation(
    pools: Sequence[NodePool],
    sizes: Mapping[str, int],
    next_index: Mapping[str, int],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
) -> Simulation:
    """The simulation of the autoscaled ``pools`` over ``nodes`` with the pods placed on them now."""
    return Simulation(
        {pool.name: pool for pool in pools if pool.autoscaled},
        {n["metadata"]["name"]: n for n in nodes},
        [pod for pod in pods if is_placed(pod)],
        dict(sizes),
        dict(next_index),
    )


def consumed_request(pod: Mapping[str, Any]) -> str | None:
    """The ProvisioningRequest the pod consumes (its annotation, or the deprecated one), or ``None``."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return next((str(annotations[key]) for key in CONSUME_KEYS if key in annotations), None)


def plan(
    pools: Sequence[NodePool],
    sizes: Mapping[str, int],
    next_index: Mapping[str, int],
    nodes: Sequence[Mapping[str, Any]],
    upcoming: Sequence[Upcoming],
    pods: Sequence[Mapping[str, Any]],
    serving: Mapping[str, str],
    now: float,
) -> Plan:
    """What the autoscaler does this pass.

    ``sizes``: each autoscaled pool's nodes, present and coming; ``next_index``: the index its next node
    gets (names are never reused); ``nodes``: the Nodes that exist; ``serving``: the pods already
    waiting for an upcoming node (they ask for nothing more). A pod that consumes a ProvisioningRequest
    asks for nothing (CA's ``ProvisioningRequestPodsFilter``: the request brings its capacity) and is told so.
    """
    sim = simulation(pools, sizes, next_index, nodes, pods)
    coming = {u.name for u in upcoming if u.pool in sim.pools}
    sim.nodes |= {u.name: node(sim.pools[u.pool], u.index) for u in upcoming if u.pool in sim.pools}
    live = {pod["metadata"].get("uid"): pod for pod in pods}
    result = Plan(serving={uid: name for uid, name in serving.items() if name in coming and waiting(live.get(uid, {}))})
    for uid, name in result.serving.items():
        sim.place(live[uid], name)
    triggered: list[tuple[Mapping[str, Any], str]] = []
    candidates = sorted(
        (pod for pod in pods if waiting(pod) and pod["metadata"].get("uid") not in result.serving),
        key=lambda pod: (pod["metadata"].get("creationTimestamp") or "", pod["metadata"].get("name") or ""),
    )
    for pod in candidates:
        if (request := consumed_request(pod)) is not None:
            result.said.append((pod, "", consuming_message(pod["metadata"].get("namespace"), request)))
            continue
        fits = sim.fits(pod)
        if fits is not None:  # the scheduler takes it on a node that is here, or it waits for one coming
            if fits in coming:
                result.serving[pod["metadata"]["uid"]] = fits
                sim.place(pod, fits)
            continue
        new = sim.grow(pod, now)
        if isinstance(new, Upcoming):
            result.grow.append(new)
            coming.add(new.name)
            result.serving[pod["metadata"]["uid"]] = new.name
            triggered.append((pod, new.pool))
        else:
            result.said.append((pod, NOT_TRIGGERED, not_triggered_message(new)))
    for pod, pool_name in triggered:
        before = sim.size[pool_name] - sum(1 for u in result.grow if u.pool == pool_name)
        limit = sim.pools[pool_name].limit
        result.said.append((pod, TRIGGERED, triggered_message(pool_name, before, sim.size[pool_name], limit)))
    return result


def consuming_message(namespace: str | None, request: str) -> str:
    """What CA tells a pod it leaves to its ProvisioningRequest (``LogIgnoredInScaleUpEvent``: no reason)."""
    return (
        f"Unschedulable pod didn't trigger scale-up, because it's consuming ProvisioningRequest {namespace}/{request}"
    )


def triggered_message(pool: str, before: int, after: int, limit: int) -> str:
    """CA's ``TriggeredScaleUp`` message for one node group."""
    return f"pod triggered scale-up: [{{{pool} {before}->{after} (max: {limit})}}]"


def not_triggered_message(reasons: Sequence[str]) -> str:
    """CA's ``NotTriggerScaleUp`` message: each reason with its count, sorted (``ReasonsMessage``)."""
    return "pod didn't trigger scale-up: " + ", ".join(sorted(f"{n} {r}" for r, n in Counter(reasons).items()))


def due_reclaims(
    pools: Sequence[NodePool],
    members: Mapping[str, str],
    pods: Sequence[Mapping[str, Any]],
    now: datetime.datetime,
    done: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """The nodes to reclaim now (``reclaimAfterSeconds``): per pool not in ``done``, the node of its first
    running pod, once that pod has run the pool's seconds (by its ``startTime``, whole seconds).

    ``members``: node name → pool name, for the nodes that exist.
    """
    due = []
    for pool in pools:
        if pool.reclaim_after_seconds is None or pool.name in done:
            continue
        running = [
            (start, pod["spec"]["nodeName"])
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running"
            and members.get((pod.get("spec") or {}).get("nodeName") or "") == pool.name
            and (start := _started(pod)) is not None
        ]
        if running:
            start, name = min(running)
            if (now - start).total_seconds() >= pool.reclaim_after_seconds:
                due.append(name)
    return due


def event(pod: Mapping[str, Any], reason: str, message: str, name: str, stamp: str) -> dict[str, Any]:
    """A core v1 Event from the autoscaler about ``pod`` (type Normal, as CA's scale-up Events are)."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _bound(pod: Mapping[str, Any], node_name: str) -> dict[str, Any]:
    """The pod as the simulation places it on ``node_name``."""
    placed = copy.deepcopy(dict(pod))
    placed["spec"] = {**(placed.get("spec") or {}), "nodeName": node_name}
    return placed


def _started(pod: Mapping[str, Any]) -> datetime.datetime | None:
    try:  # the API server's RFC 3339 stamps (``apiserver.now_rfc3339``)
        return datetime.datetime.fromisoformat(str((pod.get("status") or {}).get("startTime")))
    except ValueError:
        return None
