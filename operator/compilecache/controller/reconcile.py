"""One reconciliation of a CompileCache: observe, act, and record a truthful status.

Every trigger (the cache changed, one of its Jobs changed, the periodic resync)
runs the same idempotent pass, so an operator restart or a repeated event never
duplicates work: Job names are deterministic and creation tolerates "exists".
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from compilecache.cache import units
from compilecache.controller import expiryjob, gates, jobs, status
from compilecache.controller.api import CacheSpec, Consumers, SpecError, parse_spec
from compilecache.controller.kube import COMPILECACHES, JOBS, NODES, PODS, PVCS, ApiError, Client
from compilecache.controller.pools import resolve_pools

logger = logging.getLogger(__name__)


def reconcile(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    """Reconcile the named cache and return its new status (``None`` if it is gone or going)."""
    cache = client.get(COMPILECACHES, name, namespace)
    if cache is None or cache["metadata"].get("deletionTimestamp"):
        release_gates(client, namespace, name, None, ready=False)  # no pod waits for a cache that is gone
        return None
    old = cache.get("status") or {}
    new = observe_and_act(client, cache, old, now=utcnow())
    consumers = release_gates(client, namespace, name, cache, ready=new.get("phase") == status.READY)
    if consumers is not None:  # else the last counts stand
        new["consumers"] = consumers
    write_status(client, cache, old, new)
    return new


def release_gates(
    client: Client,
    namespace: str,
    name: str,
    cache: Mapping[str, Any] | None,
    *,
    ready: bool,
    pods: list[dict[str, Any]] | None = None,
) -> dict[str, int] | None:
    """Release the training pods held for this cache that are due (``gates.py``); return ``status.consumers``.

    A spec this pass cannot parse still gets the default ``gateTimeout``: bad input must
    not hold training pods forever. A failed pod API call is logged and gives ``None``:
    the warm-up must go on even where the operator may not read pods; the resync retries.
    """
    consumers: Consumers | None = None
    if cache is not None:
        try:
            consumers = parse_spec(cache.get("spec")).consumers
        except SpecError:
            consumers = Consumers()
    when = datetime.datetime.now(datetime.UTC)
    try:
        return gates.sync(client, namespace, name, cache, consumers, ready=ready, now=when, pods=pods)
    except ApiError as exc:
        logger.warning("Releasing the pods of cache %s/%s failed, will retry: %s", namespace, name, exc)
        return None


def observe_and_act(client: Client, cache: Mapping[str, Any], old: Mapping[str, Any], *, now: str) -> dict[str, Any]:
    """Validate, ensure storage, resolve pools, create and remove Jobs; return the status to record."""
    generation = cache["metadata"].get("generation")
    conditions = old.get("conditions") or []

    def cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return status.condition(type_, ok, reason, message, now=now, generation=generation, previous=conditions)

    try:
        spec = parse_spec(cache.get("spec"))
        storage_ok, storage_reason, storage_message = ensure_storage(client, cache, spec)
        pools = resolve_pools(spec, client.list(NODES)) if storage_ok else []
    except SpecError as exc:
        return _base(old, generation) | {
            "phase": status.FAILED,
            "message": f"invalid spec: {exc}",
            "conditions": [cond(status.READY_CONDITION, False, "InvalidSpec", str(exc))],
        }

    storage_condition = cond(status.STORAGE_READY, storage_ok, storage_reason, storage_message)
    if not storage_ok:
        return _base(old, generation) | {
            "phase": status.PENDING,
            "message": storage_message,
            "specHash": jobs.cache_hash(cache, spec),
            "conditions": [
                cond(status.READY_CONDITION, False, storage_reason, storage_message),
                storage_condition,
            ],
        }

    pool_entries = sync_jobs(client, cache, spec, pools, old.get("pools") or [], slot=schedule_slot(spec, now))
    phase, message = status.phase_of(pool_entries)
    warmed = phase in (status.READY, status.DEGRADED)
    pools_condition = cond(status.POOLS_WARMED, warmed, phase, message)
    # Until this generation's expiry runs, the last one's condition and cache counts stand.
    expired_condition = next((c for c in conditions if c.get("type") == expiryjob.EXPIRED_CONDITION), None)
    extra: dict[str, Any] = {}
    if phase == status.READY:
        result = after_warm(client, cache, spec, pool_entries)
        phase, message = result.phase, result.message
        expired_condition = cond(expiryjob.EXPIRED_CONDITION, phase == status.READY, result.reason, message)
        last_expired = result.finished_at if phase == status.READY else None
        extra["cache"] = expiryjob.cache_status(
            result.summary if phase == status.READY else None,
            old.get("cache") or {},
            expiryjob.last_warmed(pool_entries),
            last_expired,
        )
    spec_hash = jobs.cache_hash(cache, spec)
    if status.keeps_serving(old, spec_hash, phase):
        phase, message = status.READY, f"ready; refreshing: {message}"
    ready = phase == status.READY
    return (
        _base(old, generation)
        | extra
        | {
            "phase": phase,
            "message": message,
            "specHash": spec_hash,
            "poolsReady": status.pools_ready(pool_entries),
            "pools": pool_entries,
            "conditions": [
                cond(status.READY_CONDITION, ready, phase, message),
                storage_condition,
                pools_condition,
                *([expired_condition] if expired_condition else []),
            ],
        }
    )


def ensure_storage(client: Client, cache: Mapping[str, Any], spec: CacheSpec) -> tuple[bool, str, str]:
    """Create the claim when asked, or check that it exists: (ready, reason, message)."""
    if spec.gcs is not None:
        # The operator holds no GCS credentials; the warm-up Job's access is its check.
        return True, "GCS", f"cache at {spec.gcs.url}"
    assert spec.pvc is not None
    namespace = cache["metadata"].get("namespace")
    existing = client.get(PVCS, spec.pvc.claim_name, namespace)
    if existing is None:
        manifest = jobs.claim(cache, spec)
        if manifest is None:
            return False, "ClaimNotFound", f"PersistentVolumeClaim {spec.pvc.claim_name} does not exist"
        _create(client, PVCS, manifest, namespace)
        return True, "ClaimCreated", f"created PersistentVolumeClaim {spec.pvc.claim_name}"
    phase = (existing.get("status") or {}).get("phase", "Pending")
    if phase == "Lost":
        return False, "ClaimLost", f"PersistentVolumeClaim {spec.pvc.claim_name} lost its volume"
    return True, "ClaimFound", f"PersistentVolumeClaim {spec.pvc.claim_name} is {phase}"


def sync_jobs(
    client: Client,
    cache: Mapping[str, Any],
    spec: CacheSpec,
    pools: list[Any],
    old_pools: list[Mapping[str, Any]],
    *,
    slot: str | None = None,
) -> list[dict[str, Any]]:
    """Create the Jobs the pools need, delete those of other spec hashes; return ``status.pools``."""
    meta = cache["metadata"]
    namespace, name = meta.get("namespace"), meta["name"]
    observed = {job["metadata"]["name"]: job for job in client.list(JOBS, namespace, labels={jobs.LABEL_CACHE: name})}
    previous = {pool.get("name"): pool for pool in old_pools}

    entries: list[dict[str, Any]] = []
    wanted: set[str] = set()
    for pool in pools:
        manifest = jobs.warmup_job(cache, spec, pool, slot)
        job_name = manifest["metadata"]["name"]
        job = observed.get(job_name)
        entry = status.pool_status(pool, job_name, job, previous.get(pool.name))
        if entry.get("job") == job_name:
            wanted.add(job_name)
            # A finished record whose Job was cleaned up by its TTL is not re-run.
            if job is None and entry.get("reason") == "JobCreated":
                job = _create(client, JOBS, manifest, namespace)
                entry = status.pool_status(pool, job_name, job, previous.get(pool.name))
        entries.append(entry)

    _delete_superseded(client, meta, observed.values(), keep=wanted, what="warm-up")
    return entries


def after_warm(
    client: Client, cache: Mapping[str, Any], spec: CacheSpec, pools: list[dict[str, Any]]
) -> expiryjob.Outcome:
    """The step between "every pool warmed" and Ready: run the lifecycle expiry as a Job, read its summary.

    One expiry Job per (warm-up Jobs, lifecycle) (``expiryjob.expiry_hash``); Jobs of earlier ones are
    deleted. The summary comes from the finished pod's termination message (pods by ``job-name``).
    """
    meta = cache["metadata"]
    namespace, name = meta.get("namespace"), meta["name"]
    warmups = [str(pool["job"]) for pool in pools if pool.get("state") == status.POOL_SUCCEEDED and pool.get("job")]
    manifest = expiryjob.expiry_job(cache, spec, warmups)
    job_name = manifest["metadata"]["name"]
    observed = client.list(JOBS, namespace, labels={expiryjob.LABEL_EXPIRY_OF: name})
    job = next((existing for existing in observed if existing["metadata"]["name"] == job_name), None)
    _delete_superseded(client, meta, observed, keep={job_name}, what="expiry")
    if job is None:
        _create(client, JOBS, manifest, namespace)
        return expiryjob.outcome(None, [])
    finished = status.job_state(job)["state"] in status.FINISHED
    pods = client.list(PODS, namespace, labels={"job-name": job_name}) if finished else []
    return expiryjob.outcome(job, pods)


def schedule_slot(spec: CacheSpec, now: str) -> str | None:
    """The latest ``spec.schedule`` time that has come: a token for the warm-up Jobs' hash (``None``: no schedule)."""
    if spec.schedule is None:
        return None
    when = units.cron_slot(spec.schedule, datetime.datetime.fromisoformat(now.replace("Z", "+00:00")))
    return when.strftime("%Y%m%dT%H%MZ") if when else None


