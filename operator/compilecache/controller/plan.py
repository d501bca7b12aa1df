"""Plan: one pure function from a pass's snapshot to what the pass does (no I/O).

:func:`plan` decides everything a pass of a CompileCache does — the claim, Jobs and
multi-host Services to create, the superseded Jobs and the Services no running Job
needs to delete, the training pods to release, the new status and its Events — from
a :class:`~compilecache.controller.snapshot.Snapshot` and the time. ``act.py`` applies
the result and cannot make a decision; when the API refuses a creation, the pass
plans again with the refusal in the snapshot (``Snapshot.after``).
:func:`failed` is the plan of a pass that raised: a status that says what failed,
and the gate releases that must happen anyway. A spec the operator's policy refuses
(``policy.py``: what it asks to run, its discovered pools, a claim that did not opt in) is
Failed like bad input, naming the field, and nothing is created for it.

Every Job is named deterministically from the cache, the pool, the topology and a hash of
what it compiles, so planning twice from the same cluster never creates a Job twice.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.cache import units
from compilecache.controller import (
    expiryjob,
    gates,
    images,
    jobs,
    podstate,
    policy,
    provisioning,
    queueing,
    status,
    template,
)
from compilecache.controller.api import CacheSpec, SpecError, Topology
from compilecache.controller.kube import JOBS, PROVISIONING_REQUESTS, PVCS, SERVICES, ApiError, Resource
from compilecache.controller.pools import Pool, left_out_status, resolve
from compilecache.controller.snapshot import Cache, Obj, Snapshot
from compilecache.controller.status import Event
from compilecache.controller.template import PODTEMPLATES

# The condition that says the last pass failed; absent after a pass that succeeded.
RECONCILED_CONDITION = "Reconciled"
RECONCILE_ERROR = "ReconcileError"
JOB_REJECTED = "JobRejected"
SERVICE_REJECTED = "ServiceRejected"
EXPIRY_REJECTED = "ExpiryRejected"
CLAIM_REJECTED = "ClaimRejected"
INVALID_SPEC = "InvalidSpec"
POLICY_VIOLATION = "PolicyViolation"  # the spec asks for what the operator's policy refuses
CLAIM_NOT_OPTED_IN = "ClaimNotOptedIn"  # an existing claim not made for this cache, and not opted in
# The Event of a schedule slot that came while the last slot's warm-up or expiry ran (concurrency Forbid).
SCHEDULE_SKIPPED = "ScheduleSkipped"
# status fields (as CronJob's status.lastScheduleTime): the slot whose warm-up the pools follow, and the
# last slot skipped because that one was still running.
LAST_SCHEDULE = "lastScheduleTime"
LAST_SKIPPED = "lastSkippedScheduleTime"
TEMPLATE_NOT_FOUND = "TemplateNotFound"  # podTemplate.templateRef names nothing (yet): the cache waits

# The status fields every pass decides afresh; all others (pools it cannot see on bad
# input, the cache's contents, what other handlers record) are carried over as they are.
# (`consumers` is counted by act from the pods after the releases.)
_DECIDED = ("phase", "message", "reason", "specHash", "conditions", "observedGeneration", "leftOutPools")


@dataclass(frozen=True)
class Create:
    """An object to create."""

    resource: Resource
    manifest: Obj

    @property
    def name(self) -> str:
        """The object's name (deterministic)."""
        return str(self.manifest["metadata"]["name"])

    @property
    def key(self) -> str:
        """The key of ``Snapshot.created``/``rejected``: ``plural/name`` (a Job and its Service share a name)."""
        return self.resource.key(self.name)


@dataclass(frozen=True)
class Delete:
    """An object to delete, and why (for the log)."""

    resource: Resource
    name: str
    why: str


@dataclass(frozen=True)
class Patch:
    """A merge patch of an object's spec, and why (for the log): a suspended warm-up Job let go."""

    resource: Resource
    name: str
    patch: Mapping[str, Any]
    why: str


