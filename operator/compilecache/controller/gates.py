"""Releasing training pods held by the ``compilecache.dev/warm`` scheduling gate.

The webhook (``admission.py``) gates a pod that uses a cache which is not Ready.
Each reconciliation of the cache (``reconcile.py``) then releases its waiting pods
when the cache is Ready, when ``consumers.gate`` was turned off, when the cache is
gone, or when ``consumers.gateTimeout`` has passed since the pod was created (with
a Warning Event: a broken warm-up must never block training forever). A gated pod
whose ``compilecache.dev/cache`` label is gone (its owner removed it after admission:
labels may change, and a gate can only be removed once the pod exists, so the gate is
still ours) waits for no cache, and goes at once; the gate watchdog finds it
(``watchdog.py``: it lists the pods not yet scheduled, which every gated pod is).

Decisions are pure functions of the pods and the cache; :func:`sync` does the I/O.
A release is one JSON patch that tests the gate list it read, so a concurrent
change of other gates (another controller's) makes it fail instead of undoing
that change; the next pass retries.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.controller import images, podstate, status
from compilecache.controller.admission import ANNOTATION_RELEASED, GATE
from compilecache.controller.api import Consumers
from compilecache.controller.jobs import LABEL_CACHE
from compilecache.controller.kube import PODS, ApiError, Client
from compilecache.controller.metrics import METRICS

logger = logging.getLogger(__name__)


# Why a gate is removed.
CACHE_READY = "CacheReady"
CACHE_DEGRADED = "CacheDegraded"  # settled with some pools failed: what warmed is served
CACHE_FAILED = "CacheFailed"  # settled with every pool failed (e.g. no node came): nothing to wait for
GATE_TIMEOUT = "GateTimeout"
GATE_DISABLED = "GateDisabled"
CACHE_DELETED = "CacheDeleted"
CACHE_LABEL_REMOVED = "CacheLabelRemoved"  # the pod no longer names a cache: nothing to wait for
IMAGE_WARMED = images.IMAGE_WARMED  # its image's entries are served while the cache warms another
UNWARMED_IMAGE = images.UNWARMED_IMAGE  # no warm-up of its image runs or ran: nothing to wait for


@dataclass(frozen=True)
class Release:
    """One pod to release: its name, why, and the JSON patch that does it."""

    pod: str
    reason: str
    patch: list[dict[str, Any]]


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether our gate holds the pod."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == GATE for gate in gates)


def counts(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``status.consumers``: pods still held by the gate, and pods the operator released.

    Counted over the cache's pods that exist now: a finished and deleted pod drops out.
    """
    gated = sum(1 for pod in pods if is_gated(pod))
    released = sum(1 for pod in pods if ANNOTATION_RELEASED in ((pod.get("metadata") or {}).get("annotations") or {}))
    return {"gated": gated, "released": released}


def reason_to_release(
    pod: Mapping[str, Any],
    consumers: Consumers | None,
    *,
    phase: str | None,
    now: datetime.datetime,
    settled: bool = False,
    warmed: Sequence[Mapping[str, Any]] = (),
    current: str | None = None,
) -> str | None:
    """Why the gated ``pod`` should be released now, or ``None`` to keep it waiting.

    ``consumers`` is ``None`` when the cache no longer exists, or the pod names none (its label was
    removed: the watchdog and ``handlers.pod_held`` pass none); ``phase`` is the cache's phase;
    ``settled``: a Failed phase is the warm-up's end on every pool (``status.settled``), not a pass's error;
    ``warmed``: ``status.images`` (``images.py``): a pod waits only for its own image, while it is the
    one being warmed. ``current``: the image the cache warms now, where the caller knows it (the pass,
    which read training's template; the spec's ``warmup.image`` elsewhere); ``None`` where only the
    next pass can tell (a templateRef read by no one yet): a pod on an image not recorded then waits
    for that pass, since training's template may have just moved to its image.
    """
    if not is_gated(pod):
        return None
    if consumers is None:  # no cache: gone, or the pod names none any more
        return (
            CACHE_DELETED if ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_CACHE) else CACHE_LABEL_REMOVED
        )
    running = images.pod_images(pod)
    record = images.match(running, warmed)
    if record is not None and record["state"] == images.READY:
        return CACHE_READY if phase == status.READY else CACHE_DEGRADED if phase == status.DEGRADED else IMAGE_WARMED
    # An image status.images does not hold: the cache's image now (its pass will record it: wait), or none.
    unrecorded = bool(warmed) and record is None and bool(running)
    if unrecorded and current and not any(images.same_image(image, current) for image in running):
        return UNWARMED_IMAGE  # no warm-up of its image runs or is to come: waiting would only delay it
    # The phase speaks for a pod whose image is not known to be elsewhere: the record says more.
    by_phase = not unrecorded and (record is None or record["state"] != images.WARMING)
    if by_phase and phase == status.READY:
        return CACHE_READY
    if by_phase and phase == status.DEGRADED:
        return CACHE_DEGRADED
    if phase == status.FAILED and settled:
        return CACHE_FAILED
    if not consumers.gate:
        return GATE_DISABLED
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    if created is None or (now - created).total_seconds() >= consumers.gate_timeout_seconds:
        return GATE_TIMEOUT  # a pod without a creation time cannot be timed: never hold it
    return None


