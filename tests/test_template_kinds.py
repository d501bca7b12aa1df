"""templateRef to each workload kind (controller/template.py): each by its documented shape, the
container chosen, a missing template, an unknown kind refused, and a TrainJob's runtime read over HTTP.

The objects are written as each project's users write them (its docs' and samples' shape); the
warm-up Jobs they give are compared with those of the same pod spec given inline (test_template.py).
"""

from __future__ import annotations

import copy
from typing import Any

import kmock
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compilecache.controller import template
from compilecache.controller.api import SpecError, TemplateRef, parse_spec
from compilecache.controller.kube import Client
from compilecache.controller.snapshot import ApiReader
from crdschema import load_crd, openapi_schema, validate
from test_crd import CRD_PATH, VERSION
from test_template import IMAGE, training_pod_spec, warmup_jobs, with_template

NS = "default"


def _renamed(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """``pod`` with training's container (``train``) renamed, as a kind's controller requires."""
    pod = copy.deepcopy(pod)
    pod["containers"][0]["name"] = name
    return pod


def leaderworkerset(worker: dict[str, Any], leader: dict[str, Any] | None = None) -> dict[str, Any]:
    """A LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) as its docs' multi-node example writes one."""
    lwt: dict[str, Any] = {
        "size": 4,
        "restartPolicy": "RecreateGroupOnPodRestart",
        "workerTemplate": {"metadata": {"labels": {"role": "worker"}}, "spec": worker},
    }
    if leader is not None:
        lwt["leaderTemplate"] = {"metadata": {"labels": {"role": "leader"}}, "spec": leader}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "training", "namespace": NS},
        "spec": {"replicas": 2, "leaderWorkerTemplate": lwt, "startupPolicy": "LeaderCreated"},
    }


def pytorchjob(master: dict[str, Any] | None, worker: dict[str, Any]) -> dict[str, Any]:
    """A PyTorchJob (kubeflow.org/v1) as the training operator's examples write one."""
    specs: dict[str, Any] = {"Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": {"spec": worker}}}
    if master is not None:
        specs["Master"] = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": master}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "training", "namespace": NS},
        "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs},
    }


def rayjob(worker: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """A RayJob (ray.io/v1) as KubeRay's samples write one: a GPU worker group, a head without GPUs."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "training", "namespace": NS},
        "spec": {
            "entrypoint": "python /app/train.py",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "rayVersion": "2.46.0",
                "headGroupSpec": {"rayStartParams": {"num-gpus": "0"}, "template": {"spec": head}},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 2,
                        "minReplicas": 2,
                        "maxReplicas": 2,
                        "rayStartParams": {},
                        "template": {"spec": worker},
                    }
                ],
            },
        },
    }


def head_pod() -> dict[str, Any]:
    return {"containers": [{"name": "ray-head", "image": IMAGE, "ports": [{"containerPort": 6379, "name": "gcs"}]}]}


def trainjob(trainer: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A TrainJob (trainer.kubeflow.org/v1alpha1) as Kubeflow Trainer's docs write one: a runtime by name
    (a ClusterTrainingRuntime by default) and the trainer's image, command, env and resources."""
    default = {
        "image": IMAGE,
        "command": ["python", "/app/train.py"],
        "env": [{"name": "DATA", "value": "/data/train.bin"}],
        "numNodes": 2,
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "training", "namespace": NS},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": default if trainer is None else trainer}
        | spec,
    }


def runtime(pod: dict[str, Any], kind: str = "ClusterTrainingRuntime") -> dict[str, Any]:
    """A training runtime as Kubeflow Trainer ships torch-distributed: one replicated Job, the trainer
    step (labelled as such), its container ``node`` with the runtime's own image."""
    metadata: dict[str, Any] = {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}}
    if kind == "TrainingRuntime":
        metadata["namespace"] = NS
    step = {"metadata": {"labels": {template.TRAINER_ANCESTOR_LABEL: "trainer"}}, "spec": {"template": {"spec": pod}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": {"replicatedJobs": [{"name": "node", "template": step}]}},
        },
    }


def runtime_pod() -> dict[str, Any]:
    """The runtime's trainer pod: training's volumes and env there, the runtime's own image and command."""
    pod = _renamed(training_pod_spec(), "node")
    node = pod["containers"][0]
    node["image"] = "registry.example/torch-runtime:2.7"  # the TrainJob's spec.trainer.image wins
    node["command"] = ["torchrun", "/workspace/train.py"]
    node["env"] = [{"name": "DATA", "value": "/data/runtime.bin"}, {"name": "TMPDIR", "value": "/scratch"}]
    return pod


def ref_cache(kind: str, container: str | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"templateRef": {"kind": kind, "name": "training"}}
    if container is not None:
        value["container"] = container
    return with_template(value)


