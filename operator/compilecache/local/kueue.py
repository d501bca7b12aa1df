"""A stand-in for Kueue (kubernetes-sigs/kueue v0.19, API ``kueue.x-k8s.io/v1beta2``) on the local cluster.

What it stands for, and how each part is known to be Kueue's (its docs' concepts pages "Workload",
"Admission", "Admission Check", "Cluster Queue", "Run a Kubernetes Job", and its source):

* the **Job webhook** suspends a Job created with the ``kueue.x-k8s.io/queue-name`` label
  (``jobframework.ApplyDefaultForSuspend``; the webhook is registered for CREATE only):
  :func:`suspend_on_create`;
* the **Job integration** makes one Workload per queued Job (``jobframework`` reconciler): named
  ``job-<job name>-<5 hex>``, the hex the start of a SHA-1 of kind, group, name and uid
  (``jobframework/workload_names.go``), owned by the Job (``controller: true``), labelled with the
  Job's uid, one pod set ``main`` of ``parallelism`` pods from the Job's template, and the priority of
  the ``kueue.x-k8s.io/priority-class`` WorkloadPriorityClass (``spec.priorityClassRef`` and
  ``spec.priority`` in v1beta2): :func:`workload_for`;
* the **scheduler** reserves quota for pending Workloads, higher priority first, then older first
  (BestEffortFIFO/StrictFIFO), against the ClusterQueue's ``nominalQuota`` summed over its flavors,
  less what admitted, unfinished Workloads use; a Workload that does not fit keeps
  ``QuotaReserved=False``, reason ``Pending``, with the flavor assigner's message
  (``scheduler/flavorassigner``: ``couldn't assign flavors to pod set main: insufficient unused quota
  for nvidia.com/gpu in flavor default-flavor, 8 more needed``, ``insufficient quota for ... >
  maximum capacity (8)`` when it could never fit, ``resource X unavailable in ClusterQueue`` when the
  queue does not cover it); a missing LocalQueue or ClusterQueue makes it ``Inadmissible``
  (``LocalQueue <name> doesn't exist``, the workload controller's words): :func:`schedule`;
* **admission checks** (the ClusterQueue's ``spec.admissionChecks``, or v1beta2's
  ``admissionChecksStrategy.admissionChecks[].name``): each check is listed ``Pending`` in
  ``status.admissionChecks`` as soon as the Workload waits in a ClusterQueue, before its quota is reserved,
  and keeps its state and time until it changes (``_with_checks``); the Workload is ``Admitted`` only
  when every check is ``Ready``; ``Retry`` gives the quota back and the checks start again at ``Pending``; ``Rejected``
  deactivates the Workload (``spec.active: false``, ``Evicted``, reason ``InactiveWorkload``). The
  checks' controller (here, the operator) writes their states; this only reads them;
* a ClusterQueue whose admission checks are missing, or not ``Active`` (the condition each check's
  controller keeps ``True``), is **inactive** and admits nothing: ``Active=False`` in its status with
  Kueue's reason and message, its pending Workloads ``Inadmissible`` (``ClusterQueue <name> is
  inactive``): :func:`inactive_reason`, :func:`cluster_queue_status`;
* the Job reconciler **unsuspends** a Job whose Workload is admitted, and **finishes** the Workload
  (``Finished=True``) of a finished Job, which frees its quota: :func:`job_action`. Unsuspending, it
  merges every check's ``podSetUpdates`` into the Job's pod template, additive only (a key already set
  to another value fails the start for good: the Workload finishes, ``FailedToStart``); suspending, it
  restores the template the Workload was made from: :func:`start_patch`, :func:`stop_patch`.

Not simulated: cohorts, borrowing, preemption, ``waitForPodsReady``, partial admission, fair sharing,
topology-aware scheduling, flavors beyond quota (no node selectors or tolerations are injected, missing
ResourceFlavors do not make a ClusterQueue inactive), more than one flavor per resource as a choice
(their quotas are summed), LimitRanges and pod overhead, ``manageJobsWithoutQueueName``, stopped queues
(``stopPolicy``), the LocalQueue and ClusterQueue status counters, ``StrictFIFO``'s head-of-line blocking
(every queue is served as ``BestEffortFIFO``: a Workload that does not fit does not hold back smaller
ones behind it), the Workload webhook's checks of ``podSetUpdates`` (a pod set name the Workload lacks,
invalid label or annotation keys: the local API server stores any status).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from compilecache.cache.units import parse_quantity

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS = f"{API_VERSION}/workloads"
LOCAL_QUEUES = f"{API_VERSION}/localqueues"
CLUSTER_QUEUES = f"{API_VERSION}/clusterqueues"
ADMISSION_CHECKS = f"{API_VERSION}/admissionchecks"
PRIORITY_CLASSES = f"{API_VERSION}/workloadpriorityclasses"

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODSET_LABEL = "kueue.x-k8s.io/podset"  # constants.PodSetLabel: set on the template at start, gone at stop
# The batch/v1 Job controller's own template labels: Kueue keeps them when it restores a template
# (jobs/job ``ManagedLabels``, ``RestorePodSetsInfo``).
JOB_MANAGED_LABELS = (
    "job-name",
    "controller-uid",
    "batch.kubernetes.io/job-name",
    "batch.kubernetes.io/controller-uid",
)
FAILED_TO_START = "FailedToStart"  # jobframework.FailedToStartFinishedReason
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
MAIN = "main"  # kueue.DefaultPodSetName: a batch/v1 Job has one pod set
HASH_LENGTH = 5  # jobframework/workload_names.go
MAX_NAME = 253  # longMaxWorkloadNameLength: a CRD object's name is a DNS subdomain
# Extended resources have no overcommit: the API server defaults their requests to their limits, and
# Kueue reads requests (``resources.NewRequests`` on the pod spec as stored). Every resource given only
# a limit gets that limit as its request (core/v1 defaulting, "Resource Management for Pods").
_CHECK_STATES = ("Pending", "Ready", "Retry", "Rejected")


def queue_name(obj: Mapping[str, Any]) -> str:
    """The object's LocalQueue (its ``kueue.x-k8s.io/queue-name`` label), or ``""``."""
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or "")