@dataclass(frozen=True)
class Plan:
    """What one pass does: create, patch, delete, release, and the status and Events to record."""

    status: Mapping[str, Any]
    creates: tuple[Create, ...] = ()
    deletes: tuple[Delete, ...] = ()
    releases: tuple[gates.Release, ...] = ()
    events: tuple[Event, ...] = ()
    patches: tuple[Patch, ...] = ()
    # The image the cache warms now, as this pass read training's template (None: it could not tell);
    # Kueue's checks of this pass decide with it as the gate's releases do (reconcile.release_workloads).
    image: str | None = None


def plan(snapshot: Snapshot, now: str) -> Plan:
    """Decide one pass from ``snapshot`` at ``now`` (RFC 3339, as Kubernetes writes times)."""
    cache = snapshot.cache
    old = cache.status
    try:
        if cache.error is not None:
            raise cache.error
        assert cache.spec is not None  # parsed when there is no error
        spec = cache.spec
        if snapshot.template is not None:  # a template that cannot be used: Failed, naming where
            spec = template.resolve(spec, snapshot.template)
        new, creates, deletes, patches = _decide(snapshot, spec, now)
        current = _current_image(snapshot, spec)
    except SpecError as exc:
        current = None
        new = _base(old, cache.generation) | {
            "phase": status.FAILED,
            "message": f"invalid spec: {exc}",
            "conditions": [_condition(cache, status.READY_CONDITION, False, INVALID_SPEC, str(exc), now)],
        }
        creates, deletes, patches = [], [], []
    consumers = policy.bounded(cache.consumers, snapshot.policy)
    now_time = _parse_time(now)
    releases = gates.plan(
        snapshot.pods,
        consumers,
        phase=new.get("phase"),
        now=now_time,
        settled=status.settled(new),
        warmed=images.recorded(new),
        current=current,
    )
    new = status.with_reason(new)
    events = status.transitions(old, new)
    if new.get(LAST_SKIPPED) and new.get(LAST_SKIPPED) != old.get(LAST_SKIPPED):  # once per skipped slot
        message = (
            f"schedule slot {new[LAST_SKIPPED]} skipped: the refresh of slot {new.get(LAST_SCHEDULE)} "
            "is still running (concurrency Forbid, as a CronJob's)"
        )
        events.append(Event("Normal", SCHEDULE_SKIPPED, message))
    return Plan(
        status=new,
        creates=tuple(creates),
        deletes=tuple(deletes),
        releases=tuple(releases),
        events=tuple(events),
        patches=tuple(patches),
        image=current,
    )


def failed(
    cache: Cache, pods: Sequence[Obj], error: BaseException, now: str, rules: policy.Policy = policy.DEFAULT
) -> Plan:
    """The plan of a pass that raised ``error``: say what failed, keep serving if serving, release what is due.

    A Ready (or Degraded) cache keeps its phase: its published entries did not turn bad because
    the operator could not finish a pass, and new training pods must not be gated by an operator hiccup.
    Anything else is Failed until a retry succeeds. Nothing is created or deleted.
    """
    old = cache.status
    detail = describe_error(error)
    keep_serving = old.get("phase") in status.SERVING
    conditions = [c for c in old.get("conditions") or [] if c.get("type") != RECONCILED_CONDITION]
    if keep_serving:
        phase, message = old["phase"], f"{old['phase'].lower()}; the last pass failed, retrying: {detail}"
    else:
        phase, message = status.FAILED, f"the operator's pass failed, retrying: {detail}"
        conditions = [c for c in conditions if c.get("type") != status.READY_CONDITION]
        conditions.insert(0, _condition(cache, status.READY_CONDITION, False, RECONCILE_ERROR, detail, now))
    conditions.append(_condition(cache, RECONCILED_CONDITION, False, RECONCILE_ERROR, detail, now))
    new = {key: value for key, value in old.items() if key not in ("phase", "message", "conditions")} | {
        "phase": phase,
        "message": message,
        "conditions": conditions,
    }
    new = status.with_reason(new)
    events = status.transitions(old, new)
    before = _find_condition(old, RECONCILED_CONDITION)
    if not any(event.type == "Warning" for event in events) and before.get("message") != detail:
        events.append(Event("Warning", RECONCILE_ERROR, message))
    consumers = policy.bounded(cache.consumers, rules)
    releases = gates.plan(
        pods, consumers, phase=phase if keep_serving else None, now=_parse_time(now), warmed=images.recorded(old)
    )
    return Plan(status=new, releases=tuple(releases), events=tuple(events))


