"""Observe: what one pass of a CompileCache decides on, read into one value.

A pass is observe → plan → act (``reconcile.py``). This module is the observe step:
:class:`Cache` is the cache as the pass sees it (its object and its parsed spec, or
why the spec does not parse), and :class:`Snapshot` adds everything else the pure
``plan.plan`` needs: the operator's policy, the claim, the object a ``podTemplate.templateRef``
names (``template.py``), the Nodes, the cache's warm-up and expiry Jobs, their pods (a running Job's
pod may be stuck: ``podstate.py``), the headless Services of multi-host warm-ups and the training pods
it gates. :func:`observe` asks a :class:`Reader`: the operator's in-memory indexes
(``indexes.py``), or the API (:class:`ApiReader`). It decides nothing (it asks for the claim only
where the spec names one, and for the Services only where a multi-host warm-up is or was
wanted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from compilecache.controller import expiryjob, gates, images, jobs, podstate, queueing, status, template
from compilecache.controller.api import CacheSpec, Consumers, SpecError, TemplateRef, parse_cache
from compilecache.controller.kube import (
    EVENTS,
    JOBS,
    NODES,
    PODS,
    PROVISIONING_REQUESTS,
    PVCS,
    SERVICES,
    WORKLOADS,
    ApiError,
    Client,
)
from compilecache.controller.policy import DEFAULT, Policy

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Cache:
    """A CompileCache as one pass sees it: the object as read, and its spec parsed or the reason it is not."""

    obj: Obj  # as read: manifests take it for ownerReferences and the rewarm annotation
    spec: CacheSpec | None
    error: SpecError | None = None

    @classmethod
    def read(cls, obj: Obj) -> Cache:
        """Parse the name and spec once; bad input becomes ``error`` (naming the field), never an exception."""
        try:
            return cls(obj, parse_cache(obj))
        except SpecError as exc:
            return cls(obj, None, exc)
        except Exception as exc:  # a parser bug must not take the pass (and the gates) down with it
            return cls(obj, None, SpecError("spec", f"cannot be read ({type(exc).__name__}: {exc})"))

    @property
    def meta(self) -> Obj:
        """The object's metadata."""
        meta: Obj = self.obj.get("metadata") or {}
        return meta

    @property
    def name(self) -> str:
        """The cache's name."""
        return str(self.meta["name"])

    @property
    def namespace(self) -> str | None:
        """The cache's namespace."""
        namespace = self.meta.get("namespace")
        return None if namespace is None else str(namespace)

    @property
    def uid(self) -> str | None:
        """The cache's uid: what its Jobs' ownerReferences name."""
        return self.meta.get("uid")

    @property
    def generation(self) -> int | None:
        """``metadata.generation``: the spec version a status describes."""
        return self.meta.get("generation")

    @property
    def status(self) -> Obj:
        """The status recorded so far (``{}`` for a new cache)."""
        status: Obj = self.obj.get("status") or {}
        return status

    @property
    def consumers(self) -> Consumers:
        """The consumer settings; a spec that does not parse still gets the defaults (and so a gateTimeout)."""
        return self.spec.consumers if self.spec is not None else Consumers()


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass decides on. ``created`` and ``rejected`` record this pass's own creations."""

    cache: Cache
    pods: tuple[Obj, ...] = ()  # training pods labelled with the cache (gated or released)
    claim: Obj | None = None  # the PVC the spec names, if it exists (None too for a GCS cache)
    nodes: tuple[Obj, ...] = ()
    jobs: tuple[Obj, ...] = ()  # warm-up Jobs labelled with the cache
    warmup_pods: tuple[Obj, ...] = ()  # pods of running Jobs (stuck?), failed ones and unreported succeeded ones
    expiry_jobs: tuple[Obj, ...] = ()
    expiry_pods: tuple[Obj, ...] = ()  # the pods of the expiry Jobs (by their job-name label), running ones too
    services: tuple[Obj, ...] = ()  # headless Services of multi-host warm-ups, labelled with the cache
    # Keyed by ``Resource.key`` (``plural/name``): a multi-host Job and its Service share a name.
    created: frozenset[str] = frozenset()  # objects this pass created (or found created: 409)
    rejected: Mapping[str, str] = field(default_factory=dict)  # objects the API refused: key → its message
    policy: Policy = DEFAULT  # the operator's policy (read at start-up): what this cache may make it run
    # The object spec.warmup.podTemplate.templateRef names, if it exists (template.resolve reads it);
    # a TrainJob with its runtime under template.RUNTIME (read_template).
    template: Obj | None = None
    # The Events on the pods that wait for a node (one per Job), by pod uid: what an autoscaler said.
    events: Mapping[str, tuple[Obj, ...]] = field(default_factory=dict)
    # The cache's ProvisioningRequests (read only when spec.warmup.provisioningRequest asks for them).
    requests: tuple[Obj, ...] = ()
    # The Kueue Workloads of its Jobs that wait in a queue (queueing.py), read only for those.
    workloads: tuple[Obj, ...] = ()

    def after(self, created: frozenset[str], rejected: Mapping[str, str]) -> Snapshot:
        """The snapshot with this pass's creations and refusals added: what the next plan decides on."""
        return dataclasses.replace(self, created=self.created | created, rejected={**self.rejected, **rejected})