def suspend_on_create(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job as Kueue's mutating webhook lets it be created: suspended when it names a queue."""
    admitted = copy.deepcopy(dict(job))
    if queue_name(job):
        admitted.setdefault("spec", {})["suspend"] = True
    return admitted


def workload_name(job_name: str, job_uid: str) -> str:
    """The Workload's name for a batch/v1 Job (``GetWorkloadNameForOwnerWithGVK``)."""
    digest = hashlib.sha1(f"Job\nbatch\n{job_name}\n{job_uid}".encode(), usedforsecurity=False).hexdigest()
    return f"{f'job-{job_name}'[: MAX_NAME - 1 - HASH_LENGTH]}-{digest[:HASH_LENGTH]}"


def workload_for(job: Mapping[str, Any], priority_classes: Mapping[str, int]) -> dict[str, Any]:
    """The Workload Kueue's Job integration makes for ``job`` (``priority_classes``: name → value)."""
    meta, spec = job["metadata"], job.get("spec") or {}
    count = spec.get("parallelism")
    workload_spec: dict[str, Any] = {
        "queueName": queue_name(job),
        "podSets": [
            {"name": MAIN, "count": int(count) if count is not None else 1, "template": spec.get("template") or {}}
        ],
        "active": True,
    }
    priority_class = ((meta.get("labels") or {}).get(PRIORITY_LABEL)) or ""
    if priority_class and priority_class in priority_classes:
        workload_spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority_class}
        workload_spec["priority"] = priority_classes[priority_class]
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "labels": {JOB_UID_LABEL: meta["uid"]},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": workload_spec,
    }


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    amounts: dict[str, Decimal] = {}
    for name, value in merged.items():
        try:
            amounts[str(name)] = parse_quantity(value)
        except ValueError:  # the API server refuses such a pod spec; here it asks for nothing
            continue
    return amounts


def pod_requests(template: Mapping[str, Any]) -> dict[str, Decimal]:
    """One pod's requests: the sum over its containers, at least each init container's (``resource.PodRequests``)."""
    spec = template.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def workload_requests(workload: Mapping[str, Any]) -> dict[str, dict[str, Decimal]]:
    """Each pod set's total requests (one pod's × ``count``), by pod set name."""
    usage: dict[str, dict[str, Decimal]] = {}
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        count = Decimal(int(pod_set.get("count") or 0))
        usage[str(pod_set.get("name") or MAIN)] = {
            name: amount * count for name, amount in pod_requests(pod_set.get("template") or {}).items()
        }
    return usage


