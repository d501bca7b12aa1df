"""The local cluster's answer to ProvisioningRequests: the conditions to write and the nodes to add (pure, no I/O).

Cluster Autoscaler's ProvisioningRequest API (``autoscaling.x-k8s.io/v1``, CA's
``apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go``) asks for capacity for ``count`` pods of each
pod set, each pod set naming a PodTemplate in the request's namespace. The local autoscaler
(``autoscaler.py``, which runs only where a pool declares ``max`` or ``refuse``) answers the classes CA
knows, as CA's source does it, with its own simulation (``autoscaler.Simulation``: the scheduler's
filters, a pool's next node):

* every request of a known class gets ``Accepted=True`` (reason ``Accepted``, CA's
  ``provisioningrequest/conditions/conditions.go``); one whose ``Provisioned`` or ``Failed`` is ``True``
  is left alone from then on (CA's injector skips them);
* a pod set whose PodTemplate is missing (or a request beyond this simulation's bounds): ``Failed=True``,
  ``FailedToCreatePods`` (CA's injector, when it cannot make the request's pods);
* ``check-capacity.autoscaling.x-k8s.io`` (``checkcapacity/provisioningclass.go``): when the nodes that
  exist take every pod, ``Provisioned=True``, ``CapacityIsFound``; otherwise ``Provisioned=False``,
  ``CapacityIsNotFound`` (tried again), or with the parameter ``noRetry: "true"`` ``Failed=True``,
  ``CapacityIsNotFound``;
* ``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` (``besteffortatomic/provisioning_class.go``) and
  GKE's ``queued-provisioning.gke.io`` (all nodes at once, as GKE's docs describe it): the pods that the
  nodes that exist take need nothing (all of them: ``Provisioned=True``, ``CapacityIsFound``); for the
  rest the pools grow atomically, every node needed or none. The nodes appear after their pool's
  ``scaleUpSeconds``, then ``Provisioned=True``, ``CapacityIsProvisioned``. When the pools cannot grow that
  much: ``Provisioned=False``, ``CapacityIsNotFound`` with CA's message, to which this simulation adds
  why (the ``NotTriggerScaleUp`` reasons of the first pod no pool takes); tried again on every pass. CA
  never fails such a request for want of capacity: it fails one that is not provisioned after 7 days
  (``Failed=True``, ``Expired``, CA's ``processors/provreq/processor.go``), a time the local cluster takes as
  a parameter;
* any other class is left alone (CA answers only its own classes).

Differences from CA, on purpose: CA's best-effort class writes ``Provisioned=True`` as soon as it asks
for the nodes, this one once they exist (as GKE's queued provisioning does); CA retries a request
without capacity after 10 minutes, this one on every pass; no capacity is booked for a provisioned
request (CA books it for 10 minutes, then ``BookingExpired``), so another pod may take its nodes; no
``CapacityRevoked``, no ``partialCapacityCheck``, no deletion of old requests.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.local.autoscaler import CONSUME_KEY, Upcoming, not_triggered_message, simulation
from compilecache.local.nodes import NodePool

RESOURCE = "autoscaling.x-k8s.io/v1/provisioningrequests"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
QUEUED_PROVISIONING = "queued-provisioning.gke.io"
ATOMIC = frozenset({BEST_EFFORT_ATOMIC, QUEUED_PROVISIONING})
CLASS_KEY = "autoscaling.x-k8s.io/provisioning-class-name"  # the pod annotation naming the request's class
ACCEPTED, PROVISIONED, FAILED = "Accepted", "Provisioned", "Failed"
NO_RETRY = "noRetry"  # check-capacity's parameter: "true" fails the request instead of retrying
EXPIRE_AFTER = datetime.timedelta(days=7)  # CA's defaultExpirationTime
# Bounds on what an untrusted request makes this simulation do (the CRD allows 32 pod sets of any count).
MAX_POD_SETS = 32
MAX_PODS = 64

# CA's reasons and messages (provisioningrequest/conditions/conditions.go and the two classes' files).
ACCEPTED_MESSAGE = "ProvisioningRequest is accepted by ClusterAutoscaler"
FOUND = ("CapacityIsFound", "Capacity is found in the cluster")
PROVISIONED_REASON = ("CapacityIsProvisioned", "Capacity is found in the cluster")
NOT_FOUND_RETRY = ("CapacityIsNotFound", "Capacity is not found, CA will try to find it later.")
NOT_FOUND_FINAL = ("CapacityIsNotFound", "CA could not find requested capacity")
EXPIRED = ("Expired", "ProvisioningRequest is expired")
FAILED_TO_CREATE_PODS = "FailedToCreatePods"


@dataclass(frozen=True)
class Decision:
    """What to do with one request this pass."""

    conditions: list[dict[str, Any]] | None = None  # its new status.conditions; None: leave it alone
    grow: list[Upcoming] = field(default_factory=list)  # the nodes to add for it
    awaiting: tuple[str, ...] = ()  # the coming nodes it waits for before Provisioned=True


def decide(
    request: Mapping[str, Any],
    templates: Mapping[str, Mapping[str, Any]],
    pools: Sequence[NodePool],
    sizes: Mapping[str, int],
    next_index: Mapping[str, int],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    awaiting: Sequence[str],
    coming: Sequence[str],
    now: float,
    wall: datetime.datetime,
    expire_after: datetime.timedelta = EXPIRE_AFTER,
) -> Decision:
    """The local autoscaler's answer to ``request`` this pass.

    ``templates``: the PodTemplates of the request's namespace, by name; ``sizes``, ``next_index``:
    as :func:`autoscaler.plan` takes them; ``nodes``: the Nodes that exist; ``pods``: the pods of the
    cluster; ``awaiting``: the nodes an earlier pass added for the request; ``coming``: the names of all
    the nodes still coming; ``now``: the controllers' monotonic clock; ``wall``: the time, for expiry.
    """
    spec, status = request.get("spec") or {}, request.get("status") or {}
    name = str(spec.get("provisioningClassName"))
    if name != CHECK_CAPACITY and name not in ATOMIC:
        return Decision()
    old = list(status.get("conditions") or [])
    if is_true(old, PROVISIONED) or is_true(old, FAILED):
        return Decision()
    generation = (request.get("metadata") or {}).get("generation")
    stamp = wall.strftime("%Y-%m-%dT%H:%M:%SZ")

    def said(type_: str, value: bool, reason: tuple[str, str], base: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return set_condition(base, type_, value, *reason, generation=generation, stamp=stamp)

    accepted = said(ACCEPTED, True, (ACCEPTED, ACCEPTED_MESSAGE), old)
    if _expired(request, wall, expire_after):
        return Decision(said(FAILED, True, EXPIRED, accepted))
    present = {n["metadata"]["name"] for n in nodes}
    if awaiting and all(n in present or n in coming for n in awaiting):
        if all(n in present for n in awaiting):
            return Decision(said(PROVISIONED, True, PROVISIONED_REASON, accepted))
        return Decision(accepted, awaiting=tuple(awaiting))
    wanted = pods_for(request, templates)
    if isinstance(wanted, str):
        return Decision(said(FAILED, True, (FAILED_TO_CREATE_PODS, wanted), accepted))
    sim = simulation(pools, sizes, next_index, nodes, pods)
    grown: list[Upcoming] = []
    for pod in wanted:
        if (fits := sim.fits(pod)) is not None:
            sim.place(pod, fits)
            continue
        if name == CHECK_CAPACITY:
            final = (spec.get("parameters") or {}).get(NO_RETRY) == "true"
            return Decision(
                said(FAILED, True, NOT_FOUND_FINAL, accepted)
                if final
                else said(PROVISIONED, False, NOT_FOUND_RETRY, accepted)
            )
        new = sim.grow(pod, now)
        if not isinstance(new, Upcoming):  # atomic: one pod without a node, and no node is added
            reason, message = NOT_FOUND_RETRY
            return Decision(said(PROVISIONED, False, (reason, f"{message} {not_triggered_message(new)}"), accepted))
        grown.append(new)
    if not grown:
        return Decision(said(PROVISIONED, True, FOUND, accepted))
    return Decision(accepted, grown, tuple(u.name for u in grown))


def pods_for(request: Mapping[str, Any], templates: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]] | str:
    """The pods the request stands for, as CA makes them (``provisioningrequest/pods/pods.go``: from each pod
    set's PodTemplate, ``count`` times, named ``<request>-<set>-<n>``, annotated with the request and its
    class); or why they cannot be made."""
    meta, spec = request.get("metadata") or {}, request.get("spec") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    sets = spec.get("podSets")
    if not isinstance(sets, list) or not 0 < len(sets) <= MAX_POD_SETS:
        return f"spec.podSets must list 1 to {MAX_POD_SETS} pod sets"
    counts: list[int] = []
    for pod_set in sets:
        count = pod_set.get("count") if isinstance(pod_set, Mapping) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return "every pod set needs a count of at least 1"
        counts.append(count)
    if sum(counts) > MAX_PODS:
        return f"the local cluster simulates at most {MAX_PODS} pods per ProvisioningRequest"
    pods: list[dict[str, Any]] = []
    for index, (pod_set, count) in enumerate(zip(sets, counts, strict=True)):
        ref = str((pod_set.get("podTemplateRef") or {}).get("name") or "")
        template = templates.get(ref)
        if template is None:
            return f'podSets[{index}]: PodTemplate "{namespace}/{ref}" not found'
        body = template.get("template") or {}
        for n in range(count):
            pod_name = f"{name}-{index}-{n}"
            annotations = {
                **((body.get("metadata") or {}).get("annotations") or {}),
                CONSUME_KEY: str(name),
                CLASS_KEY: str(spec.get("provisioningClassName")),
            }
            pod_meta = {
                "name": pod_name,
                "namespace": namespace,
                "uid": f"{namespace}/{pod_name}",
                "labels": dict((body.get("metadata") or {}).get("labels") or {}),
                "annotations": annotations,
            }
            pods.append({"metadata": pod_meta, "spec": dict(body.get("spec") or {})})
    return pods


def is_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    """Whether the condition ``type_`` is there with status ``True`` (``meta.IsStatusConditionTrue``)."""
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    value: bool,
    reason: str,
    message: str,
    *,
    generation: int | None,
    stamp: str,
) -> list[dict[str, Any]]:
    """``conditions`` with ``type_`` set, in its place or appended (CA's ``AddOrUpdateCondition``); its
    ``lastTransitionTime`` moves only when its status changes (``meta.SetStatusCondition``)."""
    status = "True" if value else "False"
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    new: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or stamp,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    if old is None:
        return [*map(dict, conditions), new]
    return [new if c is old else dict(c) for c in conditions]


def _expired(request: Mapping[str, Any], wall: datetime.datetime, expire_after: datetime.timedelta) -> bool:
    stamp = (request.get("metadata") or {}).get("creationTimestamp")
    try:  # the API server's RFC 3339 stamps (``apiserver.now_rfc3339``)
        created = datetime.datetime.fromisoformat(str(stamp))
    except ValueError:
        return False
    return wall - created >= expire_after
