"""Act: apply a plan (``plan.py``) to the API and record what came of it. No decisions here.

Creation stops at the first object the API refuses, returning the refusal: the pass then
plans again with it (``Snapshot.after``), so what a refusal means (a pool Failed, the expiry
Failed) is decided in the pure part like everything else. It stops too at the first object
that exists already (409: another pass, an operator restarted mid-pass, or someone else made
it between the pass's reads and this create): the pass reads the cluster again and plans with
what is there, so a claim someone else made meanwhile is checked (``policy.claim_violation``)
before any Job mounts it. An object found existing is not created again in that pass.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.controller import gates, images, status
from compilecache.controller.kube import COMPILECACHES, ApiError, Client
from compilecache.controller.plan import Create, Delete, Patch, Plan
from compilecache.controller.snapshot import Cache, Obj

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Created:
    """What a round of creations came to: the keys (``Create.key``) created, a refusal, or one found existing."""

    created: frozenset[str] = frozenset()
    rejected: Mapping[str, str] = field(default_factory=dict)
    existed: frozenset[str] = frozenset()  # 409: made by someone else meanwhile; read it before going on


def is_refusal(exc: ApiError) -> bool:
    """Whether the API refused the object itself, so the same request would fail the same way.

    Any 4xx but 408 (timeout), 409 (exists: not a failure) and 429 (throttled): those pass.
    Authorisation (401/403) counts: a missing RBAC rule or an exhausted ResourceQuota is
    answered with the reason, which the status must show rather than a silent retry loop.
    """
    return 400 <= exc.status < 500 and exc.status not in (408, 409, 429)


def create(client: Client, namespace: str | None, creates: Sequence[Create]) -> Created:
    """Create in order; stop at the first refusal or object that exists. Other API errors raise (the pass
    fails and is retried)."""
    created: set[str] = set()
    for item in creates:
        try:
            client.create(item.resource, item.manifest, namespace)
        except ApiError as exc:
            if is_refusal(exc):
                logger.warning("The API refused %s %s/%s: %s", item.resource.plural, namespace, item.name, exc)
                return Created(frozenset(created), {item.key: exc.message or str(exc)})
            if exc.status != 409:
                raise
            logger.info("%s %s/%s exists already; reading it again.", item.resource.plural, namespace, item.name)
            return Created(frozenset(created), existed=frozenset({item.key}))
        created.add(item.key)
    return Created(frozenset(created))


def patch(client: Client, namespace: str | None, patches: Sequence[Patch]) -> None:
    """Apply the plan's merge patches (a suspended Job let go); an object gone meanwhile is fine (the next
    pass plans without it)."""
    for item in patches:
        logger.info("Patching %s %s/%s: %s.", item.resource.plural, namespace, item.name, item.why)
        try:
            client.patch(item.resource, item.name, item.patch, namespace)
        except ApiError as exc:
            if exc.status != 404:
                raise


def delete(client: Client, namespace: str | None, deletes: Sequence[Delete]) -> None:
    """Delete (in the background, with what they own); an object already gone is fine."""
    for item in deletes:
        logger.info("Deleting %s %s/%s: %s.", item.resource.plural, namespace, item.name, item.why)
        client.delete(item.resource, item.name, namespace)


def release(client: Client, cache: Cache, plan: Plan, pods: Sequence[Obj]) -> dict[str, int] | None:
    """Release the pods the plan names; return ``status.consumers``, or ``None`` when the pod API failed.

    A failure is logged, not raised: the warm-up must go on where the operator may not patch
    pods, and the next pass (or the pod's own event) retries.
    """
    try:
        return gates.apply(client, cache.namespace, cache.name, cache.obj, cache.consumers, plan.releases, pods)
    except ApiError as exc:
        logger.warning("Releasing the pods of cache %s/%s failed, will retry: %s", cache.namespace, cache.name, exc)
        return None


def record(client: Client, cache: Cache, new: Mapping[str, Any], events: Sequence[status.Event]) -> bool:
    """Patch the status where it changed and post the plan's Events; ``False`` if the cache is gone."""
    old = cache.status
    keys = set(old) | set(new)
    patch = {key: new.get(key) for key in keys if old.get(key) != new.get(key)}
    if not patch:
        return True
    try:
        client.patch(COMPILECACHES, cache.name, {"status": patch}, cache.namespace, subresource="status")
    except ApiError as exc:
        if exc.status == 404:  # deleted during this pass: nothing left to report on
            return False
        raise
    for event in events:
        if event.reason == status.REPORT_REFUSED:  # a pod's report the status will not hold: the log says it too
            logger.warning("Cache %s/%s: %s", cache.namespace, cache.name, event.message)
        client.post_event(cache.obj, event.type, event.reason, event.message)
    return True


def post_refusals(client: Client, cache: Cache, refused: Sequence[tuple[Obj, str]]) -> None:
    """A Warning Event ``ReportRefused`` on the cache for each training pod whose report was refused
    (``reports.counted``), and a log line: once per pod, by the Event's name (``Client.post_event``)."""
    for pod, why in refused:
        meta = pod.get("metadata") or {}
        pod_name = str(meta.get("name") or "")
        digest = hashlib.sha256(f"{meta.get('uid') or pod_name}".encode()).hexdigest()[:16]
        message = f"training pod {pod_name}: its report was refused and is not counted in status.consumers: {why}"
        name = f"{cache.name[: 253 - len(digest) - 1]}.{digest}"
        if client.post_event(cache.obj, "Warning", status.REPORT_REFUSED, message, name=name):
            logger.warning("Cache %s/%s: %s", cache.namespace, cache.name, message)


# The Events this process posted (their names): a pass sees every pod of its cache, and an Event already
# posted must not cost an API call per pod and pass. Another replica, or this one after a restart, posts
# each once more at most, and the API server answers that with a quiet 409 (the Event's own name).
_POSTED: OrderedDict[str, None] = OrderedDict()
_POSTED_MAX = 16384
_POSTED_LOCK = threading.Lock()


def post_unwarmed(client: Client, cache: Cache, pods: Sequence[Obj], warmed: Sequence[Mapping[str, Any]]) -> None:
    """A Warning Event ``UnwarmedImage`` on each training pod on an image the cache never warmed
    (``images.unwarmed``): once per pod and image, by the Event's name, however many passes see it."""
    for pod in pods:
        name = images.event_name(pod)
        with _POSTED_LOCK:
            if name in _POSTED:
                continue
            _POSTED[name] = None
            while len(_POSTED) > _POSTED_MAX:
                _POSTED.popitem(last=False)
        meta = pod.get("metadata") or {}
        involved = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}  # slim pods carry no kind
        message = images.unwarmed_message(cache.name, pod, warmed)
        if client.post_event(involved, "Warning", images.UNWARMED_IMAGE, message, name=name):
            logger.info("Cache %s/%s: pod %s: %s", cache.namespace, cache.name, meta.get("name"), message)