def inline_jobs(pod: dict[str, Any], container: str | None = None) -> list[dict[str, Any]]:
    value: dict[str, Any] = {"spec": pod} | ({"container": container} if container else {})
    return [job["spec"] for job in warmup_jobs(with_template(value))]


def referenced_jobs(kind: str, obj: dict[str, Any], container: str | None = None) -> list[dict[str, Any]]:
    return [job["spec"] for job in warmup_jobs(ref_cache(kind, container), obj)]


def chosen(kind: str, obj: dict[str, Any], container: str | None = None) -> str:
    """Where the warm-up's container came from: its field path."""
    spec = template.resolve(parse_spec(ref_cache(kind, container)["spec"]), obj)
    assert spec.warmup.pod_template is not None
    return spec.warmup.pod_template.container_path


# --- each kind, by its documented shape --------------------------------------------------------------


def test_a_leaderworkerset_gives_the_warm_up_its_workers_template() -> None:
    coordinator = {"containers": [{"name": "coordinator", "image": IMAGE}]}
    obj = leaderworkerset(training_pod_spec(), coordinator)
    assert referenced_jobs("LeaderWorkerSet", obj) == inline_jobs(training_pod_spec())
    assert chosen("LeaderWorkerSet", obj).endswith("spec.leaderWorkerTemplate.workerTemplate.spec).containers[0]")


def test_a_leaderworkerset_gives_its_leaders_template_for_a_container_only_the_leader_has() -> None:
    leader = training_pod_spec()
    leader["containers"][0]["name"] = "coordinator"
    obj = leaderworkerset(training_pod_spec(), leader)
    where = chosen("LeaderWorkerSet", obj, "coordinator")
    assert where.endswith("(LeaderWorkerSet training: spec.leaderWorkerTemplate.leaderTemplate.spec).containers[0]")
    assert chosen("LeaderWorkerSet", obj, "train").endswith("workerTemplate.spec).containers[0]")


def test_a_pytorchjob_gives_its_masters_pytorch_container_whatever_its_place() -> None:
    pod = _renamed(training_pod_spec(), "pytorch")
    pod["containers"].reverse()  # the sidecar first: the training operator's container name decides
    obj = pytorchjob(pod, _renamed(training_pod_spec(), "pytorch"))
    assert referenced_jobs("PyTorchJob", obj) == inline_jobs(pod, "pytorch")
    assert chosen("PyTorchJob", obj).endswith("spec.pytorchReplicaSpecs.Master.template.spec).containers[1]")


def test_a_pytorchjob_without_a_master_gives_its_workers() -> None:
    obj = pytorchjob(None, _renamed(training_pod_spec(), "pytorch"))
    assert chosen("PyTorchJob", obj).endswith("spec.pytorchReplicaSpecs.Worker.template.spec).containers[0]")


def test_a_rayjob_gives_its_gpu_worker_group_and_its_head_for_the_heads_container() -> None:
    worker = _renamed(training_pod_spec(), "ray-worker")
    obj = rayjob(worker, head_pod())
    assert referenced_jobs("RayJob", obj) == inline_jobs(worker)
    assert chosen("RayJob", obj).endswith("spec.rayClusterSpec.workerGroupSpecs[0].template.spec).containers[0]")
    assert chosen("RayJob", obj, "ray-head").endswith("spec.rayClusterSpec.headGroupSpec.template.spec).containers[0]")


def test_a_rayjob_on_an_existing_cluster_is_refused_naming_its_cluster_selector() -> None:
    obj = rayjob(training_pod_spec(), head_pod())
    del obj["spec"]["rayClusterSpec"]
    obj["spec"]["clusterSelector"] = {"ray.io/cluster": "shared"}
    with pytest.raises(SpecError) as caught:
        chosen("RayJob", obj)
    assert caught.value.field.endswith("(RayJob training: spec.clusterSelector)"), caught.value.field


def test_a_trainjob_gives_its_runtimes_trainer_step_with_the_trainjobs_image_command_and_env() -> None:
    obj = template.join(trainjob(), runtime(runtime_pod()))
    expected = runtime_pod()
    node = expected["containers"][0]
    node["image"], node["command"] = IMAGE, ["python", "/app/train.py"]
    node["env"] = [{"name": "TMPDIR", "value": "/scratch"}, {"name": "DATA", "value": "/data/train.bin"}]
    assert referenced_jobs("TrainJob", obj) == inline_jobs(expected, "node")
    [job, *_] = warmup_jobs(ref_cache("TrainJob"), obj)
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["DATA"] == "/data/train.bin"  # the TrainJob's, over the runtime's
    volumes = {volume["name"] for volume in job["spec"]["template"]["spec"]["volumes"]}
    assert {"data", "config", "token"} <= volumes  # the runtime's
    assert chosen("TrainJob", obj).endswith(
        "(TrainJob training: ClusterTrainingRuntime torch-distributed: "
        "spec.template.spec.replicatedJobs[0].template.spec.template.spec).containers[0]"
    )


