"""Warm-ups in a Kueue queue: the Jobs' queue labels, and what their Workloads say (pure functions, no I/O).

With ``spec.warmup.queue`` the warm-up Jobs (and the expiry Job, on ``expiryName``) carry Kueue's
``kueue.x-k8s.io/queue-name`` label (and ``kueue.x-k8s.io/priority-class`` for a WorkloadPriorityClass) and
are created suspended: Kueue's Job integration makes a Workload for each, reserves quota in the
LocalQueue's ClusterQueue, runs the ClusterQueue's admission checks, and unsuspends the Job once it is
admitted (Kueue's "Run a Kubernetes Job" task page; its ``constants.go`` names the labels). A pass reads
the Workload of a Job that is still suspended, by the label Kueue puts on it (``kueue.x-k8s.io/job-uid``),
and the pool says ``Queued`` with Kueue's own message (its ``QuotaReserved``/``Admitted`` conditions: no
flavor fits, quota exceeded, a LocalQueue that does not exist...). No bound applies while a Job is queued:
Kueue owns the wait, and the Job API resets ``activeDeadlineSeconds`` when a suspended Job starts, so the
warm-up's time bounds count from admission.

``warmup.priorityClassName`` and ``warmup.jobMetadata`` (labels and annotations on the Jobs and their pods)
apply with or without a queue.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache.controller import podstate, status
from compilecache.controller.api import CacheSpec

QUEUE_NAME = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
JOB_UID = "kueue.x-k8s.io/job-uid"  # on a Workload: the uid of the Job it stands for
QUEUED = status.QUEUED  # a pool's (or the expiry's) reason while its Job waits for Kueue's admission
# A pool's (or the expiry's) reason when Kueue deactivated the Job's Workload (``spec.active: false``): an
# admission check Rejected it, waitForPodsReady's requeuing limit ran out, or someone deactivated it. Kueue
# then admits it no more and the Job stays suspended (Kueue's "Admission Check" concepts page: Rejected
# "evicts the workload and deactivates it"; Workload API: ``spec.active``), so it waits for nothing.
DEACTIVATED = "WorkloadDeactivated"


def apply(job: Mapping[str, Any], spec: CacheSpec, *, expiry: bool = False) -> dict[str, Any]:
    """The Job with the cache's queue, priority and extra metadata (the operator's own labels win)."""
    warmup = spec.warmup
    manifest = copy.deepcopy(dict(job))
    meta, template = manifest["metadata"], manifest["spec"]["template"]
    for target in (meta, template["metadata"]):
        target["labels"] = {**warmup.job_labels, **(target.get("labels") or {})}
        annotations = {**warmup.job_annotations, **(target.get("annotations") or {})}
        if annotations:
            target["annotations"] = annotations
    if warmup.priority_class_name:
        template["spec"]["priorityClassName"] = warmup.priority_class_name
    if warmup.queue is not None:
        meta["labels"][QUEUE_NAME] = warmup.queue.expiry_name if expiry else warmup.queue.name
        if warmup.queue.priority_class:
            meta["labels"][PRIORITY_CLASS] = warmup.queue.priority_class
        # Created suspended, as Kueue's webhook would make it: no pod before admission.
        manifest["spec"]["suspend"] = True
    return manifest


def queued(job: Mapping[str, Any]) -> bool:
    """Whether the Job waits for Kueue: it names a queue, is still suspended, and has not finished (a Job
    suspended again after it ran, e.g. evicted by Kueue, waits for re-admission too)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    suspended = bool((job.get("spec") or {}).get("suspend"))
    return QUEUE_NAME in labels and suspended and status.job_state(job)["state"] not in status.FINISHED


def workload_of(job: Mapping[str, Any], workloads: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Job's Workload among ``workloads``, by the Job's uid."""
    uid = (job.get("metadata") or {}).get("uid")
    return next((w for w in workloads if ((w.get("metadata") or {}).get("labels") or {}).get(JOB_UID) == uid), None)


def waiting(job: Mapping[str, Any], workload: Mapping[str, Any] | None) -> dict[str, Any]:
    """The pool fields of a Job that waits for Kueue: Pending, ``Queued``, with Kueue's own words; Failed,
    ``WorkloadDeactivated``, when Kueue deactivated its Workload (it would stay suspended for ever)."""
    queue = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_NAME)
    if workload is not None and (workload.get("spec") or {}).get("active") is False:
        conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
        said = " ".join(str((conditions.get("Evicted") or {}).get("message") or "").split())
        message = f"Kueue deactivated the Job's Workload in LocalQueue {queue}, and admits it no more" + (
            f": {said}" if said else ""
        )
        return {"state": status.POOL_FAILED, "reason": DEACTIVATED, "message": message[: podstate.MESSAGE_MAX]}
    if workload is None:
        said = "no Workload yet (Kueue makes one for a Job with a queue; is Kueue running with the Job integration?)"
    else:
        conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
        # The most telling first: why quota is not reserved, else why it is not admitted (its checks).
        found = next(
            (
                conditions[t]
                for t in ("QuotaReserved", "Admitted", "Evicted", "Requeued")
                if t in conditions and (conditions[t].get("status") != "True" or t in ("Evicted", "Requeued"))
            ),
            None,
        )
        checks = [
            f"{c.get('name')}: {c.get('state')}" + (f" ({c.get('message')})" if c.get("message") else "")
            for c in (workload.get("status") or {}).get("admissionChecks") or []
            if c.get("state") != "Ready"
        ]
        said = " ".join(str((found or {}).get("message") or "waiting for admission").split())
        if checks:
            said += f"; admission checks: {', '.join(checks)}"
    message = f"queued in LocalQueue {queue}: {said}"
    return {"state": "Pending", "reason": QUEUED, "message": message[: podstate.MESSAGE_MAX]}
