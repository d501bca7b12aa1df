"""Training admitted through a Kueue AdmissionCheck: our check's state on each Workload (pure; I/O in ``sync``).

With Kueue, a training Job holds its quota while its pods wait behind the scheduling gate, and
Kueue's ``waitForPodsReady`` evicts it long before ``gateTimeout``. Kueue's own answer is an
admission check: a ClusterQueue lists AdmissionChecks, a Workload that got its quota lists their
states in ``status.admissionChecks`` (``Pending`` first), and Kueue creates no pod until every one is
``Ready`` (Kueue's "Admission Check" concepts page; its ProvisioningRequest and MultiKueue checks are
the models). The operator is the controller of the AdmissionChecks whose ``spec.controllerName`` is
:data:`CONTROLLER_NAME`, when ``COMPILECACHE_KUEUE`` is on (the chart's ``kueue.enabled``):

* it keeps their ``Active`` condition ``True`` (:func:`activate`): Kueue admits nothing through a
  ClusterQueue whose checks are not active;
* for a Workload whose check is ``Pending`` (with its quota reserved), it finds the cache each pod set
  opts into, by the pod template's labels as the webhook reads a pod's (``admission.choose_cache``), and
  sets the check ``Ready`` when the gate would release the pod (``gates.reason_to_release``: the cache is
  Ready, Degraded, settled Failed, gone, its gate off, or ``gateTimeout`` passed since the Workload got its
  quota with the check ``Pending``: :func:`waiting_since`); a Workload whose pods use no cache goes at once.
  Meanwhile the check's message says what it waits for;
* the Ready check carries ``podSetUpdates``: the annotation ``compilecache.dev/released`` on each pod set
  that uses a cache. Kueue applies them to the Job's pod template as it starts the Job (its jobframework's
  ``RunWithPodSetsInfo``; "modifications should be additive only", so a pod set already carrying the key
  gets none), and the webhook gives such a pod the cache's volume and settings but no gate.

Without Kueue, or for pods of a Workload no check of ours covers, the gate works as before. The state
is written by a JSON patch of ``workloads/<name>/status`` that tests the entry it replaces (another
controller's write makes it fail with 422, and the next pass decides again), as a gate release tests the
gates it read. Passes of a cache (``reconcile.py``) and each Workload's own events (``handlers.py``)
both call :func:`sync`; a standby replica does neither (kopf pauses its handlers).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.controller import admission, gates, images, podstate, status
from compilecache.controller.jobs import LABEL_CACHE
from compilecache.controller.kube import ADMISSION_CHECKS, WORKLOADS, ApiError, Client
from compilecache.controller.metrics import METRICS
from compilecache.controller.policy import DEFAULT, Policy, bounded
from compilecache.controller.snapshot import Cache

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]

CONTROLLER_NAME = admission.GATE  # an AdmissionCheck's spec.controllerName that the operator serves
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"  # Kueue v0.19: its API, served and stored
KUEUE_ENV = "COMPILECACHE_KUEUE"  # "true": serve the checks (the chart's kueue.enabled)
NO_CACHE = "NoCache"  # why a check is Ready at once: the Workload's pods use no CompileCache
ANNOTATION_RELEASED = admission.ANNOTATION_RELEASED
# A Workload's status.admissionChecks holds at most 8 entries and each of its podSetUpdates at most 8
# (Kueue v1beta2 workload_types.go: +kubebuilder:validation:MaxItems=8); pod sets beyond are not read.
MAX_POD_SETS = 8
# When several pod sets use caches with different outcomes, the check says the one that matters most.
_SEVERITY = (
    gates.GATE_TIMEOUT,
    gates.CACHE_FAILED,
    gates.UNWARMED_IMAGE,
    gates.CACHE_DELETED,
    gates.GATE_DISABLED,
    gates.CACHE_DEGRADED,
    gates.IMAGE_WARMED,
    gates.CACHE_READY,
    NO_CACHE,
)


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the operator serves its AdmissionChecks (``COMPILECACHE_KUEUE``)."""
    return (environ.get(KUEUE_ENV) or "").strip().lower() in ("true", "1", "yes", "on")


def is_ours(admission_check: Obj) -> bool:
    """Whether an AdmissionCheck names the operator as its controller."""
    return (admission_check.get("spec") or {}).get("controllerName") == CONTROLLER_NAME