def write_status(client: Client, cache: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Patch the status if it changed, and post an Event for each transition."""
    keys = set(old) | set(new)
    patch = {key: new.get(key) for key in keys if old.get(key) != new.get(key)}
    if not patch:
        return
    meta = cache["metadata"]
    try:
        client.patch(COMPILECACHES, meta["name"], {"status": patch}, meta.get("namespace"), subresource="status")
    except ApiError as exc:
        if exc.status == 404:  # deleted during this pass: nothing left to report on
            return
        raise
    for event in status.transitions(old, new):
        client.post_event(cache, event.type, event.reason, event.message)


def utcnow() -> str:
    """Now, as Kubernetes writes times."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The status fields every pass decides afresh; all others (pools it cannot see on bad
# input, the cache's contents, what other handlers record) are carried over as they are.
# (`consumers` is set by each pass after observe_and_act, from the pods it sees.)
_DECIDED = ("phase", "message", "specHash", "conditions", "observedGeneration")


def _base(old: Mapping[str, Any], generation: int | None) -> dict[str, Any]:
    return {key: value for key, value in old.items() if key not in _DECIDED} | {"observedGeneration": generation}


def _delete_superseded(
    client: Client, meta: Mapping[str, Any], observed: Iterable[Mapping[str, Any]], *, keep: set[str], what: str
) -> None:
    # Only the cache's own Jobs (by owner uid): a Job of a deleted-and-recreated namesake is not ours.
    for job in observed:
        job_name = job["metadata"]["name"]
        owners = {ref.get("uid") for ref in job["metadata"].get("ownerReferences") or []}
        if job_name not in keep and meta.get("uid") in owners:
            logger.info("Deleting the %s Job %s/%s: superseded.", what, meta.get("namespace"), job_name)
            client.delete(JOBS, job_name, meta.get("namespace"))


def _create(client: Client, resource: Any, manifest: Mapping[str, Any], namespace: str | None) -> dict[str, Any] | None:
    try:
        return client.create(resource, manifest, namespace)
    except ApiError as exc:
        if exc.status != 409:  # another pass (or a restarted operator) created it first
            raise
        return client.get(resource, manifest["metadata"]["name"], namespace)
