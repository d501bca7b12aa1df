"""One pass over a CompileCache: observe (``snapshot.py``) → plan (``plan.py``) → act (``act.py``).

Every trigger (the cache changed, one of its Jobs changed, the periodic resync, a
retry) runs the same idempotent pass, so an operator restart or a repeated event
never duplicates work: Job names are deterministic and creation tolerates "exists".

A pass never ends silently and never holds training: whatever raises in it (a bad
answer of the API, a bug) becomes a status that says what failed (``plan.failed``)
and is returned to the caller, which retries with backoff (``handlers.py``); the
training pods that are due are released in every case.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compilecache.api import bounds
from compilecache.controller import act, checks, expectations, gates, images, indexes, metrics, metricsfeed, reports
from compilecache.controller.indexes import Audit, IndexedReader
from compilecache.controller.kube import COMPILECACHES, WORKLOADS, ApiError, Client
from compilecache.controller.plan import Plan, failed, plan
from compilecache.controller.policy import DEFAULT, Policy, bounded
from compilecache.controller.snapshot import ApiReader, Cache, Obj, Reader, Snapshot, observe, observe_pods

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """How a pass ended: the status it recorded (``None``: the cache is gone), what failed, if anything,
    and the uid of the cache it found (a cache deleted and created again under its name has another)."""

    status: Mapping[str, Any] | None
    error: BaseException | None = None
    uid: str | None = None
    # What this pass and earlier ones created that the indexes did not show yet (expectations.py).
    expected: expectations.Expected = field(default_factory=dict)


def reconcile(
    client: Client,
    namespace: str,
    name: str,
    *,
    now: str | None = None,
    policy: Policy = DEFAULT,
    reader: Reader | None = None,
    audit: bool = False,
    expected: expectations.Expected | None = None,
) -> Outcome:
    """One pass over the named cache under ``policy`` (timed in the metrics); raises only if it cannot be read.

    ``reader`` answers the pass's reads (the operator's indexes); by default the API does (:class:`ApiReader`).
    ``audit``: first check the indexes' answers against the API's (``indexes.Audit``). ``expected``: what
    the cache's earlier passes created (``Outcome.expected``), for a reader that may not show it yet.
    """
    started = time.monotonic()
    result = "error"
    try:
        reader = reader or ApiReader(client)
        outcome = _reconcile(
            client, namespace, name, now=now, policy=policy, reader=reader, audit=audit, expected=expected or {}
        )
        result = "error" if outcome.error is not None else "success"
        return outcome
    finally:
        metrics.METRICS.reconcile.labels(result).observe(time.monotonic() - started)


def _reconcile(
    client: Client,
    namespace: str,
    name: str,
    *,
    now: str | None,
    policy: Policy,
    reader: Reader,
    audit: bool,
    expected: expectations.Expected,
) -> Outcome:
    # The cache itself by a GET (one object, no scan), not from kopf's copy: the status is the record
    # (a pool that finished and whose Job its TTL removed is not run again), and the copy kopf holds
    # may not have the status this operator's last pass wrote yet.
    obj = client.get(COMPILECACHES, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        # No pod waits for a cache that is gone.
        release_gates(
            client, namespace, name, None, phase=None, pods=[dict(pod) for pod in reader.training_pods(namespace, name)]
        )
        release_workloads(client, reader, namespace, name, None, policy=policy)
        metrics.METRICS.forget(namespace, name)
        return Outcome(None)
    cache = Cache.read(obj)
    if audit and isinstance(reader, IndexedReader):
        _forget_deleted(client, reader, cache, policy)
    when = now or utcnow()
    pods: tuple[Obj, ...] = ()
    error: BaseException | None = None
    try:
        pods = observe_pods(reader, cache)
        decided, expected = _observe_plan_create(client, reader, cache, pods, when, policy, expected)
        act.patch(client, cache.namespace, decided.patches)
        act.delete(client, cache.namespace, decided.deletes)
    except Exception as exc:  # anything: the status says it, the gates still open, the caller retries
        error = exc
        decided = failed(cache, pods, exc, when, policy)
    consumers = act.release(client, cache, decided, pods)
    new = dict(decided.status)
    counted, refused_reports = reports.counted(pods)  # each pod's report read once a pass
    unwarmed = images.unwarmed(pods, images.recorded(new))
    if consumers is not None:  # else the last counts stand
        # What finished training pods reported (reports.py) joins the gate counts.
        # Pods on an image the cache never warmed: said only where there are some, as lastMissReason is.
        new["consumers"] = consumers | reports.totals(counted) | ({"unwarmedImage": len(unwarmed)} if unwarmed else {})
    # Which entries they used, by day: kept across passes (pods go, the record stays), read by the expiry Job.
    max_age = cache.spec.lifecycle.max_age_seconds if cache.spec is not None else None
    new.pop("lastUsed", None)
    if used := reports.last_used(cache.status.get("lastUsed"), counted, when, max_age):
        new["lastUsed"] = used
    waiting = release_workloads(
        client, reader, namespace, name, {**obj, "status": new}, policy=policy, audit=audit, current=decided.image
    )
    if waiting is not None:  # the Workloads that wait on our Kueue admission check for this cache
        new["consumers"] = {**(new.get("consumers") or {}), "workloads": waiting}
    # Each report was checked as it was read, and a message too long for its field is cut to it; a status
    # the API server would still refuse (a bug, or sums past int64) would fail every pass the same way:
    # the old value of that field stands.
    new, refused = bounds.keep_valid(bounds.fit(new), cache.status)
    for problem in refused:
        logger.error("Not recording status field of %s/%s that the CRD refuses: %s", namespace, name, problem)
    recorded = cache.status  # what the record said before this pass: the metrics count what it adds
    try:
        act.record(client, cache, new, decided.events)
        recorded = new
        act.post_refusals(client, cache, refused_reports)
        act.post_unwarmed(client, cache, unwarmed, images.recorded(new))
    except ApiError as exc:
        logger.warning("Recording the status of %s/%s failed: %s", namespace, name, exc)
        error = error or exc
    metricsfeed.observe_cache(metrics.METRICS, namespace, name, new, pods, before=cache.status, after=recorded)
    return Outcome(new, error, cache.uid, expected)


def _forget_deleted(client: Client, reader: IndexedReader, cache: Cache, policy: Policy) -> None:
    """Ask the API what this pass asks the indexes, and forget what they still hold that is gone (``indexes.py``).

    A failed read leaves the indexes as they are: the next audit asks again.
    """
    audited = Audit(reader)
    observe(audited, cache, observe_pods(audited, cache), policy)
    try:
        gone = audited.deleted(ApiReader(client))
    except ApiError as exc:
        logger.warning(
            "Checking the indexes of cache %s/%s against the API failed: %s", cache.namespace, cache.name, exc
        )
        return
    if gone:
        logger.warning(
            "%d objects of cache %s/%s were deleted while a watch was down; the pass no longer sees them.",
            len(gone),
            cache.namespace,
            cache.name,
        )
        reader.forget(gone)


def _observe_plan_create(
    client: Client,
    reader: Reader,
    cache: Cache,
    pods: tuple[Obj, ...],
    now: str,
    policy: Policy,
    expected: expectations.Expected,
) -> tuple[Plan, expectations.Expected]:
    """Observe, plan, and create what the plan asks; plan again after each refusal, until none is left.

    Returns the plan and the expectations to hand on: what was created and is not seen yet.
    An object found existing (409) was made by someone else since the pass read the cluster: the pass
    reads it again before it goes on (a claim made meanwhile, by anyone, is checked before a Job mounts
    it), and does not create it again. It reads it from the API: the watch may not have brought it yet.
    """
    snapshot: Snapshot = observe(reader, cache, pods, policy)
    clock = time.monotonic()
    standing = expectations.unseen(expected, snapshot, clock)
    snapshot = snapshot.after(frozenset(standing), {})
    decided = plan(snapshot, now)
    while decided.creates:
        outcome = act.create(client, cache.namespace, decided.creates)
        standing |= dict.fromkeys(outcome.created, clock)
        if outcome.existed:
            seen = snapshot.created | outcome.created | outcome.existed
            snapshot = observe(ApiReader(client), cache, pods, policy).after(seen, snapshot.rejected)
        else:
            snapshot = snapshot.after(outcome.created, outcome.rejected)
            if not outcome.rejected:
                break
        decided = plan(snapshot, now)  # each round creates, refuses or finds one more object: it ends
    return decided, standing


def release_gates(
    client: Client,
    namespace: str,
    name: str,
    cache: Mapping[str, Any] | None,
    *,
    phase: str | None,
    pods: list[dict[str, Any]] | None = None,
    policy: Policy = DEFAULT,
) -> dict[str, int] | None:
    """Release the training pods held for this cache that are due (``gates.py``); return ``status.consumers``.

    For one pod's event and for a cache that is gone (``cache`` ``None``: every gated pod goes).
    The ``gateTimeout`` is cut to ``policy``'s cap (``policy.bounded``): a spec the policy refuses must
    not hold pods longer. A spec that cannot be parsed still gets the default ``gateTimeout``: bad input must not hold
    training pods forever. A failed pod API call is logged and gives ``None``; the resync retries.
    """
    read = Cache.read(cache) if cache is not None else None
    consumers = bounded(read.consumers, policy) if read is not None else None
    when = datetime.datetime.now(datetime.UTC)
    try:
        return gates.sync(
            client,
            namespace,
            name,
            cache,
            consumers,
            phase=phase,
            now=when,
            pods=pods,
            current=images.known(read.spec if read is not None else None),
        )
    except ApiError as exc:
        logger.warning("Releasing the pods of cache %s/%s failed, will retry: %s", namespace, name, exc)
        return None


def release_workloads(
    client: Client,
    reader: Reader,
    namespace: str,
    name: str,
    cache: Mapping[str, Any] | None,
    *,
    policy: Policy = DEFAULT,
    audit: bool = False,
    current: str | None = None,
) -> int | None:
    """Set our Kueue admission checks Ready on the namespace's Workloads that are due (``checks.py``); return
    how many wait for this cache, or ``None`` where the operator does not serve checks or the API failed.

    ``cache``: the cache with the status this pass records (``None``: it is gone). The namespace's other
    caches are listed only when some Workload waits on one of our checks there (a podSelector chooses
    among them all, as the webhook does). ``audit``: first read each such Workload by name, and forget those
    that are gone (deleted while a watch was down: ``indexes.py``), or they would be counted as waiting for ever.
    ``current``: the image this pass read training's template to name (``plan.Plan.image``), for this cache's
    checks: a pod set on an image the cache neither holds nor warms then goes at once, as a gated pod does.
    """
    if not isinstance(reader, IndexedReader) or not reader.serves_checks:
        return None
    ours = reader.our_checks()
    workloads = [workload for workload in reader.waiting_workloads(namespace) if checks.pending(workload, ours)]
    if not workloads:
        return 0
    try:
        if audit:
            gone = [
                w
                for w in workloads
                if indexes.uid(client.get(WORKLOADS, w["metadata"]["name"], namespace)) != indexes.uid(w)
            ]
            reader.forget(indexes.uid(w) for w in gone)
            workloads = [w for w in workloads if w not in gone]
        others = [c for c in client.list(COMPILECACHES, namespace) if c["metadata"]["name"] != name]
        caches = others + ([dict(cache)] if cache is not None else [])
        waiting = checks.sync(
            client,
            namespace,
            workloads,
            caches,
            ours,
            now=datetime.datetime.now(datetime.UTC),
            policy=policy,
            current={name: current} if current and cache is not None else None,
        )
    except ApiError as exc:
        logger.warning("Setting the admission checks of cache %s/%s failed, will retry: %s", namespace, name, exc)
        return None
    return waiting.get(name, 0)


def utcnow() -> str:
    """Now, as Kubernetes writes times."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