def activate(admission_check: Obj, now: datetime.datetime) -> list[dict[str, Any]] | None:
    """The JSON patch of ``admissionchecks/<name>/status`` that sets ``Active`` ``True`` for the current
    generation (testing the conditions it read), or ``None`` when it is so already."""
    meta = admission_check.get("metadata") or {}
    generation = int(meta.get("generation") or 1)
    conditions = list((admission_check.get("status") or {}).get("conditions") or [])
    old = next((c for c in conditions if c.get("type") == "Active"), None)
    if old is not None and old.get("status") == "True" and old.get("observedGeneration") == generation:
        return None
    stamp = old.get("lastTransitionTime") if old is not None and old.get("status") == "True" else _format(now)
    active = {
        "type": "Active",
        "status": "True",
        "reason": "Active",
        "message": "compilecache-operator admits Workloads once the CompileCache their pods use is Ready",
        "lastTransitionTime": stamp or _format(now),
        "observedGeneration": generation,
    }
    kept = [c for c in conditions if c.get("type") != "Active"]
    if admission_check.get("status") is None:
        return [{"op": "add", "path": "/status", "value": {"conditions": [active]}}]
    if "conditions" not in (admission_check.get("status") or {}):
        return [{"op": "add", "path": "/status/conditions", "value": [active]}]
    return [
        {"op": "test", "path": "/status/conditions", "value": conditions},
        {"op": "replace", "path": "/status/conditions", "value": [*kept, active]},
    ]


def pending(workload: Obj, ours: Iterable[str]) -> list[tuple[int, Obj]]:
    """Our checks that are ``Pending`` on a Workload holding quota, with their index in ``status.admissionChecks``.

    Kueue lists a ClusterQueue's checks ``Pending`` while the Workload still queues (:func:`waiting_since`);
    until its quota is reserved (and once it is lost) nothing of ours is waited for: Kueue admits nothing yet.
    """
    st = workload.get("status") or {}
    reserved = any(c.get("type") == "QuotaReserved" and c.get("status") == "True" for c in st.get("conditions") or ())
    names = set(ours)
    return [
        (index, check)
        for index, check in enumerate(st.get("admissionChecks") or ())
        if reserved and check.get("name") in names and check.get("state") == "Pending"
    ]


def waiting_since(workload: Obj, check: Obj) -> str | None:
    """When the Workload began to wait for our check: the later of the check's turn to ``Pending`` and the
    quota's reservation (``None``: neither can be read, so it cannot be timed, as a pod without a creation time).

    Kueue lists a ClusterQueue's checks ``Pending`` as soon as it knows the Workload's ClusterQueue, long
    before quota while it queues (its workload controller runs ``reconcileSyncAdmissionChecks`` ahead of any
    quota test, and ``syncAdmissionCheckConditions`` stamps a new check with the clock), and a check still
    ``Pending`` keeps its time through an eviction (``resetChecksOnEviction`` skips it). Counted from the
    check alone, a Workload that queued longer than ``gateTimeout`` would go the moment it got its quota.
    """
    reserved: Obj = next(
        (c for c in (workload.get("status") or {}).get("conditions") or () if c.get("type") == "QuotaReserved"), {}
    )
    times = [
        (parsed, raw)
        for raw in (check.get("lastTransitionTime"), reserved.get("lastTransitionTime"))
        if (parsed := gates.parse_time(raw)) is not None
    ]
    return max(times)[1] if times else None


def pod_sets(workload: Obj) -> list[Obj]:
    """The Workload's pod sets (at most :data:`MAX_POD_SETS`)."""
    return list((workload.get("spec") or {}).get("podSets") or ())[:MAX_POD_SETS]


def pod_of(workload: Obj, pod_set: Obj) -> dict[str, Any]:
    """What the webhook would read of a pod of this pod set: its namespace, labels and annotations."""
    template_meta = (pod_set.get("template") or {}).get("metadata") or {}
    return {
        "metadata": {
            "namespace": (workload.get("metadata") or {}).get("namespace"),
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": dict(template_meta.get("annotations") or {}),
        }
    }


def _containers(pod_set: Obj) -> list[dict[str, Any]]:
    """The images of a pod set's containers, as a gated pod of it would carry them."""
    running = images.pod_images({"spec": (pod_set.get("template") or {}).get("spec") or {}})
    return [{"image": image} for image in running]


def caches_of(workload: Obj, caches: Sequence[Obj]) -> dict[str, str | None]:
    """Pod set name → the CompileCache its pods use (``None``: none, or one named that does not exist)."""
    chosen: dict[str, str | None] = {}
    for pod_set in pod_sets(workload):
        pod = pod_of(workload, pod_set)
        labels = pod["metadata"]["labels"]
        name = admission.choose_cache(pod, caches).name
        if name is None and labels.get(LABEL_CACHE) and not admission.is_operator_pod(labels):
            name = ""  # names a cache that does not exist: as a pod whose cache is gone
        chosen[str(pod_set.get("name") or "")] = name
    return chosen


