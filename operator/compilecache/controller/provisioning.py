"""Capacity on request: Cluster Autoscaler's ProvisioningRequests for warm-up Jobs (pure functions, no I/O).

With ``spec.warmup.provisioningRequest`` a warm-up Job does not wait for a node as a pending pod: the
operator asks Cluster Autoscaler for the whole Job's capacity first, as batch systems do (Kueue's
ProvisioningRequest admission check is the model). For each Job it makes, named like the Job:

* a ``v1`` PodTemplate holding the Job's pod template: what the request's pod set points at (the
  autoscaler reads a pod set's scheduling fields from it);
* a ProvisioningRequest (``autoscaling.x-k8s.io/v1``) of the cache's class, asking for ``hosts`` such pods;
* the Job itself, created suspended, its pods annotated to consume the request
  (``autoscaling.x-k8s.io/consume-provisioning-request``, ``.../provisioning-class-name``: the keys of
  Cluster Autoscaler's ``apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go``).

A pass reads the requests of the cache (a list by label, only for a cache that asks for them) and
decides: ``Provisioned=True`` lifts the Job's ``suspend`` (the Job controller starts its pods; the
``activeDeadlineSeconds`` clock starts then too, the Job API resets it on resume); ``Failed=True`` fails
the pool with the request's reason; otherwise the pool waits (``WaitingForCapacity``), its message the
request's conditions, until ``capacityTimeout`` after the request was made. A request (and its
PodTemplate) lives while its Job waits or runs: a finished or superseded Job's are deleted. A
disruption that takes a provisioned node (a spot reclaim) leaves the Job's retry consuming a request
whose capacity is gone, and a consuming pod triggers no ordinary scale-up: the request is deleted and
made again (:func:`lost`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache.controller import jobs, podstate, status
from compilecache.controller.api import Provisioning

CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
PROVISIONED = "Provisioned"
FAILED = "Failed"
# The pool's reason when the autoscaler gave up on the request (its own reason is in the message).
PROVISIONING_FAILED = "ProvisioningFailed"
# The pool's reason when the API refused the request (e.g. 404: Cluster Autoscaler's CRD is not installed).
REQUEST_REJECTED = "ProvisioningRequestRejected"


def suspended(job: Mapping[str, Any], provisioning: Provisioning) -> dict[str, Any]:
    """The warm-up Job as created when its capacity is asked for: suspended, its pods consuming the request."""
    manifest = copy.deepcopy(dict(job))
    name = manifest["metadata"]["name"]
    manifest["spec"]["suspend"] = True
    template = manifest["spec"]["template"]
    template["metadata"]["annotations"] = {
        **(template["metadata"].get("annotations") or {}),
        CONSUME: name,
        CLASS: provisioning.class_name,
    }
    return manifest


def pod_template(job: Mapping[str, Any]) -> dict[str, Any]:
    """The PodTemplate the Job's request points at: the Job's own pod template, named like the Job."""
    meta = job["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": _meta(meta),
        "template": copy.deepcopy(dict(job["spec"]["template"])),
    }


def request(job: Mapping[str, Any], provisioning: Provisioning, hosts: int) -> dict[str, Any]:
    """The ProvisioningRequest for the Job's ``hosts`` pods, of the cache's class."""
    spec: dict[str, Any] = {
        "provisioningClassName": provisioning.class_name,
        "podSets": [{"podTemplateRef": {"name": job["metadata"]["name"]}, "count": hosts}],
    }
    if provisioning.parameters:
        spec["parameters"] = dict(provisioning.parameters)
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": _meta(job["metadata"]),
        "spec": spec,
    }


def _meta(job_meta: Mapping[str, Any]) -> dict[str, Any]:
    # Labelled with the cache (the pass lists them by it) and owned by it (they go with it).
    return {
        "name": job_meta["name"],
        "namespace": job_meta.get("namespace"),
        "labels": {key: value for key, value in job_meta["labels"].items() if key != jobs.LABEL_HOSTS},
        "ownerReferences": copy.deepcopy(list(job_meta["ownerReferences"])),
    }


def condition(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any]:
    """The request's condition of that type (``{}`` if it has none)."""
    found: Mapping[str, Any] = next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") == type_), {}
    )
    return found


def provisioned(obj: Mapping[str, Any] | None) -> bool:
    """Whether the autoscaler provisioned (or, for check-capacity, found) the request's capacity."""
    return condition(obj, PROVISIONED).get("status") == "True"


def lost(obj: Mapping[str, Any] | None, job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a running Job's provisioned capacity was taken by a disruption: a pod of it was disrupted after
    the request was provisioned, and its retry waits for a node. The request must be made again for the
    retry to get one. (A request made again is provisioned after that disruption: not lost again, while its
    new node comes and the retry is not yet placed.)"""
    found = podstate.disruptions(pods)
    since = str(condition(obj, PROVISIONED).get("lastTransitionTime") or "")
    return (
        provisioned(obj)
        and not is_suspended(job)
        and bool(found)
        and str(found[-1].since or "") >= since
        and podstate.waiting_pod(pods) is not None
    )


def is_suspended(job: Mapping[str, Any]) -> bool:
    """Whether the Job is suspended (``spec.suspend``): it waits for its request."""
    return bool((job.get("spec") or {}).get("suspend"))


def waiting(
    name: str, obj: Mapping[str, Any] | None, job: Mapping[str, Any], now: str | None, capacity_seconds: float
) -> dict[str, Any]:
    """The pool fields of a suspended Job: what its request says, Failed once it failed or waited past the bound."""
    if obj is None:
        message = f"waiting for ProvisioningRequest {name}, which does not exist yet"
        since = str((job.get("metadata") or {}).get("creationTimestamp") or "") or None
    else:
        said = "; ".join(_described(c) for c in (obj.get("status") or {}).get("conditions") or []) or "no answer yet"
        klass = (obj.get("spec") or {}).get("provisioningClassName")
        message = f"waiting for capacity: ProvisioningRequest {name} ({klass}): {said}"
        since = str((obj.get("metadata") or {}).get("creationTimestamp") or "") or None
    message = message[: podstate.MESSAGE_MAX]
    if condition(obj, FAILED).get("status") == "True":
        return {"state": status.POOL_FAILED, "reason": PROVISIONING_FAILED, "message": message}
    # The request waits as a pod waits for a node: the same reason, and the same capacityTimeout from its making.
    return status.problem_fields(podstate.Problem(podstate.WAITING_FOR_CAPACITY, message, since), now, capacity_seconds)


def _described(c: Mapping[str, Any]) -> str:
    text = f"{c.get('type')}={c.get('status')}"
    detail = ": ".join(str(part) for part in (c.get("reason"), c.get("message")) if part)
    return f"{text} ({' '.join(detail.split())[:300]})" if detail else text


def names(objs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The names of these objects."""
    return {str(obj["metadata"]["name"]) for obj in objs}
