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
  after failed scale-up``), counted and sorted as CA's ``ReasonsMessage`` does.

Among pools that would all take a pod it picks the first by name (CA's expander, ``random`` by
default, picks one; a fixed choice keeps tests deterministic). There is no scale-down, no resource
accounting (as the scheduler's: one node takes any number of pods its filters allow), no
``ProvisioningRequest``, no ``FailedScaleUp``.
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
    waiting for an upcoming node (they ask for nothing more).
    """
    by_pool = {pool.name: pool for pool in pools if pool.autoscaled}
    by_name = {n["metadata"]["name"]: n for n in nodes}
    coming = {u.name: node(by_pool[u.pool], u.index) for u in upcoming if u.pool in by_pool}
    by_name |= coming
    live = {pod["metadata"].get("uid"): pod for pod in pods}
    result = Plan(serving={uid: name for uid, name in serving.items() if name in coming and waiting(live.get(uid, {}))})
    placed = [pod for pod in pods if is_placed(pod)]
    placed += [_bound(live[uid], name) for uid, name in result.serving.items()]
    size, index = dict(sizes), dict(next_index)
    triggered: list[tuple[Mapping[str, Any], str]] = []
    candidates = sorted(
        (pod for pod in pods if waiting(pod) and pod["metadata"].get("uid") not in result.serving),
        key=lambda pod: (pod["metadata"].get("creationTimestamp") or "", pod["metadata"].get("name") or ""),
    )
    for pod in candidates:
        fits = next((name for name in sorted(by_name) if rejection(pod, by_name[name], placed, by_name) is None), None)
        if fits is not None:  # the scheduler takes it on a node that is here, or it waits for one coming
            if fits in coming:
                result.serving[pod["metadata"]["uid"]] = fits
                placed.append(_bound(pod, fits))
            continue
        reasons: list[str] = []
        for pool in sorted(by_pool.values(), key=lambda p: p.name):
            if pool.refuse is not None:
                reasons.append(pool.refuse)
                continue
            if size.get(pool.name, 0) >= pool.limit:
                reasons.append(MAX_REACHED)
                continue
            template = node(pool, index.get(pool.name, pool.count))
            why = rejection(pod, template, placed, by_name | {template["metadata"]["name"]: template})
            if why is not None:
                reasons.append(f"node(s) {why}")
                continue
            new = Upcoming(pool.name, index.get(pool.name, pool.count), now + pool.scale_up_seconds)
            result.grow.append(new)
            size[pool.name] = size.get(pool.name, 0) + 1
            index[pool.name] = new.index + 1
            by_name[new.name] = coming[new.name] = template
            result.serving[pod["metadata"]["uid"]] = new.name
            placed.append(_bound(pod, new.name))
            triggered.append((pod, pool.name))
            break
        else:
            result.said.append((pod, NOT_TRIGGERED, not_triggered_message(reasons)))
    for pod, pool_name in triggered:
        pool = by_pool[pool_name]
        before = size[pool_name] - sum(1 for u in result.grow if u.pool == pool_name)
        result.said.append((pod, TRIGGERED, triggered_message(pool_name, before, size[pool_name], pool.limit)))
    return result


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
