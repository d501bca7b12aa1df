"""Indexes: what a pass reads, kept in memory from one watch per kind, keyed the way passes ask.

A pass (``reconcile.py``) reads a cache's Jobs, their pods, its expiry Jobs, its training pods,
its Services, its claim, a referenced PodTemplate and every Node. Listed from the API, by label
selector, each of these costs the API server a scan of every object of the kind in the
namespace, so N passes cost N² and a fleet restart replays them all at once. Here they come
from kopf's indexes instead (``@kopf.index``, registered in ``handlers.py``): kopf watches each
kind once and calls the functions below for every object it sees; each returns the object's
entries, ``{key: projection}`` (``{}`` for an object the operator does not use), and kopf keeps
them up to date from the watch stream. kopf starts no other handler, and so no pass, before
every index holds its kind's initial listing (kopf's ``processing.py``: the ``operator_indexed``
toggles), so a first pass never mistakes a Job not yet seen for a missing one.

Only the fields passes read are kept (``slim``): a Job without its pod template, a pod without
its containers, a Node without its images and conditions; ``managedFields`` never. That bounds the
memory of a thousand caches, and of a cluster's every pod passing through the pod index.

Readers. :class:`IndexedReader` answers a pass's questions (the ``snapshot.Reader`` protocol)
from these indexes. kopf mutates them in its event loop, and passes run on worker threads;
so a worker never iterates them itself: each question is asked of the loop
(``loop.call_soon_threadsafe``) and answered with a copy. Two reads still reach the API. A
template of a workload kind, a Job, JobSet, LeaderWorkerSet, TrainJob (and its runtime), PyTorchJob
or RayJob (a GET by name, no scan): indexing every Job's pod spec and every object of those kinds in
the cluster, to serve the rare cache that names one, would cost more memory than the point read
costs the API server. And the pods of a finished Job while memory still shows one of
them running: Jobs and pods come by separate watches, and the Job's end may come first.

Staleness. kopf keeps an index entry until it sees the object's DELETED event. When a watch
must start again from a fresh listing (a ``410 Gone`` after a disconnect, or a pause and a
resume), kopf lists anew but never drops the entries of objects deleted in the gap (its
``indexing.py`` has no step like client-go's ``Replace``, which does). So every
``AUDIT_SECONDS`` (jittered), one pass of each cache asks the API the same questions it asked the
indexes (:class:`Audit`), memory first: an object the indexes answered with and the API, asked
after, did not, was deleted, and the reader forgets its uid for good (uids are never reused).
A thousand caches cost some lists every few seconds, not all of them at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from compilecache.controller import checks, expiryjob, images, jobs, kube, reports, snapshot, template
from compilecache.controller.api import TemplateRef
from compilecache.controller.kube import Client, Resource
from compilecache.controller.snapshot import ApiReader

Obj = Mapping[str, Any]
T = TypeVar("T")

# The Job controller makes a Job's pods from its template, so they carry the template's labels (ours:
# jobs.LABEL_WARMUP_OF, expiryjob.LABEL_EXPIRY_OF), and adds job-name and batch.kubernetes.io/job-name
# (kubernetes.io/docs/concepts/workloads/controllers/job, "Job labels"; local/jobrunner.pod_for does the same).
JOB_NAME = "job-name"
# How long a worker waits for the event loop to answer a read: the loop answers at once unless it
# is gone (the operator is stopping), and then the pass must fail, not hang the shutdown.
READ_TIMEOUT_SECONDS = 10.0
AUDIT_SECONDS = 1800.0  # how often each cache's pass checks its answers from memory against the API
FORGOTTEN_LIMIT = 100_000  # uids of deleted objects kopf still indexes; the oldest go first past this

# Keys: (what, namespace, name). ``what`` says which question the entry answers.
WARMUP_JOBS = "warmup-jobs"  # a cache's warm-up Jobs, by the cache's name
EXPIRY_JOBS = "expiry-jobs"  # a cache's expiry Jobs, by the cache's name
TRAINING_PODS = "training-pods"  # the pods labelled with a cache, by the cache's name
JOB_PODS = "job-pods"  # the pods of one of our Jobs, by the Job's name
SERVICES = "services"  # a cache's multi-host Services, by the cache's name
CLAIM = "claim"  # a PersistentVolumeClaim, by its name
POD_TEMPLATE = "pod-template"  # a PodTemplate, by its name
NODES = "nodes"  # every Node, under one key
WAITING_WORKLOADS = "waiting-workloads"  # Kueue Workloads with a Pending admission check, by namespace
OUR_CHECKS = "our-checks"  # the names of the AdmissionChecks the operator serves, under one key

Key = tuple[str, str | None, str | None]


def uid(obj: Obj | None) -> str:
    """An object's uid ("" for none)."""
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _labels(body: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = (body.get("metadata") or {}).get("labels") or {}
    return labels


def _ended(pod: Obj) -> bool:
    """Whether a pod's status says it ended: its phase, or every container terminated."""
    pod_status = pod.get("status") or {}
    containers = pod_status.get("containerStatuses") or []
    return pod_status.get("phase") in reports.FINISHED_PHASES or (
        bool(containers) and all((state.get("state") or {}).get("terminated") for state in containers)
    )


def _namespace(body: Obj) -> str | None:
    namespace = (body.get("metadata") or {}).get("namespace")
    return None if namespace is None else str(namespace)


def slim(body: Obj, *, spec: Callable[[Obj], Obj] | None = None, status: Callable[[Obj], Obj] | None = None) -> Obj:
    """A copy of ``body`` with what passes read: metadata without ``managedFields``, and the parts of
    ``spec`` and ``status`` the functions pick (all of them by default)."""
    meta = {k: copy.deepcopy(v) for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    slim: dict[str, Any] = {k: body[k] for k in ("apiVersion", "kind") if k in body} | {"metadata": meta}
    for part, pick in (("spec", spec), ("status", status)):
        value = body.get(part)
        if value is not None:
            slim[part] = copy.deepcopy(dict(pick(value) if pick is not None else value))
    return slim


def _job_spec(spec: Obj) -> Obj:
    # The pod template is the operator's own manifest, read back by no decision (a plan compares
    # the spec hash in the Job's labels); it is most of a Job's size.
    return {k: v for k, v in spec.items() if k != "template"}


def _pod_spec(spec: Obj) -> Obj:
    # The gates (a release tests the list it read), where the pod runs, and its containers' images (a pod
    # waits only for its own image: images.py); the rest of the containers is the webhook's business,
    # which reads the pod from its admission request, not from here.
    kept = {k: spec[k] for k in ("schedulingGates", "nodeName") if k in spec}
    containers = spec.get("containers")
    if isinstance(containers, list):
        kept["containers"] = [
            {"image": str(c["image"])[: images.IMAGE_MAX + 1]}
            for c in containers[: images.MAX_POD_IMAGES]
            if isinstance(c, Mapping) and "image" in c
        ]
    return kept


def _node_spec(spec: Obj) -> Obj:
    return {k: spec[k] for k in ("unschedulable", "taints") if k in spec}


def _node_status(status: Obj) -> Obj:
    # Pools count a node's allocatable GPUs; its images, conditions and addresses are most of its size.
    return {k: status[k] for k in ("allocatable", "capacity") if k in status}


def slim_job(body: Obj) -> Obj:
    """A Job as passes read it."""
    return slim(body, spec=_job_spec)


# The labels and annotations passes read of objects others make (pods, claims): the operator's own
# and the Job controller's. The rest stays out of memory: a pod's author may write 256 KiB of
# annotations, and every pod labelled with a cache, existing or not, is held.
KEPT_PREFIXES = ("compilecache.dev/", "batch.kubernetes.io/")
KEPT_NAMES = frozenset({JOB_NAME, "controller-uid"})


def _ours(meta: Obj) -> dict[str, Any]:
    kept = dict(meta)
    for where in ("labels", "annotations"):
        values = meta.get(where)
        if isinstance(values, Mapping):  # an absent map stays absent: a release patch tells it from an empty one
            kept[where] = {k: v for k, v in values.items() if k in KEPT_NAMES or k.startswith(KEPT_PREFIXES)}
    return kept


def slim_pod(body: Obj) -> Obj:
    """A pod as passes read it: its gates and node, its status, and of its metadata what is ours."""
    pod = dict(slim(body, spec=_pod_spec))
    pod["metadata"] = _ours(pod["metadata"])
    return pod


def slim_claim(body: Obj) -> Obj:
    """A claim as passes read it: its status, and of its metadata what is ours (an opt-in, an owner)."""
    claim = dict(slim(body))
    claim["metadata"] = _ours(claim["metadata"])
    return claim


def slim_node(body: Obj) -> Obj:
    """A Node as passes read it: its name and labels, whether it takes pods, its GPUs.

    Nothing that its heartbeats change (``resourceVersion``, conditions, annotations, images): two
    Nodes that pools would see the same are equal, so ``handlers.node_changed`` wakes no cache for them.
    """
    node = dict(slim(body, spec=_node_spec, status=_node_status))
    node["metadata"] = {k: v for k, v in node["metadata"].items() if k in ("name", "uid", "labels")}
    return node


def slim_pod_template(body: Obj) -> Obj:
    """A PodTemplate as passes read it: its pod spec is under ``template`` (a PodTemplate has no ``spec``),
    which ``template.pod_spec_of`` reads."""
    kept = dict(slim(body))
    if body.get("template") is not None:
        kept["template"] = copy.deepcopy(dict(body["template"]))
    return kept


def job_entries(body: Obj) -> dict[Key, Obj]:
    """A warm-up Job under its cache, an expiry Job under the cache it expires; other Jobs: none."""
    labels, namespace = _labels(body), _namespace(body)
    entries: dict[Key, Obj] = {}
    if labels.get(jobs.LABEL_CACHE):
        entries[(WARMUP_JOBS, namespace, labels[jobs.LABEL_CACHE])] = slim_job(body)
    if labels.get(expiryjob.LABEL_EXPIRY_OF):
        entries[(EXPIRY_JOBS, namespace, labels[expiryjob.LABEL_EXPIRY_OF])] = slim_job(body)
    return entries


def pod_entries(body: Obj) -> dict[Key, Obj]:
    """A training pod under its cache; a pod of our warm-up or expiry Jobs under its Job; others: none."""
    labels, namespace = _labels(body), _namespace(body)
    entries: dict[Key, Obj] = {}
    ours = labels.get(jobs.LABEL_WARMUP_OF) or labels.get(expiryjob.LABEL_EXPIRY_OF)
    if labels.get(jobs.LABEL_CACHE):
        entries[(TRAINING_PODS, namespace, labels[jobs.LABEL_CACHE])] = slim_pod(body)
    if ours and labels.get(JOB_NAME):
        entries[(JOB_PODS, namespace, labels[JOB_NAME])] = slim_pod(body)
    return entries


def node_entries(body: Obj) -> dict[Key, Obj]:
    """Every Node, under one key: pools are resolved from all of them."""
    return {(NODES, None, None): slim_node(body)} if (body.get("metadata") or {}).get("name") else {}


def claim_entries(body: Obj) -> dict[Key, Obj]:
    """A PersistentVolumeClaim under its name (a cache's spec names its claim)."""
    return {(CLAIM, _namespace(body), str((body.get("metadata") or {}).get("name"))): slim_claim(body)}


def service_entries(body: Obj) -> dict[Key, Obj]:
    """A multi-host warm-up's Service under its cache; other Services: none."""
    cache = _labels(body).get(jobs.LABEL_CACHE)
    return {(SERVICES, _namespace(body), cache): slim(body)} if cache else {}


def pod_template_entries(body: Obj) -> dict[Key, Obj]:
    """A PodTemplate under its name (``podTemplate.templateRef`` may name it)."""
    return {(POD_TEMPLATE, _namespace(body), str((body.get("metadata") or {}).get("name"))): slim_pod_template(body)}


def slim_workload(body: Obj) -> Obj:
    """A Kueue Workload as ``checks.py`` reads it: each pod set's name, template labels (a podSelector may
    match any), containers' images and our annotations, whether its quota is reserved, and its admission
    checks as they are (a check's new state is a patch that tests the entry it read)."""
    meta = body.get("metadata") or {}
    pod_sets = []
    for pod_set in list((body.get("spec") or {}).get("podSets") or ())[: checks.MAX_POD_SETS]:
        template_meta = (pod_set.get("template") or {}).get("metadata") or {}
        kept = {
            "labels": dict(template_meta.get("labels") or {}),
            **_ours({"annotations": template_meta.get("annotations") or {}}),
        }
        # Its containers' images: a pod set waits only for its own image (images.py).
        images_kept = _pod_spec((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []
        pod_sets.append(
            {"name": pod_set.get("name"), "template": {"metadata": kept, "spec": {"containers": images_kept}}}
        )
    status = body.get("status") or {}
    conditions = [c for c in status.get("conditions") or () if c.get("type") == "QuotaReserved"]
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
        "spec": {"podSets": pod_sets},
        "status": {
            "conditions": copy.deepcopy(conditions),
            "admissionChecks": copy.deepcopy(status.get("admissionChecks") or []),
        },
    }


def has_pending_check(body: Obj) -> bool:
    """Whether some admission check of a Workload is Pending (whoever's: the AdmissionChecks say which are ours)."""
    return any(check.get("state") == "Pending" for check in (body.get("status") or {}).get("admissionChecks") or ())


def workload_entries(body: Obj) -> dict[Key, Obj]:
    """A Workload some of whose admission checks are Pending, under its namespace; others: none (most
    Workloads, admitted or queued without quota, are no business of ours)."""
    return {(WAITING_WORKLOADS, _namespace(body), None): slim_workload(body)} if has_pending_check(body) else {}


def our_check_names(index: Mapping[Key, Any]) -> frozenset[str]:
    """The names in the index of our AdmissionChecks (:func:`admission_check_entries`); read in kopf's loop."""
    return frozenset(str(entry["name"]) for entry in index.get((OUR_CHECKS, None, None), ()))


def admission_check_entries(body: Obj) -> dict[Key, Obj]:
    """An AdmissionCheck the operator serves (``checks.is_ours``), its name under one key; others: none."""
    name = (body.get("metadata") or {}).get("name")
    return {(OUR_CHECKS, None, None): {"name": str(name)}} if name and checks.is_ours(body) else {}


@dataclass(frozen=True)
class Kind:
    """A kind passes read, and the kopf index that holds it (``index``: its id, the keyword handlers get it by)."""

    index: str
    resource: tuple[str, ...]  # as kopf's decorators take it: (group, version, plural) or (version, plural)
    entries: Callable[[Obj], dict[Key, Obj]]


KINDS = (  # in the order of the fields of Indexes
    Kind("job_index", ("batch", "v1", "jobs"), job_entries),
    Kind("pod_index", ("v1", "pods"), pod_entries),
    Kind("node_index", ("v1", "nodes"), node_entries),
    Kind("claim_index", ("v1", "persistentvolumeclaims"), claim_entries),
    Kind("service_index", ("v1", "services"), service_entries),
    Kind("pod_template_index", ("v1", "podtemplates"), pod_template_entries),
)
# Kueue's kinds, indexed only where the operator serves its AdmissionChecks (``checks.enabled``): kopf
# watches every kind an index names, and the chart grants these only with ``kueue.enabled``.
KUEUE_KINDS = (
    Kind("workload_index", (checks.GROUP, checks.VERSION, "workloads"), workload_entries),
    Kind("admission_check_index", (checks.GROUP, checks.VERSION, "admissionchecks"), admission_check_entries),
)


@dataclass(frozen=True)
class Indexes:
    """kopf's indexes of the kinds a pass reads (each a ``kopf.Index``: key → store of projections)."""

    jobs: Mapping[Key, Any]
    pods: Mapping[Key, Any]
    nodes: Mapping[Key, Any]
    claims: Mapping[Key, Any]
    services: Mapping[Key, Any]
    pod_templates: Mapping[Key, Any]
    # Kueue's (KUEUE_KINDS), or None where the operator does not serve its AdmissionChecks.
    workloads: Mapping[Key, Any] | None = None
    admission_checks: Mapping[Key, Any] | None = None

    @classmethod
    def of(cls, handed: Mapping[str, Any]) -> Indexes:
        """The indexes among a kopf handler's keywords."""
        return cls(*(handed[kind.index] for kind in KINDS), *(handed.get(kind.index) for kind in KUEUE_KINDS))


class IndexedReader:
    """Answers a pass's reads from the indexes, on a worker thread, by asking the loop that owns them.

    ``forgotten``: the uids of objects found deleted that kopf still indexes (see the module's
    docstring), shared by every cache's reader and only ever touched in the loop.
    """

    def __init__(
        self,
        indexes: Indexes,
        loop: asyncio.AbstractEventLoop,
        client: Client,
        forgotten: OrderedDict[str, None] | None = None,
    ) -> None:
        self._indexes = indexes
        self._loop = loop
        self._client = client  # for a template of a workload kind: a Job, a JobSet, ... (the module's docstring)
        self._forgotten: OrderedDict[str, None] = OrderedDict() if forgotten is None else forgotten

    def forget(self, uids: Iterable[str]) -> None:
        """Answer without these objects from now on: the API said they are gone."""
        gone = list(uids)

        def remember() -> None:
            self._forgotten.update(dict.fromkeys(gone))
            while len(self._forgotten) > FORGOTTEN_LIMIT:
                self._forgotten.popitem(last=False)

        self._ask(remember)

    def _ask(self, read: Callable[[], T]) -> T:
        """Run ``read`` in the event loop and return its answer (at once when called from the loop)."""
        try:
            if asyncio.get_running_loop() is self._loop:
                return read()
        except RuntimeError:  # no loop in this thread: a worker
            pass
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if answer.set_running_or_notify_cancel():
                try:
                    answer.set_result(read())
                except BaseException as exc:  # handed to the worker that asked
                    answer.set_exception(exc)

        self._loop.call_soon_threadsafe(run)  # RuntimeError once the loop is closed: the pass fails
        return answer.result(timeout=READ_TIMEOUT_SECONDS)

    def _entries(self, index: Mapping[Key, Any], key: Key) -> tuple[Obj, ...]:
        # In name order, as the API server lists them (by their key in storage): a plan sees the same order.
        found = self._ask(lambda: tuple(obj for obj in index.get(key, ()) if uid(obj) not in self._forgotten))
        return tuple(sorted(found, key=lambda obj: str((obj.get("metadata") or {}).get("name"))))

    def training_pods(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The pods labelled with the cache."""
        return self._entries(self._indexes.pods, (TRAINING_PODS, namespace, cache))

    @property
    def serves_checks(self) -> bool:
        """Whether the operator serves its Kueue AdmissionChecks (their indexes exist)."""
        return self._indexes.workloads is not None and self._indexes.admission_checks is not None

    def waiting_workloads(self, namespace: str | None) -> tuple[Obj, ...]:
        """The namespace's Workloads with a Pending admission check (none where checks are not served)."""
        return (
            ()
            if self._indexes.workloads is None
            else self._entries(self._indexes.workloads, (WAITING_WORKLOADS, namespace, None))
        )

    def our_checks(self) -> frozenset[str]:
        """The names of the AdmissionChecks the operator serves."""
        found = self._indexes.admission_checks
        return frozenset() if found is None else self._ask(lambda: our_check_names(found))

    def warmup_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's warm-up Jobs."""
        return self._entries(self._indexes.jobs, (WARMUP_JOBS, namespace, cache))

    def expiry_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's expiry Jobs."""
        return self._entries(self._indexes.jobs, (EXPIRY_JOBS, namespace, cache))

    def job_pods(self, namespace: str | None, job: str, finished: bool = False) -> tuple[Obj, ...]:
        """The pods of one of our Jobs; those of a ``finished`` one from the API while memory shows one still on."""
        pods = self._entries(self._indexes.pods, (JOB_PODS, namespace, job))
        if finished and not all(map(_ended, pods)):
            # The Job controller ends a Job only once its pods' phases say they ended (a list then read their
            # termination messages: a warm-up's report, the expiry's summary), but pods and Jobs come by
            # separate watches, in no order between them: memory may have the Job's end before its pods'.
            return ApiReader(self._client).job_pods(namespace, job)
        return pods

    def services(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's multi-host Services."""
        return self._entries(self._indexes.services, (SERVICES, namespace, cache))

    def nodes(self) -> tuple[Obj, ...]:
        """Every Node."""
        return self._entries(self._indexes.nodes, (NODES, None, None))

    def claim(self, namespace: str | None, name: str) -> Obj | None:
        """The claim of that name, or ``None``."""
        return next(iter(self._entries(self._indexes.claims, (CLAIM, namespace, name))), None)

    def template(self, namespace: str | None, ref: TemplateRef, fresh: bool = False) -> Obj | None:
        """The object a ``templateRef`` names, or ``None``: a PodTemplate from memory (from the API when
        ``fresh``: ``snapshot.observe`` asks so when a pod runs an image the copy may be too old to name),
        the workload kinds by a GET."""
        if ref.kind == "PodTemplate" and not fresh:
            return next(iter(self._entries(self._indexes.pod_templates, (POD_TEMPLATE, namespace, ref.name))), None)
        return snapshot.read_template(self._client, namespace, ref)

    def pod_events(self, namespace: str | None, pod: Obj) -> tuple[Obj, ...]:
        """The Events about a pod that waits for a node, from the API (``snapshot.pod_events``: not watched)."""
        return snapshot.pod_events(self._client, namespace, pod)

    def provisioning_requests(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """The cache's ProvisioningRequests, from the API (``snapshot.provisioning_requests``: not watched)."""
        return snapshot.provisioning_requests(self._client, namespace, cache)

    def workloads(self, namespace: str | None, job: Obj) -> tuple[Obj, ...]:
        """A queued Job's Kueue Workload, from the API (``snapshot.workloads``: not watched)."""
        return snapshot.workloads(self._client, namespace, job)


@dataclass
class Audit:
    """A reader that answers from memory and records each question, to ask the API the same ones after.

    :meth:`deleted` asks them (after: an object created meanwhile is in the API's answer, not missed)
    and returns the uids memory answered with and the API no longer did.
    """

    memory: IndexedReader
    asked: list[tuple[str, tuple[Any, ...], tuple[Obj, ...]]] = field(default_factory=list)

    def _record(self, question: str, args: tuple[Any, ...], answer: tuple[Obj, ...]) -> tuple[Obj, ...]:
        self.asked.append((question, args, answer))
        return answer

    def training_pods(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.training_pods`, recorded."""
        return self._record("training_pods", (namespace, cache), self.memory.training_pods(namespace, cache))

    def warmup_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.warmup_jobs`, recorded."""
        return self._record("warmup_jobs", (namespace, cache), self.memory.warmup_jobs(namespace, cache))

    def expiry_jobs(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.expiry_jobs`, recorded."""
        return self._record("expiry_jobs", (namespace, cache), self.memory.expiry_jobs(namespace, cache))

    def job_pods(self, namespace: str | None, job: str, finished: bool = False) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.job_pods`, recorded."""
        return self._record("job_pods", (namespace, job), self.memory.job_pods(namespace, job, finished))

    def services(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.services`, recorded."""
        return self._record("services", (namespace, cache), self.memory.services(namespace, cache))

    def nodes(self) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.nodes`, recorded."""
        return self._record("nodes", (), self.memory.nodes())

    def claim(self, namespace: str | None, name: str) -> Obj | None:
        """As :meth:`IndexedReader.claim`, recorded."""
        found = self.memory.claim(namespace, name)
        self._record("claim", (namespace, name), () if found is None else (found,))
        return found

    def template(self, namespace: str | None, ref: TemplateRef, fresh: bool = False) -> Obj | None:
        """As :meth:`IndexedReader.template`, recorded for a PodTemplate from memory (the rest is the API's)."""
        found = self.memory.template(namespace, ref, fresh)
        if ref.kind == "PodTemplate" and not fresh:
            self._record("template", (namespace, ref), () if found is None else (found,))
        return found

    def pod_events(self, namespace: str | None, pod: Obj) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.pod_events` (read from the API: nothing to audit)."""
        return self.memory.pod_events(namespace, pod)

    def provisioning_requests(self, namespace: str | None, cache: str) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.provisioning_requests` (read from the API: nothing to audit)."""
        return self.memory.provisioning_requests(namespace, cache)

    def workloads(self, namespace: str | None, job: Obj) -> tuple[Obj, ...]:
        """As :meth:`IndexedReader.workloads` (read from the API: nothing to audit)."""
        return self.memory.workloads(namespace, job)

    def deleted(self, api: ApiReader) -> set[str]:
        """The uids memory answered with that ``api`` (a ``snapshot.ApiReader``), asked the same, did not,
        and that are gone: a suspect is read by name, since it may have moved (a pod relabelled for another
        cache is not deleted, and must not be forgotten for that cache)."""
        gone: set[str] = set()
        for question, args, remembered in self.asked:
            answer = getattr(api, question)(*args)
            present = {uid(obj) for obj in ((answer,) if isinstance(answer, Mapping) else answer or ())}
            for obj in remembered:
                if uid(obj) and uid(obj) not in present and uid(api.client.get(*_address(question, obj))) != uid(obj):
                    gone.add(uid(obj))
        return gone


# The resource each question's answers are of.
_ANSWERED_WITH = {
    "training_pods": kube.PODS,
    "job_pods": kube.PODS,
    "warmup_jobs": kube.JOBS,
    "expiry_jobs": kube.JOBS,
    "services": kube.SERVICES,
    "nodes": kube.NODES,
    "claim": kube.PVCS,
    "template": template.PODTEMPLATES,
}


def _address(question: str, obj: Obj) -> tuple[Resource, str, str | None]:
    meta = obj.get("metadata") or {}
    return _ANSWERED_WITH[question], str(meta.get("name")), meta.get("namespace")