def describe_error(error: BaseException) -> str:
    """One line about what failed: the API's answer, or the exception's type and text."""
    if isinstance(error, ApiError):
        return f"API error {error}"
    return f"{type(error).__name__}: {error}"


def schedule_slot(spec: CacheSpec, now: str) -> str | None:
    """The latest ``spec.schedule`` time that has come: a token for the warm-up Jobs' hash (``None``: no schedule).

    A schedule that cannot be evaluated is bad input: :class:`SpecError` naming ``spec.schedule``.
    """
    if spec.schedule is None:
        return None
    try:
        when = units.cron_slot(spec.schedule, _parse_time(now))
    except (ValueError, TypeError) as exc:
        raise SpecError("spec.schedule", str(exc)) from None
    return when.strftime("%Y%m%dT%H%MZ") if when else None


def slot_time(slot: str) -> str:
    """A :func:`schedule_slot` token as Kubernetes writes times (``20261121T1000Z`` → ``2026-11-21T10:00:00Z``)."""
    return datetime.datetime.strptime(slot, "%Y%m%dT%H%MZ").strftime("%Y-%m-%dT%H:%M:00Z")


def _slot_of(value: Any) -> str | None:
    """The slot token of a recorded time (:func:`slot_time`'s inverse), ``None`` if absent or unreadable."""
    try:
        return _parse_time(str(value)).strftime("%Y%m%dT%H%MZ") if value else None
    except ValueError:
        return None


def _concurrency(
    snapshot: Snapshot, spec: CacheSpec, pools: Sequence[Pool], spec_hash: str, slot: str | None
) -> tuple[str | None, str | None]:
    """(the slot whose warm-up this pass follows, the slot it skips): ``spec.concurrencyPolicy``, as a CronJob's.

    ``Replace``: a new slot's Jobs replace the running ones (superseded). ``Forbid`` (the default):
    a slot that comes while the last slot's warm-up or expiry runs is skipped, and stays skipped
    after that run ends (as a CronJob with a short ``startingDeadlineSeconds``): running it late would
    start a new warm-up the moment the last one ends, and a schedule shorter than a warm-up would
    never let the cache settle. The running Jobs are never deleted as superseded. A change of what
    is compiled (a new spec hash) is not a slot: it replaces the running Jobs as before.
    """
    old = snapshot.cache.status
    in_use = _slot_of(old.get(LAST_SCHEDULE))
    if spec.concurrency_policy == "Replace":
        return slot, None
    if slot is None or in_use is None or in_use == slot or old.get("specHash") != spec_hash:
        return slot, None
    if _slot_of(old.get(LAST_SKIPPED)) == slot:  # skipped while the last run ran: it stays skipped
        return in_use, slot
    if _runs(snapshot, spec, pools, in_use):
        return in_use, slot
    return slot, None


def _runs(snapshot: Snapshot, spec: CacheSpec, pools: Sequence[Pool], slot: str) -> bool:
    """Whether a warm-up Job of ``slot`` (as this spec names them), or an expiry Job, still runs."""
    names = {
        str(jobs.warmup_job(snapshot.cache.obj, spec, pool, slot, topology)["metadata"]["name"])
        for pool in pools
        for topology in spec.warmup.topologies
    }
    warming = [job for job in snapshot.jobs if job["metadata"]["name"] in names]
    return any(status.job_state(job)["state"] not in status.FINISHED for job in (*warming, *snapshot.expiry_jobs))


def _current_image(snapshot: Snapshot, spec: CacheSpec) -> str | None:
    """The image the cache warms now (``spec`` resolved: training's, as the pass read its template, or the
    spec's); None when the referenced template is not there (no one can tell which image a pod waits for)."""
    if spec.warmup.template is not None and spec.warmup.template.ref is not None and snapshot.template is None:
        return None
    return spec.warmup.image or None


