"""Training's pod template in a warm-up: read the object ``podTemplate.templateRef`` names (pure, no I/O).

``spec.warmup.podTemplate`` gives a warm-up what training sees at startup (docs/resource.md):
inline (parsed by ``api.parse_pod_template`` with the rest of the spec), or by reference to an
object of a training workload kind in the cache's namespace (:data:`KINDS`). The pass reads the
referenced object in its observe step (``snapshot.read_template``) and :func:`resolve` turns it into
the parsed spec's ``warmup.pod_template``, so that the plan, the policy and ``jobs.warmup_job`` see
one typed value whichever way the template came. ``jobs.py`` merges it into the warm-up pod.

Where each kind keeps its pod template is that project's API, not ours; each locator below says
where it read it. A TrainJob keeps none itself: its pods are its training runtime's trainer step
with the TrainJob's ``spec.trainer`` applied, so the pass reads the runtime too (:func:`runtime_of`)
and hands both over as one object (:func:`join`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from compilecache.controller import api
from compilecache.controller.api import CacheSpec, SpecError, TemplateRef
from compilecache.controller.kube import JOBS, Resource

Obj = Mapping[str, Any]
# (where in the object: a field path for messages, the pod spec there, the container to take when
# podTemplate.container is unset: None for the first one)
Candidate = tuple[str, Obj, str | None]

PODTEMPLATES = Resource("v1", "podtemplates")
JOBSETS = Resource("jobset.x-k8s.io/v1alpha2", "jobsets")
# kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go: group leaderworkerset.x-k8s.io, v1.
LEADERWORKERSETS = Resource("leaderworkerset.x-k8s.io/v1", "leaderworkersets")
# kubeflow/trainer pkg/apis/trainer/v1alpha1: trainjob_types.go (+resource:path=trainjobs) and
# trainingruntime_types.go (TrainingRuntime namespaced; ClusterTrainingRuntime +kubebuilder:resource:scope=Cluster).
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINJOBS = Resource(f"{TRAINER_GROUP}/v1alpha1", "trainjobs")
TRAINING_RUNTIMES = Resource(f"{TRAINER_GROUP}/v1alpha1", "trainingruntimes")
CLUSTER_TRAINING_RUNTIMES = Resource(f"{TRAINER_GROUP}/v1alpha1", "clustertrainingruntimes", namespaced=False)
# kubeflow/training-operator pkg/apis/kubeflow.org/v1/pytorch_types.go: group kubeflow.org, v1.
PYTORCHJOBS = Resource("kubeflow.org/v1", "pytorchjobs")
# ray-project/kuberay ray-operator/apis/ray/v1/rayjob_types.go: group ray.io, v1.
RAYJOBS = Resource("ray.io/v1", "rayjobs")

REF_FIELD = "spec.warmup.podTemplate.templateRef"
# Where join() puts a TrainJob's runtime: no API object has this top-level field (the API server
# prunes unknown fields of a structural CRD), so it cannot come from the TrainJob itself.
RUNTIME = "compilecache.dev/runtime"

# Kubeflow Trainer's names for the trainer step (pkg/constants: LabelTrainJobAncestor, AncestorTrainer,
# Node): the runtime's replicated Job with this label, or named "node", and its container "node".
# The trainer's own code finds the step by either (its jobset plugin: `rJob.Name == constants.Node ||
# label == constants.AncestorTrainer`), and applies spec.trainer to the container named "node".
TRAINER_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_ANCESTOR = "trainer"
TRAINER_CONTAINER = "node"
# The Kubeflow training operator's required container name in a PyTorchJob's replicas (its
# pytorch_types.go: PyTorchJobDefaultContainerName; the job is refused without one of this name).
PYTORCH_CONTAINER = "pytorch"


def _at(obj: Any, *path: str | int) -> Any:
    """``obj[path[0]][path[1]]...``, or ``None`` where a step is missing or of the wrong type."""
    for step in path:
        if isinstance(step, int):
            obj = obj[step] if isinstance(obj, list) and -len(obj) <= step < len(obj) else None
        else:
            obj = obj.get(step) if isinstance(obj, Mapping) else None
    return obj


def _pod(obj: Any, *path: str | int) -> Obj:
    """The pod spec at ``path``: ``{}`` where there is none."""
    found = _at(obj, *path)
    return found if isinstance(found, Mapping) else {}


def _items(obj: Any, *path: str) -> list[Any]:
    found = _at(obj, *path)
    return found if isinstance(found, list) else []


def _podtemplate(obj: Obj) -> Iterator[Candidate]:
    yield "template.spec", _pod(obj, "template", "spec"), None


def _job(obj: Obj) -> Iterator[Candidate]:
    yield "spec.template.spec", _pod(obj, "spec", "template", "spec"), None


def _jobset(obj: Obj) -> Iterator[Candidate]:
    """jobset.x-k8s.io v1alpha2: each replicated Job's ``template`` is a JobTemplateSpec; in order."""
    for index, job in enumerate(_items(obj, "spec", "replicatedJobs")):
        where = f"spec.replicatedJobs[{index}].template.spec.template.spec"
        yield where, _pod(job, "template", "spec", "template", "spec"), None