@dataclass(frozen=True)
class Decision:
    """What to do with one of our checks on one Workload: the new entry (``None``: leave it), and why."""

    workload: str
    index: int
    reason: str | None  # why it is Ready; None while it waits
    caches: tuple[str, ...]  # the caches it waits for, or was released for
    entry: dict[str, Any] | None  # the check's new state, or None: unchanged
    patch: tuple[dict[str, Any], ...] = ()


def decide(
    workload: Obj,
    index: int,
    check: Obj,
    caches: Sequence[Obj],
    *,
    now: datetime.datetime,
    policy: Policy = DEFAULT,
    current: Mapping[str, str] | None = None,
) -> Decision:
    """The state our ``Pending`` check ``check`` (at ``index``) should have now, given the namespace's caches.

    The gate's rule decides, for a pod of each pod set that uses a cache (``gates.reason_to_release``),
    with the time the Workload began to wait for us (:func:`waiting_since`) standing for the pod's creation:
    the check is ``Ready`` when every such pod would be released. ``gateTimeout`` is cut to ``policy``'s cap,
    as for gated pods. ``current``: cache name → the image it warms now, as a pass that read training's
    template knows it (``plan.Plan.image``); a cache not in it has its spec's image (``images.known``: none
    for a templateRef, whose pod sets on an image not recorded then wait for a pass).
    """
    by_name = {str(c["metadata"]["name"]): c for c in caches}
    chosen = caches_of(workload, caches)
    reasons: dict[str, str | None] = {}
    timeouts: dict[str, float] = {}  # each used cache's gateTimeout under the policy: its spec parsed once
    waiting_on: dict[str, str] = {}  # cache → its phase, for the caches the check still waits for
    since = waiting_since(workload, check)
    for name in sorted({n for n in chosen.values() if n is not None}):
        cache = by_name.get(name)
        # A pod of each pod set that uses the cache, as the gate would hold it: its own images decide
        # what it waits for (images.py), so pod sets on different images may wait differently.
        held = [
            {
                "metadata": {"labels": {LABEL_CACHE: name or "(missing)"}, "creationTimestamp": since},
                "spec": {"schedulingGates": [{"name": admission.GATE}], "containers": _containers(pod_set)},
            }
            for pod_set in pod_sets(workload)
            if chosen.get(str(pod_set.get("name") or "")) == name
        ]
        if cache is None:
            reasons[name] = gates.reason_to_release(held[0], None, phase=None, now=now)
            continue
        st = cache.get("status") or {}
        read = Cache.read(cache)
        consumers = bounded(read.consumers, policy)
        timeouts[name] = consumers.gate_timeout_seconds
        each = [
            gates.reason_to_release(
                pod,
                consumers,
                phase=st.get("phase"),
                now=now,
                settled=status.settled(st),
                warmed=images.recorded(st),
                current=(current or {}).get(name) or images.known(read.spec),
            )
            for pod in held
        ]
        reasons[name] = None if None in each else next(r for r in _SEVERITY if r in each)
        if reasons[name] is None:
            waiting_on[name] = st.get("phase") or "not yet reconciled"
    meta = workload.get("metadata") or {}
    used = tuple(sorted(n for n in reasons if n))
    if waiting_on:
        message = _waiting_message(waiting_on, timeouts)
        entry = None if check.get("message") == message else {**check, "message": message}
        return _decision(meta, index, check, None, tuple(sorted(waiting_on)), entry)
    found = [r for r in reasons.values() if r is not None]
    reason = next((r for r in _SEVERITY if r in found), NO_CACHE)
    entry = {
        **{k: v for k, v in check.items() if k not in ("podSetUpdates",)},
        "state": "Ready",
        "message": _ready_message(reason, reasons, timeouts),
        "lastTransitionTime": _format(now),
    }
    updates = _pod_set_updates(workload, chosen, reason, now)
    if updates:
        entry["podSetUpdates"] = updates
    return _decision(meta, index, check, reason, used, entry)


def _decision(
    meta: Obj, index: int, check: Obj, reason: str | None, caches: tuple[str, ...], entry: dict[str, Any] | None
) -> Decision:
    patch: tuple[dict[str, Any], ...] = ()
    if entry is not None:
        path = f"/status/admissionChecks/{index}"
        patch = ({"op": "test", "path": path, "value": dict(check)}, {"op": "replace", "path": path, "value": entry})
    return Decision(str(meta.get("name")), index, reason, caches, entry, patch)