def _decide(
    snapshot: Snapshot, spec: CacheSpec, now: str
) -> tuple[dict[str, Any], list[Create], list[Delete], list[Patch]]:
    """The pass's status and objects for ``spec``, with the referenced template resolved into it (``plan``)."""
    cache = snapshot.cache
    old = cache.status
    conditions = old.get("conditions") or []

    def cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return _condition(cache, type_, ok, reason, message, now)

    creates: list[Create] = []
    deletes: list[Delete] = []
    source = spec.warmup.template
    if source is not None and source.ref is not None and snapshot.template is None:
        # Pending, not Failed: a cache is often applied just before the training Job it names.
        message = f"{template.REF_FIELD}: {source.ref.describe()} does not exist in namespace {cache.namespace}"
        return (
            _base(old, cache.generation)
            | {
                "phase": status.PENDING,
                "message": message,
                "specHash": jobs.cache_hash(cache.obj, spec),
                "conditions": [cond(status.READY_CONDITION, False, TEMPLATE_NOT_FOUND, message)],
            },
            creates,
            deletes,
            [],
        )
    # Checked again here, not only at admission: the validating webhook may be absent, or the
    # policy changed since the cache was applied. Nothing is created for a refused spec.
    refused = policy.violations(spec, snapshot.policy)
    if refused:
        return _refused_by_policy(cache, spec, refused, now), creates, deletes, []
    storage_ok, storage_reason, storage_message, claim = _storage(snapshot, spec)
    if claim is not None:
        creates.append(claim)
    spec_hash = jobs.cache_hash(cache.obj, spec)
    storage_condition = cond(status.STORAGE_READY, storage_ok, storage_reason, storage_message)
    if not storage_ok:
        return (
            _base(old, cache.generation)
            | {
                "phase": status.FAILED if storage_reason in (CLAIM_REJECTED, CLAIM_NOT_OPTED_IN) else status.PENDING,
                "message": storage_message,
                "specHash": spec_hash,
                "conditions": [cond(status.READY_CONDITION, False, storage_reason, storage_message), storage_condition],
            },
            creates,
            deletes,
            [],
        )

    resolved = resolve(spec, snapshot.nodes)
    pools = resolved.pools
    refused = policy.pool_violations(spec, pools, snapshot.policy)
    if refused:  # not even the claim: nothing is created for a refused cache
        return _refused_by_policy(cache, spec, refused, now), [], deletes, []
    slot, skipped = _concurrency(snapshot, spec, pools, spec_hash, schedule_slot(spec, now))
    entries, job_creates, job_deletes, patches = _warmups(snapshot, spec, pools, slot, now)
    creates += job_creates
    deletes += job_deletes
    phase, message = status.phase_of(entries)
    if not entries and resolved.left_out:  # not "waiting for nodes": they are there, training cannot use them
        names = ", ".join(pool.name for pool in resolved.left_out[: status.NAMED])
        more = f" and {len(resolved.left_out) - status.NAMED} more" if len(resolved.left_out) > status.NAMED else ""
        message = f"training's pod template rules out every discovered pool ({names}{more}): see status.leftOutPools"
    warmed = phase in (status.READY, status.DEGRADED)
    pools_condition = cond(status.POOLS_WARMED, warmed, phase, message)
    # Until this generation's expiry runs, the last one's condition and cache counts stand.
    expired_condition = next((c for c in conditions if c.get("type") == expiryjob.EXPIRED_CONDITION), None)
    extra: dict[str, Any] = {}
    # Entries and size show as soon as a warm-up reported (kubectl get cc), before expiry counts them.
    counted = status.cache_from_pools(entries, old.get("cache") or {})
    if counted != (old.get("cache") or {}):
        extra["cache"] = counted
    expiry_summary: Mapping[str, Any] | None = None  # this generation's expiry: which images' entries it left
    if warmed:
        # Degraded too: a partly failed warm-up still prunes and checks what the cache holds
        # (a corrupt entry that failed a pool's verify is exactly what expiry removes).
        outcome, expiry_creates, expiry_deletes = _expiry(snapshot, spec, entries, now)
        creates += expiry_creates
        deletes += expiry_deletes
        expired = outcome.phase == status.READY
        if expired:
            expiry_summary = outcome.summary
        expired_condition = cond(expiryjob.EXPIRED_CONDITION, expired, outcome.reason, outcome.message)
        if phase == status.READY:
            phase, message = outcome.phase, outcome.message
        else:  # Degraded: it stays Degraded once expired, and says what expiry did
            phase, message = (phase if expired else outcome.phase), f"{message}; {outcome.message}"
        extra["cache"] = expiryjob.cache_status(
            outcome.summary if expired else None,
            counted,
            expiryjob.last_warmed(entries),
            outcome.finished_at if expired else None,
        )
    refused = _pod_violations(creates, pools, snapshot.policy)
    if refused:  # what the spec's checks missed, found on the pods themselves: nothing is created
        return _refused_by_policy(cache, spec, refused, now), [], deletes, []
    if status.keeps_serving(old, spec_hash, phase):
        phase, message = status.READY, f"ready; refreshing: {message}"
    settled = status.settled({"phase": phase, "pools": entries})
    images_now = images.advance(images.recorded(old), spec.warmup.image, phase, settled=settled, now=now)
    if expiry_summary is not None:
        images_now = expiryjob.images_kept(images_now, expiry_summary)
    if images_now != list(images.recorded(old)):
        extra["images"] = images_now
    ready = phase == status.READY
    if slot is not None:
        extra[LAST_SCHEDULE] = slot_time(slot)
    if skipped is not None:
        extra[LAST_SKIPPED] = slot_time(skipped)
    if resolved.left_out:
        extra["leftOutPools"] = left_out_status(resolved.left_out)
    new = (
        _base(old, cache.generation)
        | extra
        | {
            "phase": phase,
            "message": message,
            "specHash": spec_hash,
            "poolsReady": status.pools_ready(entries),
            "pools": entries,
            "cost": status.cache_cost(entries),  # GPU-seconds of the pools' recorded warm-ups (docs/cost.md)
            "conditions": [
                cond(status.READY_CONDITION, ready, phase, message),
                storage_condition,
                pools_condition,
                *([expired_condition] if expired_condition else []),
                _progressing(cache, entries, expired_condition if warmed else None, now),
            ],
        }
    )
    return new, creates, deletes, patches