def _leaderworkerset(obj: Obj) -> Iterator[Candidate]:
    """LeaderWorkerSet v1: ``spec.leaderWorkerTemplate.workerTemplate`` (required) and ``leaderTemplate``
    (optional: the leader runs the worker template when unset). The worker's first: every pod of a group
    but one runs it, and the leader's only when the named container is in it alone (a leader that
    runs a coordinator or a server beside training keeps the warm-up on the workers' program)."""
    base = "spec.leaderWorkerTemplate"
    yield f"{base}.workerTemplate.spec", _pod(obj, "spec", "leaderWorkerTemplate", "workerTemplate", "spec"), None
    leader = _at(obj, "spec", "leaderWorkerTemplate", "leaderTemplate")
    if leader is not None:
        yield f"{base}.leaderTemplate.spec", _pod(leader, "spec"), None


def _pytorchjob(obj: Obj) -> Iterator[Candidate]:
    """PyTorchJob v1: ``spec.pytorchReplicaSpecs.{Master,Worker}.template``, Master first (rank 0; the
    Workers run the same script), training's container named ``pytorch`` as the training operator requires."""
    for replica in ("Master", "Worker"):
        spec = _at(obj, "spec", "pytorchReplicaSpecs", replica)
        if spec is not None:
            where = f"spec.pytorchReplicaSpecs.{replica}.template.spec"
            yield where, _pod(spec, "template", "spec"), PYTORCH_CONTAINER


def _rayjob(obj: Obj) -> Iterator[Candidate]:
    """RayJob v1: ``spec.rayClusterSpec.workerGroupSpecs[].template`` then ``headGroupSpec.template``.
    Workers first: Ray Train runs the compiled programs in worker actors, and the head, by KubeRay's
    own examples, gets no GPU (``num-gpus: "0"``). A RayJob with ``clusterSelector`` runs on an existing
    RayCluster and has no template: refused by :func:`pod_spec_of`."""
    cluster = _at(obj, "spec", "rayClusterSpec")
    for index, group in enumerate(_items(cluster, "workerGroupSpecs")):
        where = f"spec.rayClusterSpec.workerGroupSpecs[{index}].template.spec"
        yield where, _pod(group, "template", "spec"), None
    if cluster is not None:
        yield (
            "spec.rayClusterSpec.headGroupSpec.template.spec",
            _pod(cluster, "headGroupSpec", "template", "spec"),
            None,
        )


def _trainjob(obj: Obj) -> Iterator[Candidate]:
    """A TrainJob :func:`join`-ed with its runtime: the runtime's trainer step (``spec.template.spec.
    replicatedJobs[]``, a JobSet spec) with ``spec.trainer``'s image, command, args and env applied to its
    ``node`` container, as the trainer's controller does (env merged by name, the TrainJob's winning)."""
    runtime = obj.get(RUNTIME)
    for index, job in enumerate(_items(runtime, "spec", "template", "spec", "replicatedJobs")):
        labels = _at(job, "template", "metadata", "labels")
        ancestor = labels.get(TRAINER_ANCESTOR_LABEL) if isinstance(labels, Mapping) else None
        if ancestor == TRAINER_ANCESTOR or _at(job, "name") == TRAINER_CONTAINER:
            where = f"spec.template.spec.replicatedJobs[{index}].template.spec.template.spec"
            pod = _pod(job, "template", "spec", "template", "spec")
            yield where, _with_trainer(pod, _at(obj, "spec", "trainer")), TRAINER_CONTAINER