def test_a_trainjob_without_a_trainer_image_runs_the_runtimes_which_the_warm_up_follows() -> None:
    obj = template.join(trainjob({"numNodes": 1}), runtime(runtime_pod()))
    pinned = template.resolve(parse_spec(ref_cache("TrainJob")["spec"]), obj)
    assert pinned.warmup.image == IMAGE  # warmup.image set: it pins the warm-up's image
    following = ref_cache("TrainJob")
    del following["spec"]["warmup"]["image"]
    spec = template.resolve(parse_spec(following["spec"]), obj)
    assert "torch-runtime:2.7" in spec.warmup.image  # unset: training's, here the runtime's
    assert spec.warmup.image_path.endswith("replicatedJobs[0].template.spec.template.spec).containers[0].image")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"runtimeRef": {"name": "torch-distributed", "apiGroup": "example.com"}}, "names no Kubeflow Trainer runtime"),
        ({"runtimeRef": {"name": "torch-distributed", "kind": "Deployment"}}, "names no Kubeflow Trainer runtime"),
        ({"podSpecOverrides": [{"targetJobs": [{"name": "node"}], "volumes": []}]}, "is not applied"),
    ],
)
def test_a_trainjob_the_operator_cannot_follow_is_refused_naming_the_field(change: dict, words: str) -> None:
    obj = template.join(trainjob(**change), runtime(runtime_pod()))
    with pytest.raises(SpecError) as caught:
        chosen("TrainJob", obj)
    assert words in caught.value.message and "(TrainJob training: spec." in caught.value.field


def test_a_trainjob_whose_runtime_is_missing_is_refused_naming_the_runtime() -> None:
    with pytest.raises(SpecError) as caught:
        chosen("TrainJob", template.join(trainjob(), None))
    assert caught.value.field.endswith("(TrainJob training: spec.runtimeRef)")
    assert "ClusterTrainingRuntime torch-distributed does not exist" in caught.value.message


def test_a_runtime_patch_that_places_pods_is_followed_and_one_that_adds_volumes_is_refused() -> None:
    def patch(pod: dict[str, Any]) -> dict[str, Any]:
        job = {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}
        spec = {"template": {"spec": {"replicatedJobs": [job]}}}
        return {"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": spec}

    placed = trainjob(runtimePatches=[patch({"nodeSelector": {"pool": "a100"}})])  # what Kueue writes
    assert chosen("TrainJob", template.join(placed, runtime(runtime_pod())))
    volumes = trainjob(runtimePatches=[patch({"volumes": [{"name": "more", "emptyDir": {}}]})])
    with pytest.raises(SpecError) as caught:
        chosen("TrainJob", template.join(volumes, runtime(runtime_pod())))
    assert "spec.runtimePatches[0]" in caught.value.field and "patches volumes" in caught.value.message


def test_a_runtime_without_a_trainer_step_is_refused() -> None:
    rt = runtime(runtime_pod())
    step = rt["spec"]["template"]["spec"]["replicatedJobs"][0]
    step["name"], step["template"]["metadata"]["labels"] = "dataset-initializer", {}
    with pytest.raises(SpecError) as caught:
        chosen("TrainJob", template.join(trainjob(), rt))
    assert "has no trainer step" in caught.value.message


# --- what every kind shares ---------------------------------------------------------------------------


KIND_OBJECTS = {
    "LeaderWorkerSet": lambda pod: leaderworkerset(pod),
    "PyTorchJob": lambda pod: pytorchjob(pod, pod),
    "RayJob": lambda pod: rayjob(pod, head_pod()),
    "TrainJob": lambda pod: template.join(trainjob({}), runtime(_renamed(pod, "node"))),
}


@pytest.mark.parametrize("kind", sorted(KIND_OBJECTS))
def test_a_named_container_no_template_has_is_refused_naming_podtemplate_container(kind: str) -> None:
    obj = KIND_OBJECTS[kind](training_pod_spec())
    with pytest.raises(SpecError) as caught:
        chosen(kind, obj, "missing")
    assert caught.value.field == "spec.warmup.podTemplate.container"
    assert "has no container 'missing'" in caught.value.message