def _progressing(
    cache: Cache, pools: Sequence[Mapping[str, Any]], expired: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """The ``Progressing`` condition, as a Deployment's: False with the reason a warm-up or expiry pod is stuck on."""
    stuck = [f"pool {status.label(pool)}: {pool.get('message', '')}" for pool in pools if status.is_stuck(pool)]
    reasons = [str(pool["reason"]) for pool in pools if status.is_stuck(pool)]
    if expired is not None and expired.get("reason") in podstate.REASONS:
        stuck.append(f"expiry: {expired.get('message', '')}")
        reasons.append(str(expired["reason"]))
    if not stuck:
        return _condition(cache, podstate.PROGRESSING_CONDITION, True, podstate.NO_STUCK_PODS, "no pod is stuck", now)
    return _condition(cache, podstate.PROGRESSING_CONDITION, False, reasons[0], "; ".join(stuck)[:2048], now)


def _storage(snapshot: Snapshot, spec: CacheSpec) -> tuple[bool, str, str, Create | None]:
    """Whether the storage is usable (ready, reason, message), and the claim to create if asked."""
    if spec.gcs is not None:
        # The operator holds no GCS credentials; the warm-up Job's access is its check.
        return True, "GCS", f"cache at {spec.gcs.url}", None
    assert spec.pvc is not None
    claim_name = spec.pvc.claim_name
    existing = snapshot.claim
    if existing is None:
        manifest = jobs.claim(snapshot.cache.obj, spec)
        if manifest is None:
            return False, "ClaimNotFound", f"PersistentVolumeClaim {claim_name} does not exist", None
        key = PVCS.key(claim_name)
        if key in snapshot.rejected:
            message = f"creating PersistentVolumeClaim {claim_name} was refused: {snapshot.rejected[key]}"
            return False, CLAIM_REJECTED, message, None
        create = None if key in snapshot.created else Create(PVCS, manifest)
        return True, "ClaimCreated", f"created PersistentVolumeClaim {claim_name}", create
    # Only a claim made for this cache, or one that opted in: an author must not get another
    # workload's claim mounted read-write by naming it.
    refused = policy.claim_violation(spec, existing, snapshot.cache.name, snapshot.cache.uid, snapshot.policy)
    if refused is not None:
        return False, CLAIM_NOT_OPTED_IN, policy.describe([refused]), None
    phase = (existing.get("status") or {}).get("phase", "Pending")
    if phase == "Lost":
        return False, "ClaimLost", f"PersistentVolumeClaim {claim_name} lost its volume", None
    return True, "ClaimFound", f"PersistentVolumeClaim {claim_name} is {phase}", None


def _pod_violations(creates: Sequence[Create], pools: Sequence[Pool], rules: policy.Policy) -> list[policy.Violation]:
    """The policy held on the pod of each Job to create (``policy.pod_violations``), whatever field made it."""
    gpu_resources = {pool.name: pool.gpu_resource for pool in pools}
    found: list[policy.Violation] = []
    for create in creates:
        if create.resource is not JOBS:
            continue
        template = create.manifest["spec"]["template"]
        gpu_resource = gpu_resources.get(_labels(template).get(jobs.LABEL_POOL, ""), "")
        found += policy.pod_violations(template["spec"], rules, gpu_resource, f"Job {create.name}")
    return found


def _refused_by_policy(cache: Cache, spec: CacheSpec, refused: Sequence[policy.Violation], now: str) -> dict[str, Any]:
    """The Failed status of a spec the operator's policy refuses: the message names each field."""
    message = f"refused by the operator's policy: {policy.describe(refused)}"
    return _base(cache.status, cache.generation) | {
        "phase": status.FAILED,
        "message": message,
        "specHash": jobs.cache_hash(cache.obj, spec),
        "conditions": [_condition(cache, status.READY_CONDITION, False, POLICY_VIOLATION, message, now)],
    }


def _warmups(
    snapshot: Snapshot, spec: CacheSpec, pools: Sequence[Pool], slot: str | None, now: str
) -> tuple[list[dict[str, Any]], list[Create], list[Delete], list[Patch]]:
    """``status.pools`` (one entry per pool × topology), the warm-up Jobs and Services (and with
    ``provisioningRequest``, their PodTemplates and ProvisioningRequests) to create, the suspended Jobs
    whose capacity came to let go, and the superseded Jobs and what no waiting or running Job needs, to delete."""
    cache = snapshot.cache
    observed = {job["metadata"]["name"]: job for job in snapshot.jobs}
    services = {service["metadata"]["name"] for service in snapshot.services}
    requests = {str(r["metadata"]["name"]): r for r in snapshot.requests}
    asking = spec.warmup.provisioning
    previous = {status.key(pool): pool for pool in cache.status.get("pools") or []}
    entries: list[dict[str, Any]] = []
    creates: list[Create] = []
    patches: list[Patch] = []
    wanted: set[str] = set()
    serving: set[str] = set()  # Services of multi-host Jobs that are to run or running
    waiting: set[str] = set()  # ProvisioningRequests of Jobs that are to run, wait or run
    regroup: list[Delete] = []  # multi-host Jobs a disruption failed: deleted, to run again
    reask: list[Delete] = []  # provisioned requests whose capacity a disruption took: asked for again
    for pool in pools:
        for topology in spec.warmup.topologies:
            manifest = jobs.warmup_job(
                cache.obj,
                spec,
                pool,
                slot,
                topology,
                run_as_user=snapshot.policy.run_as_user,
                runtime=snapshot.policy.runtime,
            )
            if asking is not None:
                manifest = provisioning.suspended(manifest, asking)
            job_name = str(manifest["metadata"]["name"])
            job_key = JOBS.key(job_name)
            service = jobs.warmup_service(manifest) if topology.multi_host else None
            service_key = SERVICES.key(jobs.service_name(job_name))
            request_key = PROVISIONING_REQUESTS.key(job_name)
            template_key = PODTEMPLATES.key(job_name)
            job = observed.get(job_name)
            pods = [pod for pod in snapshot.warmup_pods if _labels(pod).get("job-name") == job_name]
            before = previous.get((pool.name, topology.hosts))
            if job is None and job_key in snapshot.rejected:
                # The API refused the Job (e.g. 422): it fails the same way until the spec changes, and
                # its name (and so this record) changes with the spec. The record stops the retries.
                entry = _refused(pool, job_name, topology, JOB_REJECTED, "Job", snapshot.rejected[job_key])
            elif job is None and service is not None and service_key in snapshot.rejected:
                entry = _refused(pool, job_name, topology, SERVICE_REJECTED, "Service", snapshot.rejected[service_key])
            elif job is None and (refusal := snapshot.rejected.get(request_key) or snapshot.rejected.get(template_key)):
                # E.g. 404: Cluster Autoscaler's ProvisioningRequest CRD is not installed.
                kind = "ProvisioningRequest" if request_key in snapshot.rejected else "PodTemplate"
                entry = _refused(pool, job_name, topology, provisioning.REQUEST_REJECTED, kind, refusal)
            else:
                entry = status.pool_status(
                    pool,
                    job_name,
                    job,
                    before,
                    pods,
                    topology,
                    now,
                    events=snapshot.events,
                    capacity_seconds=spec.warmup.capacity_timeout_seconds,
                )
                if job is not None and queueing.queued(job):
                    entry |= queueing.waiting(job, queueing.workload_of(job, snapshot.workloads))
                if job is not None and asking is not None and provisioning.is_suspended(job):
                    request = requests.get(job_name)
                    capacity = spec.warmup.capacity_timeout_seconds
                    entry |= provisioning.waiting(job_name, request, job, now, capacity)
                    if provisioning.provisioned(request):
                        patches.append(Patch(JOBS, job_name, {"spec": {"suspend": False}}, "its capacity came"))
            regrouping = bool(entry.pop(status.REGROUP, False)) and job is not None and _owned(cache, job)
            if regrouping:
                # Not kept as superseded would be: deleted, and the next pass makes it again (status.regrouped).
                regroup.append(Delete(JOBS, job_name, "a disruption failed its process group: it starts again"))
            if entry.get("job") == job_name and not regrouping:
                wanted.add(job_name)
                # A finished record whose Job was cleaned up by its TTL is not re-run.
                create = job is None and entry.get("reason") == "JobCreated" and job_key not in snapshot.created
                running = job is not None and status.job_state(job)["state"] not in status.FINISHED
                if asking is not None and (create or running):
                    waiting.add(job_name)
                    if job is not None and running and provisioning.lost(requests.get(job_name), job, pods):
                        # Its retry consumes the same request, and a consuming pod makes no scale-up (Cluster
                        # Autoscaler's ProvisioningRequestPodsFilter): ask again, under the same name.
                        reask.append(Delete(PROVISIONING_REQUESTS, job_name, "its capacity was lost to a disruption"))
                    # Before its Job: the request names the PodTemplate, the Job's pods name the request.
                    if job_name not in requests and request_key not in snapshot.created:
                        if template_key not in snapshot.created:
                            creates.append(Create(PODTEMPLATES, provisioning.pod_template(manifest)))
                        creates.append(
                            Create(PROVISIONING_REQUESTS, provisioning.request(manifest, asking, topology.hosts))
                        )
                if service is not None and (create or running):
                    serving.add(service["metadata"]["name"])
                    # Before its Job: process 0's name must resolve when the pods start.
                    if service["metadata"]["name"] not in services and service_key not in snapshot.created:
                        creates.append(Create(SERVICES, service))
                if create:
                    creates.append(Create(JOBS, manifest))
            entries.append(entry)
    deletes = _superseded(cache, snapshot.jobs, keep=wanted | {d.name for d in regroup}, what="warm-up")
    deletes += regroup + reask
    # A multi-host Job's Service lives while the Job runs; a ProvisioningRequest (and its PodTemplate) while its
    # Job waits or runs: a finished or superseded one leaves nothing behind (an autoscaler keeps provisioning
    # for a request until it goes).
    for name in _idle(cache, snapshot.services, keep=serving):
        deletes.append(Delete(SERVICES, name, "warm-up Service of a finished or superseded Job"))
    for name in _idle(cache, snapshot.requests, keep=waiting):
        deletes.append(Delete(PROVISIONING_REQUESTS, name, "ProvisioningRequest of a finished or superseded Job"))
        deletes.append(Delete(PODTEMPLATES, name, "PodTemplate of a finished or superseded Job's request"))
    return entries, creates, deletes, patches


def _owned(cache: Cache, obj: Obj) -> bool:
    return cache.uid in {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}


def _idle(cache: Cache, observed: Sequence[Obj], *, keep: set[str]) -> list[str]:
    """The names of the cache's own objects (by owner uid: not a deleted-and-recreated namesake's) not in ``keep``."""
    return [
        str(obj["metadata"]["name"]) for obj in observed if obj["metadata"]["name"] not in keep and _owned(cache, obj)
    ]


def _refused(pool: Pool, job_name: str, topology: Topology, reason: str, kind: str, answer: str) -> dict[str, Any]:
    return status.pool_status(pool, job_name, None, None, topology=topology) | {
        "state": status.POOL_FAILED,
        "reason": reason,
        "message": f"the API refused the warm-up {kind}: {answer}",
    }


def _expiry(
    snapshot: Snapshot, spec: CacheSpec, pools: Sequence[Mapping[str, Any]], now: str
) -> tuple[expiryjob.Outcome, list[Create], list[Delete]]:
    """The step between "every pool finished" and Ready: the expiry Job of the warmed pools, and its outcome.

    One expiry Job per (succeeded warm-up Jobs, lifecycle) (``expiryjob.expiry_hash``); Jobs of
    earlier ones are deleted. The summary comes from the finished pod's termination message.
    """
    cache = snapshot.cache
    warmups = [str(pool["job"]) for pool in pools if pool.get("state") == status.POOL_SUCCEEDED and pool.get("job")]
    manifest = expiryjob.expiry_job(
        cache.obj, spec, warmups, run_as_user=snapshot.policy.run_as_user, runtime=snapshot.policy.runtime
    )
    job_name = str(manifest["metadata"]["name"])
    deletes = _superseded(cache, snapshot.expiry_jobs, keep={job_name}, what="expiry")
    job = next((job for job in snapshot.expiry_jobs if job["metadata"]["name"] == job_name), None)
    if job is not None:
        if queueing.queued(job):
            said = queueing.waiting(job, queueing.workload_of(job, snapshot.workloads))
            failed = said["state"] == status.POOL_FAILED
            phase, prefix = (status.FAILED, "expiry failed") if failed else (status.EXPIRING, "expiring")
            return expiryjob.Outcome(phase, said["reason"], f"{prefix}: {said['message']}"), [], deletes
        pods = [pod for pod in snapshot.expiry_pods if _labels(pod).get("job-name") == job_name]
        capacity = spec.warmup.capacity_timeout_seconds
        return expiryjob.outcome(job, pods, now, snapshot.events, capacity), [], deletes
    refused = snapshot.rejected.get(JOBS.key(job_name))
    if refused is not None:
        message = f"expiry Job {job_name} was refused by the API: {refused}"
        return expiryjob.Outcome(status.FAILED, EXPIRY_REJECTED, message), [], deletes
    expired = _find_condition(cache.status, expiryjob.EXPIRED_CONDITION)
    refused_before = str(expired.get("message", "")).startswith(f"expiry Job {job_name} ")
    if expired.get("reason") == EXPIRY_REJECTED and refused_before:
        # Refused before: the same Job would be refused again; a lifecycle or warm-up change renames it.
        return expiryjob.Outcome(status.FAILED, EXPIRY_REJECTED, str(expired["message"])), [], deletes
    creates = [] if JOBS.key(job_name) in snapshot.created else [Create(JOBS, manifest)]
    return expiryjob.outcome(None, []), creates, deletes


def _superseded(cache: Cache, observed: Sequence[Obj], *, keep: set[str], what: str) -> list[Delete]:
    # Only the cache's own Jobs (by owner uid): a Job of a deleted-and-recreated namesake is not ours.
    deletes = []
    for job in observed:
        job_name = str(job["metadata"]["name"])
        if job_name not in keep and _owned(cache, job):
            deletes.append(Delete(JOBS, job_name, f"superseded {what} Job"))
    return deletes


def _condition(cache: Cache, type_: str, ok: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    previous = cache.status.get("conditions") or []
    return status.condition(type_, ok, reason, message, now=now, generation=cache.generation, previous=previous)


def _find_condition(status_: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    found: Mapping[str, Any] = next((c for c in status_.get("conditions") or [] if c.get("type") == type_), {})
    return found


def _base(old: Mapping[str, Any], generation: int | None) -> dict[str, Any]:
    return {key: value for key, value in old.items() if key not in _DECIDED} | {"observedGeneration": generation}


def _labels(obj: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


def _parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