def release_patch(pod: Mapping[str, Any], reason: str, now: datetime.datetime) -> list[dict[str, Any]]:
    """The JSON patch that removes only our gate and records why (``compilecache.dev/released``)."""
    gates = list((pod.get("spec") or {}).get("schedulingGates") or [])
    remaining = [gate for gate in gates if gate.get("name") != GATE]
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/schedulingGates", "value": gates}]
    if remaining:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": remaining})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    value = f"{reason} {_format_time(now)}"
    if (pod.get("metadata") or {}).get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_RELEASED: value}})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations/" + _escape(ANNOTATION_RELEASED), "value": value})
    return ops


def plan(
    pods: Sequence[Mapping[str, Any]],
    consumers: Consumers | None,
    *,
    phase: str | None,
    now: datetime.datetime,
    settled: bool = False,
    warmed: Sequence[Mapping[str, Any]] = (),
    current: str | None = None,
) -> list[Release]:
    """The releases due now among ``pods`` (the pods of one cache); ``warmed``, ``current``: as
    :func:`reason_to_release` reads them."""
    releases = []
    for pod in pods:
        reason = reason_to_release(
            pod, consumers, phase=phase, now=now, settled=settled, warmed=warmed, current=current
        )
        if reason is not None:
            releases.append(Release(pod["metadata"]["name"], reason, release_patch(pod, reason, now)))
    return releases


def sync(
    client: Client,
    namespace: str,
    name: str,
    cache: Mapping[str, Any] | None,
    consumers: Consumers | None,
    *,
    phase: str | None,
    now: datetime.datetime,
    pods: Sequence[Mapping[str, Any]] | None = None,
    current: str | None = None,
) -> dict[str, int]:
    """Release the cache's pods that are due, post Events, and return ``status.consumers``.

    ``cache`` and ``consumers`` are ``None`` when the cache is gone: every gated pod goes.
    ``pods`` limits the pass to these pods (one pod's event); by default all pods labelled
    with the cache are listed, and the counts cover them.
    """
    if pods is None:
        pods = client.list(PODS, namespace, labels={LABEL_CACHE: name})
    settled = cache is not None and status.settled(cache.get("status") or {})
    warmed = images.recorded(cache.get("status")) if cache is not None else ()
    releases = plan(pods, consumers, phase=phase, now=now, settled=settled, warmed=warmed, current=current)
    return apply(client, namespace, name, cache, consumers, releases, pods)


def apply(
    client: Client,
    namespace: str | None,
    name: str,
    cache: Mapping[str, Any] | None,
    consumers: Consumers | None,
    releases: Sequence[Release],
    pods: Sequence[Mapping[str, Any]],
) -> dict[str, int]:
    """Patch the pods of ``releases`` (planned from ``pods``), post Events, and return ``status.consumers``."""
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    timed_out: list[str] = []
    for release in releases:
        try:
            patched = client.json_patch(PODS, release.pod, release.patch, namespace)
        except ApiError as exc:
            # 404: the pod is gone; 422: its gates changed since the list. Either way the next pass decides.
            if exc.status not in (404, 409, 422):
                raise
            logger.info("Not releasing pod %s/%s now: %s", namespace, release.pod, exc)
            continue
        by_name[release.pod] = patched
        logger.info(
            "Released pod %s/%s from the gate of cache %s: %s.",
            namespace,
            release.pod,
            name or "(none)",
            release.reason,
        )
        if release.reason == GATE_TIMEOUT:
            timed_out.append(release.pod)
            # Counted where the patch succeeded: a planned release another path made first (422) is none.
            METRICS.count_gate_timeouts(namespace or "", name, [podstate.pod_uid(patched)])
            client.post_event(patched, "Warning", GATE_TIMEOUT, _timeout_message(name, consumers))
    if timed_out and cache is not None:
        message = f"released {len(timed_out)} pods before Ready ({status.some_of(timed_out)})"
        client.post_event(cache, "Warning", GATE_TIMEOUT, message)
    return counts(list(by_name.values()))


def _timeout_message(name: str, consumers: Consumers | None) -> str:
    timeout = consumers.gate_timeout_seconds if consumers is not None else 0
    return (
        f"CompileCache {name} was not Ready within gateTimeout ({timeout:g}s); the pod starts anyway "
        "and compiles what the cache lacks"
    )


def parse_time(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _format_time(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _escape(key: str) -> str:
    """A JSON pointer token (RFC 6901): ``~`` and ``/`` escaped."""
    return key.replace("~", "~0").replace("/", "~1")