def _pod_set_updates(
    workload: Obj, chosen: Mapping[str, str | None], reason: str, now: datetime.datetime
) -> list[dict[str, Any]]:
    """The annotation ``compilecache.dev/released`` for each pod set that uses a cache and does not carry it."""
    updates = []
    for pod_set in pod_sets(workload):
        name = str(pod_set.get("name") or "")
        annotations = ((pod_set.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        if chosen.get(name) is not None and ANNOTATION_RELEASED not in annotations:
            updates.append({"name": name, "annotations": {ANNOTATION_RELEASED: f"{reason} {_format(now)}"}})
    return updates


def _waiting_message(waiting_on: Mapping[str, str], timeouts: Mapping[str, float]) -> str:
    parts = [
        f"CompileCache {name} ({phase}; at most its gateTimeout, {timeouts[name]:g}s)"
        for name, phase in waiting_on.items()
    ]
    message = "waiting for " + ", ".join(parts) + " to be Ready before the pods start"
    return message[: podstate.MESSAGE_MAX]


def _ready_message(reason: str, reasons: Mapping[str, str | None], timeouts: Mapping[str, float]) -> str:
    if not reasons:
        return f"{reason}: the Workload's pods use no CompileCache"
    parts = []
    for name, why in sorted(reasons.items()):
        if not name:
            parts.append("a CompileCache that does not exist: its pods run without one")
        elif why == gates.GATE_TIMEOUT:
            parts.append(
                f"CompileCache {name} was not Ready within gateTimeout ({timeouts[name]:g}s): the pods start anyway "
                "and compile what the cache lacks"
            )
        elif why == gates.CACHE_DELETED:
            parts.append(f"CompileCache {name} does not exist: the pods run without it")
        else:
            parts.append(f"CompileCache {name}: {why}")
    return (f"{reason}: " + "; ".join(parts))[: podstate.MESSAGE_MAX]


def sync(
    client: Client,
    namespace: str,
    workloads: Sequence[Obj],
    caches: Sequence[Obj],
    ours: Iterable[str],
    *,
    now: datetime.datetime,
    policy: Policy = DEFAULT,
    current: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Decide and write our checks on ``workloads`` (of ``namespace``); return, per cache, the Workloads
    still waiting on it. A write that fails (404: gone; 409/422: changed since it was read) is left to
    the next pass or event; any other API error is raised. ``current``: as :func:`decide` reads it."""
    names = frozenset(ours)
    waiting: dict[str, int] = {}
    for workload in workloads:
        for index, check in pending(workload, names):
            decision = decide(workload, index, check, caches, now=now, policy=policy, current=current)
            if decision.reason is None:
                for cache in decision.caches:
                    waiting[cache] = waiting.get(cache, 0) + 1
            if not decision.patch:
                continue
            try:
                client.json_patch(WORKLOADS, decision.workload, decision.patch, namespace, subresource="status")
            except ApiError as exc:
                if exc.status not in (404, 409, 422):
                    raise
                logger.info(
                    "Not setting check %s of Workload %s/%s now: %s",
                    check.get("name"),
                    namespace,
                    decision.workload,
                    exc,
                )
                continue
            if decision.reason is not None:
                _released(client, namespace, workload, check, decision)
    return waiting


def _released(client: Client, namespace: str, workload: Obj, check: Obj, decision: Decision) -> None:
    logger.info(
        "Set admission check %s of Workload %s/%s Ready: %s.",
        check.get("name"),
        namespace,
        decision.workload,
        decision.reason,
    )
    if decision.reason == gates.GATE_TIMEOUT:
        uid = str((workload.get("metadata") or {}).get("uid") or decision.workload)
        for cache in decision.caches:
            METRICS.count_gate_timeouts(namespace, cache, [uid])
        message = str((decision.entry or {}).get("message") or "")
        body = {"apiVersion": WORKLOADS.api_version, "kind": "Workload", **dict(workload)}
        client.post_event(body, "Warning", gates.GATE_TIMEOUT, message)


def activate_check(client: Client, admission_check: Obj, now: datetime.datetime) -> None:
    """Write ``Active`` on one of our AdmissionChecks where it is missing or stale (see :func:`activate`)."""
    patch = activate(admission_check, now)
    if patch is None:
        return
    name = str((admission_check.get("metadata") or {}).get("name"))
    try:
        client.json_patch(ADMISSION_CHECKS, name, patch, subresource="status")
    except ApiError as exc:
        if exc.status not in (404, 409, 422):
            raise
        logger.info("Not marking AdmissionCheck %s Active now: %s", name, exc)
        return
    logger.info("Serving AdmissionCheck %s (controllerName %s).", name, CONTROLLER_NAME)


def _format(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