class Reader(Protocol):
    """The questions a pass asks of the cluster: answered from memory (``indexes.IndexedReader``) or the API."""

    def training_pods(self, namespace: str | None, cache: str) -> tuple[Obj, ...]: ...
    def warmup_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]: ...
    def expiry_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]: ...
    def job_pods(self, namespace: str | None, job: str, finished: bool = False) -> tuple[Obj, ...]: ...
    def services(self, namespace: str | None, cache: str) -> tuple[Obj, ...]: ...
    def nodes(self) -> tuple[Obj, ...]: ...
    def claim(self, namespace: str | None, name: str) -> Obj | None: ...
    def template(self, namespace: str | None, ref: TemplateRef, fresh: bool = False) -> Obj | None: ...
    def pod_events(self, namespace: str | None, pod: Obj) -> tuple[Obj, ...]: ...
    def provisioning_requests(self, namespace: str | None, cache: str) -> tuple[Obj, ...]: ...
    def workloads(self, namespace: str | None, job: Obj) -> tuple[Obj, ...]: ...


@dataclass(frozen=True)
class ApiReader:
    """The answers read from the API server, one list or get each.

    For what the watches cannot have yet (an object another party created since: a 409 on create),
    and for a pass run without the operator's indexes (the tests' and the tools' direct calls).
    """

    client: Client

    def training_pods(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The pods labelled with the cache (by the user or by the webhook)."""
        return tuple(self.client.list(PODS, namespace, labels={jobs.LABEL_CACHE: cache}))

    def warmup_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's warm-up Jobs."""
        return tuple(self.client.list(JOBS, namespace, labels={jobs.LABEL_CACHE: cache}))

    def expiry_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's expiry Jobs."""
        return tuple(self.client.list(JOBS, namespace, labels={expiryjob.LABEL_EXPIRY_OF: cache}))

    def job_pods(self, namespace: str | None, job: str, finished: bool = False) -> tuple[Obj, ...]:
        """The pods of a Job, by the label the Job controller gives them (``finished``: the Job has ended)."""
        return tuple(self.client.list(PODS, namespace, labels={"job-name": job}))

    def services(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's multi-host Services."""
        return tuple(self.client.list(SERVICES, namespace, labels={jobs.LABEL_CACHE: cache}))

    def nodes(self) -> tuple[Obj, ...]:
        """Every Node."""
        return tuple(self.client.list(NODES))

    def claim(self, namespace: str | None, name: str) -> Obj | None:
        """The claim of that name, or ``None``."""
        return self.client.get(PVCS, name, namespace)

    def template(self, namespace: str | None, ref: TemplateRef, fresh: bool = False) -> Obj | None:
        """The object a ``templateRef`` names, or ``None`` (:func:`read_template`; always fresh)."""
        return read_template(self.client, namespace, ref)

    def pod_events(self, namespace: str | None, pod: Obj) -> tuple[Obj, ...]:
        """The Events about a pod (``podstate.EVENTS_READ_MAX`` at most), by the uid they name."""
        return pod_events(self.client, namespace, pod)

    def provisioning_requests(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's ProvisioningRequests (``provisioning.py``), by its label."""
        return provisioning_requests(self.client, namespace, cache)

    def workloads(self, namespace: str | None, job: Obj) -> tuple[Obj, ...]:
        """The Kueue Workload of a queued Job (``queueing.py``), by the label Kueue puts on it."""
        return workloads(self.client, namespace, job)


def read_template(client: Client, namespace: str | None, ref: TemplateRef) -> Obj | None:
    """The object a ``templateRef`` names, by a GET, or ``None``; a TrainJob joined with its runtime
    (``template.join``: a second GET, of the runtime its ``spec.runtimeRef`` names, where its pods' template is)."""
    obj = client.get(template.resource_of(ref), ref.name, namespace)
    runtime = template.runtime_of(ref, obj) if obj is not None else None
    if obj is None or runtime is None:
        return obj
    resource, name = runtime
    return template.join(obj, client.get(resource, name, namespace))


def workloads(client: Client, namespace: str | None, job: Obj) -> tuple[Obj, ...]:
    """The Workload Kueue made for ``job`` (by its ``kueue.x-k8s.io/job-uid`` label), read from the API for a
    queued Job only. Not watched. A cluster without Kueue (404) or an operator not allowed to read them (403:
    the chart's ``kueue.enabled`` is off) has none to show: the pool says it is queued, without Kueue's words."""
    uid = str((job.get("metadata") or {}).get("uid") or "")
    if not uid:
        return ()
    try:
        return tuple(client.list(WORKLOADS, namespace, labels={queueing.JOB_UID: uid}))
    except ApiError as exc:
        if exc.status in (403, 404):
            return ()
        raise


def provisioning_requests(client: Client, namespace: str | None, cache: str) -> tuple[Obj, ...]:
    """The cache's ProvisioningRequests, read from the API: a few, for the caches that opt in; not watched, so
    that clusters without Cluster Autoscaler's CRD (most) need no watch of a kind they do not serve."""
    return tuple(client.list(PROVISIONING_REQUESTS, namespace, labels={jobs.LABEL_CACHE: cache}))


def pod_events(client: Client, namespace: str | None, pod: Obj) -> tuple[Obj, ...]:
    """The Events about ``pod``, read from the API: a pass reads them for a pod that waits for a node only.

    Not watched: a cluster's Events are its busiest kind, and only the few pods waiting for capacity need
    theirs. ``involvedObject.uid`` is one of the Event fields the API server selects on (pkg/registry/core/
    event: ``involvedObject.*``, ``reason``, ``source``, ``type``, ``reportingComponent``).
    """
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    if not uid:
        return ()
    found = client.list(EVENTS, namespace, fields={"involvedObject.uid": uid}, limit=podstate.EVENTS_READ_MAX)
    return tuple(found)


def observe_pods(reader: Reader, cache: Cache) -> tuple[Obj, ...]:
    """The training pods that use the cache (labelled by the user or by the webhook)."""
    return reader.training_pods(cache.namespace, cache.name)


def uses_services(cache: Cache) -> bool:
    """Whether a pass must read the cache's Services: a multi-host topology is wanted, or was (its Services go)."""
    wanted = cache.spec is not None and any(topology.multi_host for topology in cache.spec.warmup.topologies)
    return wanted or any(status.key(pool)[1] > 1 for pool in cache.status.get("pools") or [])


def observe(reader: Reader, cache: Cache, pods: tuple[Obj, ...], policy: Policy = DEFAULT) -> Snapshot:
    """Read the rest of the snapshot. A spec that does not parse needs nothing more: its plan is Failed."""
    if cache.spec is None:
        return Snapshot(cache, pods=pods, policy=policy)
    namespace, name = cache.namespace, cache.name
    claim = reader.claim(namespace, cache.spec.pvc.claim_name) if cache.spec.pvc is not None else None
    expiry_jobs = reader.expiry_jobs(namespace, name)
    expiry_pods: list[Obj] = []
    for job in expiry_jobs:  # one, rarely two (a superseded one not yet deleted)
        # A finished one: what it said; a running one: whether its pod is stuck (podstate.py).
        expiry_pods += reader.job_pods(namespace, job["metadata"]["name"], finished=_finished(job))
    warmup_jobs = reader.warmup_jobs(namespace, name)
    warmup_pods: list[Obj] = []
    recorded = cache.status.get("pools") or []
    for job in warmup_jobs:  # running ones (stuck?), failed ones, and succeeded ones not yet reported
        finished = _finished(job)
        if status.needs_report(job, recorded) or not finished:
            warmup_pods += reader.job_pods(namespace, job["metadata"]["name"], finished=finished)
    events: dict[str, tuple[Obj, ...]] = {}
    for job in (*expiry_jobs, *warmup_jobs):  # what an autoscaler said about a Job's pod that waits for a node
        owned = [pod for pod in (*expiry_pods, *warmup_pods) if _job_of(pod) == job["metadata"]["name"]]
        waiting = podstate.waiting_pod(owned)
        if waiting is not None:
            events[podstate.pod_uid(waiting)] = reader.pod_events(namespace, waiting)
    requests = reader.provisioning_requests(namespace, name) if cache.spec.warmup.provisioning is not None else ()
    queued = [job for job in (*warmup_jobs, *expiry_jobs) if queueing.queued(job)]
    workloads = tuple(workload for job in queued for workload in reader.workloads(namespace, job))
    ref = cache.spec.warmup.template.ref if cache.spec.warmup.template is not None else None
    template_obj = reader.template(namespace, ref) if ref is not None else None
    # A PodTemplate comes from the operator's memory (the other kinds are read from the API each pass).
    if (
        ref is not None
        and ref.kind == "PodTemplate"
        and template_obj is not None
        and _newer_than(template_obj, pods, cache.status)
    ):
        template_obj = reader.template(namespace, ref, fresh=True)
    services = reader.services(namespace, name) if uses_services(cache) else ()
    return Snapshot(
        cache,
        pods=pods,
        claim=claim,
        services=services,
        nodes=reader.nodes(),
        jobs=warmup_jobs,
        warmup_pods=tuple(warmup_pods),
        expiry_jobs=expiry_jobs,
        expiry_pods=tuple(expiry_pods),
        policy=policy,
        template=template_obj,
        events=events,
        requests=requests,
        workloads=workloads,
    )


def _newer_than(template_obj: Obj, pods: Sequence[Obj], recorded: Obj) -> bool:
    """Whether a gated training pod runs an image that neither ``status.images`` records nor the PodTemplate
    (as a watch delivered it) names: training's template may have moved to that image after the
    copy in memory was made, and the pod's own event came first. Such a pass reads the template from the
    API, so that it neither releases the pod cold (``images.UNWARMED_IMAGE``) nor warms the old image."""
    named = set(images.pod_images({"spec": (template_obj.get("template") or {}).get("spec") or {}}))
    warmed = images.recorded(recorded)
    for pod in pods:
        running = images.pod_images(pod)
        if gates.is_gated(pod) and running and images.match(running, warmed) is None and not named & set(running):
            return True
    return False


def _finished(job: Obj) -> bool:
    return status.job_state(job)["state"] in status.FINISHED


def _job_of(pod: Obj) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get("job-name")