def quotas(cluster_queue: Mapping[str, Any]) -> dict[str, tuple[str, Decimal]]:
    """Resource → (its first flavor's name, ``nominalQuota`` summed over the flavors that cover it)."""
    result: dict[str, tuple[str, Decimal]] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                try:
                    amount = parse_quantity(resource.get("nominalQuota", 0))
                except ValueError:
                    continue
                name = str(resource.get("name"))
                first, total = result.get(name, (str(flavor.get("name")), Decimal(0)))
                result[name] = (first, total + amount)
    return result


def check_names(cluster_queue: Mapping[str, Any]) -> list[str]:
    """The admission checks a ClusterQueue asks for: ``spec.admissionChecks`` and ``admissionChecksStrategy``."""
    spec = cluster_queue.get("spec") or {}
    names = [str(name) for name in spec.get("admissionChecks") or []]
    for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []:
        if rule.get("name") and rule["name"] not in names:
            names.append(str(rule["name"]))
    return names


def format_quantity(resource: str, amount: Decimal) -> str:
    """An amount as ``resource.Quantity`` prints it, closely enough: ``8``, ``500m``, ``1Gi``."""
    if amount != amount.to_integral_value():
        return f"{int((amount * 1000).to_integral_value())}m"
    whole = int(amount)
    if resource in ("memory", "ephemeral-storage") and whole:
        for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if whole % size == 0:
                return f"{whole // size}{suffix}"
    return str(whole)


def fit(
    requests: Mapping[str, Mapping[str, Decimal]],
    quota: Mapping[str, tuple[str, Decimal]],
    used: Mapping[str, Decimal],
) -> str | None:
    """Why ``requests`` (by pod set) do not fit ``quota`` less ``used``, in the flavor assigner's words, or ``None``."""
    assumed: dict[str, Decimal] = {}  # earlier pod sets of the same Workload
    for pod_set, wanted in requests.items():
        for resource, amount in sorted(wanted.items()):
            if amount <= 0:
                continue  # a zero request needs no quota (flavorassigner: "zero resource request")
            if resource not in quota:
                return f"couldn't assign flavors to pod set {pod_set}: resource {resource} unavailable in ClusterQueue"
            flavor, nominal = quota[resource]
            before = assumed.get(resource, Decimal(0))
            total = before + amount
            if total > nominal:
                return (
                    f"couldn't assign flavors to pod set {pod_set}: insufficient quota for {resource} in flavor "
                    f"{flavor}, previously considered podsets requests ({format_quantity(resource, before)}) + "
                    f"current podset request ({format_quantity(resource, amount)}) > maximum capacity "
                    f"({format_quantity(resource, nominal)})"
                )
            available = nominal - used.get(resource, Decimal(0))
            if total > available:
                return (
                    f"couldn't assign flavors to pod set {pod_set}: insufficient unused quota for {resource} in "
                    f"flavor {flavor}, {format_quantity(resource, total - available)} more needed"
                )
        for resource, amount in wanted.items():
            assumed[resource] = assumed.get(resource, Decimal(0)) + amount
    return None


def condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    """The condition of that type, or ``None``."""
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(workload: Mapping[str, Any], type_: str) -> bool:
    """Whether the Workload's condition ``type_`` is ``True``."""
    found = condition((workload.get("status") or {}).get("conditions") or [], type_)
    return found is not None and found.get("status") == "True"


def holds_quota(workload: Mapping[str, Any]) -> bool:
    """Whether the Workload holds quota: reserved, not finished, active."""
    active = (workload.get("spec") or {}).get("active", True) is not False
    return active and is_true(workload, "QuotaReserved") and not is_true(workload, "Finished")