@pytest.mark.parametrize("kind", sorted(KIND_OBJECTS))
def test_an_object_without_its_template_is_refused_naming_the_reference(kind: str) -> None:
    obj = KIND_OBJECTS[kind](training_pod_spec())
    bare = {key: value for key, value in obj.items() if key != "spec"}
    with pytest.raises(SpecError) as caught:
        chosen(kind, bare)
    assert caught.value.field.startswith(f"{template.REF_FIELD} ({kind} training"), caught.value.field


SCHEMA = openapi_schema(load_crd(CRD_PATH), VERSION)


@pytest.mark.parametrize("kind", [*template.KINDS, "Deployment", "StatefulSet", "trainjob"])
def test_the_crd_and_the_parser_take_exactly_the_known_kinds(kind: str) -> None:
    obj = ref_cache(kind)
    found = [(v.path, v.kind) for v in validate(SCHEMA, obj)]
    if kind in template.KINDS:
        assert found == [] and parse_spec(obj["spec"]).warmup.template is not None
        return
    assert found == [("spec.warmup.podTemplate.templateRef.kind", "enum")]
    with pytest.raises(SpecError) as caught:
        parse_spec(obj["spec"])
    assert caught.value.field == "spec.warmup.podTemplate.templateRef.kind"
    assert all(repr(known) in caught.value.message for known in template.KINDS), caught.value.message


# Untrusted objects: whatever a workload's object holds, resolving it raises SpecError or succeeds.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


def _poked(obj: Any, path: list[int], junk: Any) -> Any:
    """``obj`` with the node that ``path`` picks (each step an index into a container's items) replaced."""
    if not path or not isinstance(obj, (dict, list)) or not obj:
        return junk
    keys = list(obj) if isinstance(obj, dict) else list(range(len(obj)))
    key = keys[path[0] % len(keys)]
    copied = copy.copy(obj)
    copied[key] = _poked(obj[key], path[1:], junk)
    return copied


@given(
    st.sampled_from(sorted(KIND_OBJECTS)),
    st.lists(st.integers(0, 50), max_size=12),
    _JSON,
    st.sampled_from([None, "train", "node", "pytorch"]),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_object_of_a_kind_is_resolved_or_refused_with_a_spec_error(
    kind: str, path: list[int], junk: Any, container: str | None
) -> None:
    obj = _poked(KIND_OBJECTS[kind](training_pod_spec()), path, junk)
    spec = parse_spec(ref_cache(kind, container)["spec"])
    try:
        resolved = template.resolve(spec, obj)
    except SpecError as error:
        assert error.field.startswith(("spec.warmup.podTemplate", template.REF_FIELD)), error.field
    else:
        assert resolved.warmup.pod_template is not None


# --- a TrainJob's runtime, read over HTTP -------------------------------------------------------------

TRAINER_KINDS = {
    "trainer.kubeflow.org/v1alpha1/trainjobs": kmock.ResourceInfo(kind="TrainJob", namespaced=True),
    "trainer.kubeflow.org/v1alpha1/trainingruntimes": kmock.ResourceInfo(kind="TrainingRuntime", namespaced=True),
    "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes": kmock.ResourceInfo(
        kind="ClusterTrainingRuntime", namespaced=False
    ),
}


@pytest.mark.emulator
@pytest.mark.parametrize("runtime_kind", ["ClusterTrainingRuntime", "TrainingRuntime"])
def test_the_pass_reads_a_trainjob_with_its_runtime(kube_env: Any, runtime_kind: str) -> None:
    """Two GETs: the TrainJob, then the runtime its runtimeRef names (cluster-scoped or in its namespace)."""
    for resource, info in TRAINER_KINDS.items():
        info.verbs = {"create", "get", "list", "delete"}
        kube_env.emulator.resources[resource] = info
    client = Client.from_environment()
    reader = ApiReader(client)
    ref = TemplateRef("TrainJob", "training")
    assert reader.template(NS, ref) is None
    job = trainjob(runtimeRef={"name": "torch-distributed", "kind": runtime_kind})
    kube_env.create("trainer.kubeflow.org/v1alpha1/trainjobs", job, NS)
    read = reader.template(NS, ref)
    assert read is not None and read[template.RUNTIME] is None  # not there yet: resolve says which
    plural = "clustertrainingruntimes" if runtime_kind == "ClusterTrainingRuntime" else "trainingruntimes"
    namespace = NS if runtime_kind == "TrainingRuntime" else None
    kube_env.create(f"trainer.kubeflow.org/v1alpha1/{plural}", runtime(runtime_pod(), runtime_kind), namespace)
    read = reader.template(NS, ref)
    assert read is not None and read[template.RUNTIME]["kind"] == runtime_kind
    spec = template.resolve(parse_spec(ref_cache("TrainJob")["spec"]), read)
    assert spec.warmup.pod_template is not None and spec.warmup.pod_template.image == IMAGE
    client.close()