def _with_trainer(pod: Obj, trainer: Any) -> Obj:
    """``pod`` with a TrainJob's ``spec.trainer`` applied to its ``node`` container (a copy; bounded
    later by ``api.parse_pod_template``, which checks every field it takes)."""
    if not isinstance(trainer, Mapping):
        return pod
    containers = pod.get("containers")
    if not isinstance(containers, list):
        return pod
    merged = []
    for container in containers:
        if isinstance(container, Mapping) and container.get("name") == TRAINER_CONTAINER:
            container = dict(container)
            for key in ("image", "command", "args"):
                if trainer.get(key) is not None:
                    container[key] = trainer[key]
            extra = trainer.get("env")
            if isinstance(extra, list):
                names = {item.get("name") for item in extra if isinstance(item, Mapping)}
                own = container.get("env")
                own = own if isinstance(own, list) else []
                kept = [item for item in own if not (isinstance(item, Mapping) and item.get("name") in names)]
                container["env"] = [*kept, *extra]
        merged.append(container)
    return {**pod, "containers": merged}


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind ``templateRef`` may name: its resource and where its objects keep their pod templates."""

    resource: Resource
    candidates: Callable[[Obj], Iterator[Candidate]]


KINDS: Mapping[str, Kind] = {
    "PodTemplate": Kind(PODTEMPLATES, _podtemplate),
    "Job": Kind(JOBS, _job),
    "JobSet": Kind(JOBSETS, _jobset),
    "LeaderWorkerSet": Kind(LEADERWORKERSETS, _leaderworkerset),
    "TrainJob": Kind(TRAINJOBS, _trainjob),
    "PyTorchJob": Kind(PYTORCHJOBS, _pytorchjob),
    "RayJob": Kind(RAYJOBS, _rayjob),
}
assert tuple(KINDS) == api.TEMPLATE_KINDS, "the model's templateRef.kind enum and KINDS must list the same kinds"


def resource_of(ref: TemplateRef) -> Resource:
    """The API resource of the kind a reference names."""
    return KINDS[ref.kind].resource


def runtime_of(ref: TemplateRef, obj: Obj) -> tuple[Resource, str] | None:
    """The second object to read for a TrainJob: its runtime (resource, name); ``None`` for other kinds
    and for a ``runtimeRef`` that names no Kubeflow Trainer runtime (:func:`resolve` then says why).

    ``spec.runtimeRef``'s ``apiGroup`` defaults to trainer.kubeflow.org and ``kind`` to
    ClusterTrainingRuntime (trainjob_types.go, RuntimeRef's kubebuilder defaults); a TrainingRuntime is
    in the TrainJob's namespace."""
    if ref.kind != "TrainJob":
        return None
    runtime_ref = _at(obj, "spec", "runtimeRef")
    name = _at(runtime_ref, "name")
    if not isinstance(name, str) or not name or _at(runtime_ref, "apiGroup") not in (None, TRAINER_GROUP):
        return None
    kinds = {"ClusterTrainingRuntime": CLUSTER_TRAINING_RUNTIMES, "TrainingRuntime": TRAINING_RUNTIMES}
    resource = kinds.get(_at(runtime_ref, "kind") or "ClusterTrainingRuntime")
    return (resource, name) if resource is not None else None


def join(obj: Obj, runtime: Obj | None) -> Obj:
    """A TrainJob with its runtime (``None``: it does not exist), as one object for the snapshot."""
    return {**obj, RUNTIME: runtime}


# Fields of a patch to the trainer's pods that change what the warm-up takes (api.PodTemplate).
_TAKEN_PATCH_FIELDS = ("volumes", "containers", "initContainers", "serviceAccountName", "imagePullSecrets")


def _check_trainjob(ref: TemplateRef, obj: Obj) -> str:
    """A TrainJob's runtime, as ``Kind name`` for messages; raises where the warm-up cannot see what
    its pods get: no runtime, or overrides of the trainer's pods this operator does not apply."""
    runtime_ref = _at(obj, "spec", "runtimeRef") or {}
    described = f"{_at(runtime_ref, 'kind') or 'ClusterTrainingRuntime'} {_at(runtime_ref, 'name')}"
    origin = f"{REF_FIELD} ({ref.describe()}: spec.runtimeRef)"
    if runtime_of(ref, obj) is None:
        raise SpecError(
            origin, f"names no Kubeflow Trainer runtime ({TRAINER_GROUP} TrainingRuntime or ClusterTrainingRuntime)"
        )
    if obj.get(RUNTIME) is None:
        raise SpecError(origin, f"{described} does not exist: training's pod template is there")
    # Older Trainer APIs' overrides (podTemplateOverrides, then podSpecOverrides) and runtimePatches
    # that touch the trainer's pods: not applied here, so the warm-up would miss what training gets.
    for field in ("podTemplateOverrides", "podSpecOverrides"):
        if _at(obj, "spec", field):
            raise SpecError(
                f"{REF_FIELD} ({ref.describe()}: spec.{field})",
                "is not applied by the operator: put these volumes and env in the runtime, or give the "
                "warm-up training's pod spec inline (podTemplate.spec)",
            )
    for index, patch in enumerate(_items(obj, "spec", "runtimePatches")):
        jobs = _items(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")
        for number, job in enumerate(jobs):
            pod = _pod(job, "template", "spec", "template", "spec")
            touched = [field for field in _TAKEN_PATCH_FIELDS if pod.get(field)]
            if touched:
                raise SpecError(
                    f"{REF_FIELD} ({ref.describe()}: spec.runtimePatches[{index}].trainingRuntimeSpec."
                    f"template.spec.replicatedJobs[{number}].template.spec.template.spec)",
                    f"patches {', '.join(touched)}, which the operator does not apply to the warm-up: give "
                    "the warm-up training's pod spec inline (podTemplate.spec)",
                )
    return described


def pod_spec_of(ref: TemplateRef, obj: Obj, container: str | None) -> tuple[str, Obj, str | None]:
    """Where the pod spec sits in the referenced object (a field path for messages), the spec itself and
    the container to take (``container``, or the kind's own name for training's container, or ``None``:
    the first one).

    The first of the kind's candidate templates (:data:`KINDS`, in the order each locator documents)
    that has ``container``; the first one when no container is named. Raises :class:`SpecError` for an
    object that has no pod template at all (a RayJob on an existing cluster, a TrainJob without its
    runtime)."""
    prefix = ""
    if ref.kind == "TrainJob":
        prefix = f"{_check_trainjob(ref, obj)}: "
    candidates = list(KINDS[ref.kind].candidates(obj))
    if not candidates:
        if ref.kind == "RayJob" and _at(obj, "spec", "clusterSelector") is not None:
            raise SpecError(
                f"{REF_FIELD} ({ref.describe()}: spec.clusterSelector)",
                "runs on an existing RayCluster and has no pod template: give it inline (podTemplate.spec)",
            )
        if ref.kind == "TrainJob":
            raise SpecError(
                f"{REF_FIELD} ({ref.describe()}: {prefix}spec.template.spec.replicatedJobs)",
                f"has no trainer step (a replicated Job labelled {TRAINER_ANCESTOR_LABEL}: {TRAINER_ANCESTOR}, "
                f"or named {TRAINER_CONTAINER})",
            )
        raise SpecError(f"{REF_FIELD} ({ref.describe()})", "has no pod template where its API keeps one")
    for where, pod, default in candidates:
        names = {c.get("name") for c in _items(pod, "containers") if isinstance(c, Mapping)}
        if container is None:
            return prefix + where, pod, default if default in names else None
        if container in names:
            return prefix + where, pod, container
    where, pod, _ = candidates[0]
    return prefix + where, pod, container  # parse_pod_template names the container it lacks


def resolve(spec: CacheSpec, obj: Obj | None) -> CacheSpec:
    """``spec`` with the referenced template in ``warmup.pod_template`` (unchanged without a reference).

    Raises :class:`SpecError` naming ``spec.warmup.podTemplate.templateRef`` when the object is
    ``None`` (it does not exist) or its pod spec cannot be used; the message says where in it.
    """
    source = spec.warmup.template
    if source is None or source.ref is None:
        return spec
    ref = source.ref
    if obj is None:
        raise SpecError(REF_FIELD, f"{ref.describe()} does not exist in the cache's namespace")
    where, pod_spec, container = pod_spec_of(ref, obj, source.container)
    origin = f"{REF_FIELD} ({ref.describe()}: {where})"
    template = api.parse_pod_template(pod_spec, origin, container)
    api.check_template(template, spec.mount_path)
    warmup = dataclasses.replace(spec.warmup, pod_template=template)
    if spec.warmup.image_from_template:  # the cache follows training's image (images.py)
        warmup = dataclasses.replace(
            warmup, image=api.template_image(template), image_path=f"{template.container_path}.image"
        )
    return dataclasses.replace(spec, warmup=warmup)