def usage(workload: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the Workload takes from its ClusterQueue, all pod sets together."""
    total: dict[str, Decimal] = {}
    for wanted in workload_requests(workload).values():
        for resource, amount in wanted.items():
            total[resource] = total.get(resource, Decimal(0)) + amount
    return total


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> list[dict[str, Any]]:
    """``conditions`` with ``type_`` set (``meta.SetStatusCondition``: the transition time moves only on a change)."""
    old = condition(conditions, type_)
    stamp = old.get("lastTransitionTime") if old is not None and old.get("status") == status else now
    new = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp or now,
        "observedGeneration": generation,
    }
    return [*(dict(c) for c in conditions if c.get("type") != type_), new]


@dataclass
class Queues:
    """What the scheduler reads besides the Workloads: LocalQueues by (namespace, name), ClusterQueues and
    AdmissionChecks by name."""

    local: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    cluster: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def inactive_reason(
    cluster_queue: Mapping[str, Any], checks: Mapping[str, Mapping[str, Any]]
) -> tuple[str, str] | None:
    """Why a ClusterQueue admits nothing, as Kueue's ``Active=False`` says it (reason, message); ``None``: active.

    Kueue's cache (``clusterQueue.updateWithAdmissionChecks``, ``inactiveReason``) finds the checks the
    queue lists that do not exist, then those whose ``Active`` condition is not ``True`` (an
    AdmissionCheck is active only once its controller says so), each list sorted and joined by commas; the
    reason is the first that applies, the message all of them: ``Can't admit new workloads: references
    missing AdmissionCheck(s): a,b, references inactive AdmissionCheck(s): c.``
    """
    names = check_names(cluster_queue)
    missing = sorted(name for name in names if name not in checks)
    inactive = sorted(name for name in names if name in checks and not is_true(checks[name], "Active"))
    reasons: list[str] = []
    messages: list[str] = []
    if missing:
        reasons.append("AdmissionCheckNotFound")
        messages.append(f"references missing AdmissionCheck(s): {','.join(missing)}")
    if inactive:
        reasons.append("AdmissionCheckInactive")
        messages.append(f"references inactive AdmissionCheck(s): {','.join(inactive)}")
    if not reasons:
        return None
    return reasons[0], f"Can't admit new workloads: {', '.join(messages)}."


def cluster_queue_status(
    cluster_queue: Mapping[str, Any], checks: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, Any] | None:
    """The ClusterQueue's status with its ``Active`` condition as Kueue writes it; ``None``: unchanged.

    Active: reason ``Ready``, ``Can admit new workloads`` (``inactiveReason``'s words).
    """
    why = inactive_reason(cluster_queue, checks)
    status, (reason, message) = ("True", ("Ready", "Can admit new workloads")) if why is None else ("False", why)
    old = dict(cluster_queue.get("status") or {})
    generation = int((cluster_queue.get("metadata") or {}).get("generation") or 1)
    new = {
        **old,
        "conditions": set_condition(old.get("conditions") or [], "Active", status, reason, message, now, generation),
    }
    return None if new == old else new


def _order(workload: Mapping[str, Any]) -> tuple[int, str, str]:
    meta = workload["metadata"]
    priority = int((workload.get("spec") or {}).get("priority") or 0)
    return (-priority, str(meta.get("creationTimestamp") or ""), str(meta.get("name")))


def _no_reservation(conditions: Sequence[Mapping[str, Any]], now: str, generation: int) -> list[dict[str, Any]]:
    """``Admitted=False`` as Kueue writes it once a Workload's quota reservation is gone."""
    return set_condition(
        conditions, "Admitted", "False", "NoReservation", "The workload has no reservation", now, generation
    )


def _pending_status(
    workload: Mapping[str, Any], reason: str, message: str, now: str, status: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    old = dict(workload.get("status") or {}) if status is None else dict(status)
    generation = int(workload["metadata"].get("generation") or 1)
    conditions = set_condition(old.get("conditions") or [], "QuotaReserved", "False", reason, message, now, generation)
    old.pop("admission", None)
    return {**old, "conditions": conditions}


def schedule(workloads: Sequence[Mapping[str, Any]], queues: Queues, now: str) -> dict[tuple[str, str], dict[str, Any]]:
    """One pass of Kueue's workload controller and scheduler (pure): (namespace, name) → the Workload's new status.

    Only Workloads whose status changes are in the answer; a Workload that is finished or inactive is
    left as it is, and one already admitted keeps its admission while its checks stay ``Ready``.
    """
    changed: dict[tuple[str, str], dict[str, Any]] = {}
    used: dict[str, dict[str, Decimal]] = {}  # ClusterQueue → usage of the Workloads that hold quota there
    for workload in workloads:
        if holds_quota(workload):
            cq = str(((workload.get("status") or {}).get("admission") or {}).get("clusterQueue") or "")
            for resource, amount in usage(workload).items():
                used.setdefault(cq, {})[resource] = used.setdefault(cq, {}).get(resource, Decimal(0)) + amount

    def key(workload: Mapping[str, Any]) -> tuple[str, str]:
        return (str(workload["metadata"].get("namespace")), str(workload["metadata"]["name"]))

    for workload in sorted(workloads, key=_order):
        if is_true(workload, "Finished") or (workload.get("spec") or {}).get("active", True) is False:
            continue
        status = workload.get("status") or {}
        if holds_quota(workload):
            new = _checks_pass(workload, now)
            if new is not None:
                if not is_true({"status": new}, "QuotaReserved"):  # Retry/Rejected: the quota goes back
                    cq = str((status.get("admission") or {}).get("clusterQueue") or "")
                    for resource, amount in usage(workload).items():
                        used[cq][resource] -= amount
                changed[key(workload)] = new
            continue
        namespace = str(workload["metadata"].get("namespace"))
        queue = str((workload.get("spec") or {}).get("queueName") or "")
        local = queues.local.get((namespace, queue))
        if local is None:
            new = _pending_status(workload, "Inadmissible", f"LocalQueue {queue} doesn't exist", now)
        elif (cq_name := str((local.get("spec") or {}).get("clusterQueue") or "")) not in queues.cluster:
            new = _pending_status(workload, "Inadmissible", f"ClusterQueue {cq_name} doesn't exist", now)
        elif inactive_reason(queues.cluster[cq_name], queues.checks) is not None:
            # The workload controller's words for a Workload without quota whose ClusterQueue is inactive; one
            # already holding quota keeps it (Kueue stops nothing running when a check goes inactive).
            new = _pending_status(workload, "Inadmissible", f"ClusterQueue {cq_name} is inactive", now)
        else:
            cluster_queue = queues.cluster[cq_name]
            why = fit(workload_requests(workload), quotas(cluster_queue), used.get(cq_name, {}))
            if why is not None:
                new = _pending_status(workload, "Pending", why, now)
                new = _with_checks(new, check_names(cluster_queue), now)
            else:
                new = _reserve(workload, cq_name, cluster_queue, now)
                for resource, amount in usage(workload).items():
                    used.setdefault(cq_name, {})[resource] = used.setdefault(cq_name, {}).get(resource, 0) + amount
        if new != status:
            changed[key(workload)] = new
    return changed


def _reserve(workload: Mapping[str, Any], cq_name: str, cluster_queue: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status of a Workload that gets its quota: ``QuotaReserved``, ``admission``, its checks ``Pending``."""
    generation = int(workload["metadata"].get("generation") or 1)
    status = dict(workload.get("status") or {})
    flavors = quotas(cluster_queue)
    counts = {str(p.get("name") or MAIN): int(p.get("count") or 0) for p in workload["spec"].get("podSets") or []}
    status["admission"] = {
        "clusterQueue": cq_name,
        "podSetAssignments": [
            {
                "name": name,
                "flavors": {r: flavors[r][0] for r, amount in wanted.items() if amount > 0 and r in flavors},
                "resourceUsage": {r: format_quantity(r, amount) for r, amount in wanted.items()},
                "count": counts.get(name, 0),
            }
            for name, wanted in workload_requests(workload).items()
        ],
    }
    message = f"Quota reserved in ClusterQueue {cq_name}"
    status["conditions"] = set_condition(
        status.get("conditions") or [], "QuotaReserved", "True", "QuotaReserved", message, now, generation
    )
    status = _with_checks(status, check_names(cluster_queue), now)
    return _checks_pass({**workload, "status": status}, now) or status


def _with_checks(status: Mapping[str, Any], names: Sequence[str], now: str) -> dict[str, Any]:
    """``status`` with ``admissionChecks`` listing the ClusterQueue's checks: an entry already there stays as it
    is (its state and its time), a missing one is added ``Pending`` now, one the queue no longer lists goes.

    Kueue's workload controller does this for a Workload whose ClusterQueue it knows, whether or not its quota
    is reserved yet (``reconcileSyncAdmissionChecks``, run before the quota is looked at, and
    ``workload.SyncAdmittedCondition``'s ``syncAdmissionCheckConditions``: a new check is stamped with the
    time it was added); so a check can be ``Pending`` long before the Workload holds quota.
    """
    new = dict(status)
    old = {str(c.get("name")): dict(c) for c in status.get("admissionChecks") or []}
    checks = [
        old.get(name) or {"name": name, "state": "Pending", "message": "", "lastTransitionTime": now} for name in names
    ]
    if checks:
        new["admissionChecks"] = checks
    else:
        new.pop("admissionChecks", None)
    return new


def _checks_pass(workload: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """The status of a Workload holding quota after reading its checks' states; ``None``: unchanged.

    All ``Ready``: ``Admitted=True``. A ``Rejected``: quota released, ``Evicted`` with reason
    ``InactiveWorkload`` (the caller writes ``spec.active: false``: :func:`is_rejected`). A ``Retry``: quota
    released, every check back to ``Pending``, queued again. Otherwise ``Admitted=False``,
    ``UnsatisfiedChecks``. The ClusterQueue's list of checks is read once, when quota is reserved.
    """
    status = dict(workload.get("status") or {})
    generation = int(workload["metadata"].get("generation") or 1)
    checks = [dict(c) for c in status.get("admissionChecks") or []]
    states = [str(c.get("state")) for c in checks]
    conditions = status.get("conditions") or []
    if "Rejected" in states:
        rejected = next(c for c in checks if c.get("state") == "Rejected")
        message = (
            f"The workload is deactivated due to AdmissionCheck {rejected.get('name')}: {rejected.get('message') or ''}"
        )
        status = _pending_status(workload, "Pending", "The workload is deactivated", now, status)
        status["conditions"] = set_condition(
            status["conditions"], "Evicted", "True", "InactiveWorkload", message, now, generation
        )
        status["conditions"] = _no_reservation(status["conditions"], now, generation)
    elif "Retry" in states:
        status = _pending_status(
            workload, "Pending", "The workload is requeued after an AdmissionCheck Retry", now, status
        )
        status["admissionChecks"] = [
            {**c, "state": "Pending", "message": "", "lastTransitionTime": now} for c in checks
        ]
        status["conditions"] = _no_reservation(status["conditions"], now, generation)
    elif all(state == "Ready" for state in states):
        status["conditions"] = set_condition(
            conditions, "Admitted", "True", "Admitted", "The workload is admitted", now, generation
        )
    else:
        status["conditions"] = set_condition(
            conditions,
            "Admitted",
            "False",
            "UnsatisfiedChecks",
            "The workload has not all checks ready",
            now,
            generation,
        )
    return None if status == (workload.get("status") or {}) else status


def is_rejected(workload: Mapping[str, Any]) -> bool:
    """Whether a check rejected the Workload (it is to be deactivated: ``spec.active: false``)."""
    evicted = condition((workload.get("status") or {}).get("conditions") or [], "Evicted")
    return evicted is not None and evicted.get("status") == "True" and evicted.get("reason") == "InactiveWorkload"


def job_action(job: Mapping[str, Any], workload: Mapping[str, Any] | None) -> str | None:
    """What Kueue's Job reconciler does to ``job`` now (pure): ``"unsuspend"``, ``"suspend"`` or ``None``.

    The writes that do it: :func:`start_patch` and :func:`stop_patch`.
    """
    suspended = bool((job.get("spec") or {}).get("suspend"))
    if workload is None:
        return None
    admitted = is_true(workload, "Admitted") and holds_quota(workload)
    if suspended and admitted:
        return "unsuspend"
    if not suspended and not admitted and not is_true(workload, "Finished"):
        return "suspend"  # evicted, or not yet admitted: Kueue stops the Job (its pods go)
    return None


class CannotStart(ValueError):
    """Kueue cannot start the Job, for good (``podset.IsPermanent``): the message is Kueue's error."""


@dataclass(frozen=True)
class PodSetInfo:
    """What Kueue writes into a pod template at start and restores at stop (``podset.PodSetInfo``)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    scheduling_gates: Sequence[Mapping[str, Any]] = ()


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def info_from_update(update: Mapping[str, Any]) -> PodSetInfo:
    """A check's ``podSetUpdates[]`` entry as Kueue reads it (``podset.FromUpdate``)."""
    return PodSetInfo(
        labels=_strings(update.get("labels")),
        annotations=_strings(update.get("annotations")),
        node_selector=_strings(update.get("nodeSelector")),
        tolerations=_items(update.get("tolerations")),
    )


def info_from_template(template: Mapping[str, Any]) -> PodSetInfo:
    """A pod template's part that Kueue may change (``podset.FromPodSet``)."""
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    return PodSetInfo(
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        node_selector=_strings(spec.get("nodeSelector")),
        tolerations=_items(spec.get("tolerations")),
        scheduling_gates=_items(spec.get("schedulingGates")),
    )


def merge_info(first: PodSetInfo, then: PodSetInfo) -> PodSetInfo:
    """``then`` added to ``first``, additive only (``PodSetInfo.Merge``); :class:`CannotStart` on a conflict.

    A key both set to different values is a conflict, checked annotations, labels, then nodeSelector
    (``utilmaps.HaveConflict``; Kueue names whichever conflicting key Go's map order gives first, this the
    first in sorted order); nothing is overwritten. Tolerations and scheduling gates are appended unless
    already there.
    """
    for name, old, new in (
        ("annotations", first.annotations, then.annotations),
        ("labels", first.labels, then.labels),
        ("nodeSelector", first.node_selector, then.node_selector),
    ):
        clash = next((key for key in sorted(old) if key in new and old[key] != new[key]), None)
        if clash is not None:
            raise CannotStart(
                f"invalid admission check PodSetUpdate: conflict for {name}: "
                f"conflict for key={clash}, value1={old[clash]}, value2={new[clash]}"
            )
    return PodSetInfo(
        labels={**then.labels, **first.labels},
        annotations={**then.annotations, **first.annotations},
        node_selector={**then.node_selector, **first.node_selector},
        tolerations=[*first.tolerations, *(t for t in then.tolerations if t not in first.tolerations)],
        scheduling_gates=[
            *first.scheduling_gates,
            *(g for g in then.scheduling_gates if g not in first.scheduling_gates),
        ],
    )


def admitted_info(workload: Mapping[str, Any]) -> PodSetInfo:
    """What Kueue puts into a batch/v1 Job's template at start (``getPodSetsInfoFromStatus``).

    The ``kueue.x-k8s.io/podset`` label, then each check's ``podSetUpdates`` for the pod set, in the order
    of ``status.admissionChecks`` (the first update of a check naming the pod set counts). A conflict
    between two checks names the later one: ``in admission check "<name>": ...``.
    """
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    if len(assignments) != 1:  # a Job has one pod set; Kueue's words, its arguments swapped as in its source
        raise CannotStart(f"invalid podset infos: expecting {len(assignments)} podset, got 1")
    name = str(assignments[0].get("name") or MAIN)
    info = PodSetInfo(labels={PODSET_LABEL: name})
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        update = next((u for u in _items(check.get("podSetUpdates")) if u.get("name") == name), None)
        if update is not None:
            try:
                info = merge_info(info, info_from_update(update))
            except CannotStart as exc:
                raise CannotStart(f'in admission check "{check.get("name")}": {exc}') from None
    return info


def _template_patch(template: Mapping[str, Any], info: PodSetInfo) -> dict[str, Any]:
    """A merge patch that makes ``template`` carry exactly ``info`` (a key it drops is written ``null``)."""
    old = info_from_template(template)

    def mapping(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str | None] | None:
        if dict(before) == dict(after):
            return None
        return {**{key: None for key in before if key not in after}, **after}

    def listing(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[Any] | None:
        return None if list(before) == list(after) else [dict(item) for item in after]

    meta = {
        key: value
        for key, value in (
            ("labels", mapping(old.labels, info.labels)),
            ("annotations", mapping(old.annotations, info.annotations)),
        )
        if value is not None
    }
    spec = {
        key: value
        for key, value in (
            ("nodeSelector", mapping(old.node_selector, info.node_selector)),
            ("tolerations", listing(old.tolerations, info.tolerations)),
            ("schedulingGates", listing(old.scheduling_gates, info.scheduling_gates)),
        )
        if value is not None
    }
    return {**({"metadata": meta} if meta else {}), **({"spec": spec} if spec else {})}


def start_patch(job: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that starts an admitted ``job``: unsuspended, its template merged with :func:`admitted_info`.

    Kueue's ``startJob`` → batch/v1 ``Job.RunWithPodSetsInfo`` → ``podset.Merge``: the template's own
    values come first, so an update that sets a key the template has to another value fails
    (:class:`CannotStart`; Kueue then finishes the Workload, reason ``FailedToStart``). One write, as
    Kueue's: the Job API lets a template's labels, annotations, nodeSelector and tolerations change only
    while the Job is suspended and never started (KEP-2926), which it is until this very patch.
    """
    template = (job.get("spec") or {}).get("template") or {}
    merged = merge_info(info_from_template(template), admitted_info(workload))
    body: dict[str, Any] = {"suspend": False}
    if changes := _template_patch(template, merged):
        body["template"] = changes
    return {"spec": body}


def stop_patch(job: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that stops ``job``: suspended, its template back to the Workload's pod set.

    Kueue's ``Job.Stop`` with ``RestorePodSetsInfo`` (``podset.RestorePodSpec``) from the Workload's
    ``spec.podSets`` (``GetPodSetsInfoFromWorkload``), keeping the Job controller's own labels. Kueue
    writes it in three steps (suspend with the ``kueue.x-k8s.io/stopping`` annotation, clear
    ``status.startTime``, restore) because of the Job API's rule above; the local API server does not
    check that rule, and its Job controller clears ``startTime`` of a suspended Job itself, so one patch.
    """
    template = (job.get("spec") or {}).get("template") or {}
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    body: dict[str, Any] = {"suspend": True}
    if pod_sets:
        original = info_from_template(pod_sets[0].get("template") or {})
        current = info_from_template(template).labels
        kept = {key: current[key] for key in JOB_MANAGED_LABELS if key in current}
        restored = PodSetInfo(
            labels={**original.labels, **kept},
            annotations=original.annotations,
            node_selector=original.node_selector,
            tolerations=original.tolerations,
            scheduling_gates=original.scheduling_gates,
        )
        if changes := _template_patch(template, restored):
            body["template"] = changes
    return {"spec": body}


def failed_to_start_status(workload: Mapping[str, Any], message: str, now: str) -> dict[str, Any]:
    """The Workload's status once its Job cannot start for good: ``Finished=True``, ``FailedToStart``, Kueue's error.

    The reconciler's answer to a permanent ``startJob`` error (``podset.IsPermanent``: "no point to
    retry"); finished, the Workload frees its quota and the Job stays suspended.
    """
    generation = int(workload["metadata"].get("generation") or 1)
    status = dict(workload.get("status") or {})
    status["conditions"] = set_condition(
        status.get("conditions") or [], "Finished", "True", FAILED_TO_START, message, now, generation
    )
    return status


def finished_status(workload: Mapping[str, Any], job: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """The Workload's status once its Job finished (``Finished=True``); ``None`` if already so or not finished."""
    if is_true(workload, "Finished"):
        return None
    job_conditions = (job.get("status") or {}).get("conditions") or []
    failed = condition(job_conditions, "Failed")
    complete = condition(job_conditions, "Complete")
    if complete is not None and complete.get("status") == "True":
        reason, message = "Succeeded", "Job finished successfully"
    elif failed is not None and failed.get("status") == "True":
        reason, message = "Failed", str(failed.get("message") or "Job failed")
    else:
        return None
    generation = int(workload["metadata"].get("generation") or 1)
    status = dict(workload.get("status") or {})
    status["conditions"] = set_condition(
        status.get("conditions") or [], "Finished", "True", reason, message, now, generation
    )
    return status


def by_uid(workloads: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Workloads by the uid of the Job that controls them."""
    owned: dict[str, Mapping[str, Any]] = {}
    for workload in workloads:
        for ref in workload["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and ref.get("controller"):
                owned[str(ref.get("uid"))] = workload
    return owned


def priority_values(classes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """WorkloadPriorityClass name → ``value``."""
    values: dict[str, int] = {}
    for item in classes:
        try:
            values[str(item["metadata"]["name"])] = int(item.get("value") or 0)
        except (TypeError, ValueError):
            continue
    return values
