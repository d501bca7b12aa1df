"""The spec parser: defaults equal the CRD's, and every bad input names its field."""

import pathlib

import pytest
import yaml

from compilecache.controller.api import DEFAULT_MOUNT_PATH, SpecError, parse_cache, parse_spec
from compilecache.controller.pools import resolve_pools
from specs import cache_spec, cluster


def test_defaults_are_applied():
    spec = parse_spec(cache_spec())
    assert spec.mount_path == DEFAULT_MOUNT_PATH
    assert spec.cache_dir == DEFAULT_MOUNT_PATH
    assert spec.pvc is not None and spec.pvc.create is not None
    assert spec.pvc.create.access_modes == ("ReadWriteMany",)
    # groupBy has no default: unset, each node's first accelerator label (controller/accelerators.py).
    assert spec.warmup.discover is not None and spec.warmup.discover.group_by is None
    assert spec.warmup.discover.gpu_types == ()
    assert (spec.warmup.backoff_limit, spec.warmup.active_deadline_seconds, spec.warmup.jobs) == (2, 7200, 1)
    assert spec.consumers.read_only and spec.consumers.gate and spec.consumers.gate_timeout_seconds == 1800


def test_gcs_cache_dir_and_service_account_default():
    spec = parse_spec(
        cache_spec(storage={"gcs": {"bucket": "my-caches", "prefix": "/llama/", "serviceAccountName": "w"}})
    )
    assert spec.cache_dir == "gs://my-caches/llama"
    assert spec.warmup.service_account_name == "w"


def _with(path: str, value):
    """A valid spec with one field (a dotted path, list indices as numbers) set to ``value``; None deletes."""
    spec = cache_spec()
    *parents, last = path.split(".")
    node = spec
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is None:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return spec


BAD = [
    ("no storage", _with("storage", None), "spec.storage"),
    ("empty storage", _with("storage", {}), "spec.storage"),
    ("both storages", _with("storage.gcs", {"bucket": "b1b"}), "spec.storage"),
    ("no workloads", _with("warmup.workloads", []), "spec.warmup.workloads"),
    ("workload both kinds", _with("warmup.workloads.0.script", "/a.py"), "spec.warmup.workloads[0]"),
    ("bad entrypoint", _with("warmup.workloads.0.entrypoint", "no-colon"), "spec.warmup.workloads[0].entrypoint"),
    ("args without script", _with("warmup.workloads.0.args", ["x"]), "spec.warmup.workloads[0].args"),
    ("empty image", _with("warmup.image", "  "), "spec.warmup.image"),
    ("no image", _with("warmup.image", None), "spec.warmup"),
    ("no pools at all", _with("warmup.discover", None), "spec.warmup"),
    ("bad size", _with("storage.pvc.create.size", "200GB"), "spec.storage.pvc.create.size"),
    ("bad maxAge", _with("lifecycle", {"maxAge": "7days"}), "spec.lifecycle.maxAge"),
    ("bad maxSize", _with("lifecycle", {"maxSize": "lots"}), "spec.lifecycle.maxSize"),
    ("bad keepVersions", _with("lifecycle", {"keepVersions": 0}), "spec.lifecycle.keepVersions"),
    ("bad gateTimeout", _with("consumers", {"gateTimeout": "soon"}), "spec.consumers.gateTimeout"),
    ("relative mountPath", _with("mountPath", "cache"), "spec.mountPath"),
    ("bad schedule", _with("schedule", "daily"), "spec.schedule"),
    ("bad cpu", _with("warmup.resources", {"limits": {"cpu": "two"}}), "spec.warmup.resources.limits.cpu"),
    ("negative gpus", _with("warmup.pools", [{"name": "p", "gpusPerPod": -1}]), "spec.warmup.pools[0].gpusPerPod"),
    ("pool name", _with("warmup.pools", [{"name": "H100"}]), "spec.warmup.pools[0].name"),
    ("dup pools", _with("warmup.pools", [{"name": "p"}, {"name": "p"}]), "spec.warmup.pools[1].name"),
    ("deleteWithCache no create", _with("storage.pvc", {"claimName": "c", "deleteWithCache": True}),
     "spec.storage.pvc.deleteWithCache"),
    ("bucket", _with("storage", {"gcs": {"bucket": "Bad_Bucket!"}}), "spec.storage.gcs.bucket"),
    ("env conflict", _with("warmup.workloads", [
        {"name": "a", "entrypoint": "m:f", "env": [{"name": "L", "value": "1"}]},
        {"name": "b", "entrypoint": "m:g", "env": [{"name": "L", "value": "2"}]},
    ]), "spec.warmup.workloads[1].env[0]"),
    ("spec not an object", [], "spec"),
    ("cache env in a workload", _with("warmup.workloads.0.env", [{"name": "XLA_FLAGS", "value": "x"}]),
     "spec.warmup.workloads[0].env[0].name"),
    # issue 9: each of these was accepted, and then the API refused the Job (422) or the CRD the spec.
    ("double-slash mountPath", _with("mountPath", "//x"), "spec.mountPath"),
    ("dot-dot mountPath", _with("mountPath", "/var/../tmp"), "spec.mountPath"),
    ("mountPath on the operator's /tmp", _with("mountPath", "/tmp"), "spec.mountPath"),
    ("empty groupBy", _with("warmup.discover.groupBy", ""), "spec.warmup.discover.groupBy"),
    ("groupBy not a label key", _with("warmup.discover.groupBy", "gpu product"), "spec.warmup.discover.groupBy"),
    ("gpuTypes without groupBy", _with("warmup.discover.gpuTypes", [{"value": "nvidia-l4", "gpusPerPod": 1}]),
     "spec.warmup.discover.gpuTypes"),
    ("dup gpuTypes", _with("warmup.discover", {"groupBy": "cloud.google.com/gke-accelerator", "gpuTypes": [
        {"value": "nvidia-l4", "gpusPerPod": 1}, {"value": "nvidia-l4", "gpusPerPod": 2}]}),
     "spec.warmup.discover.gpuTypes[1].value"),
    ("gpuType not a label value", _with("warmup.discover", {"groupBy": "cloud.google.com/gke-accelerator",
        "gpuTypes": [{"value": "nvidia l4", "gpusPerPod": 1}]}), "spec.warmup.discover.gpuTypes[0].value"),
    ("negative gpuType gpus", _with("warmup.discover", {"groupBy": "cloud.google.com/gke-accelerator",
        "gpuTypes": [{"value": "nvidia-l4", "gpusPerPod": -1}]}), "spec.warmup.discover.gpuTypes[0].gpusPerPod"),
    ("unknown valueFrom", _with("warmup.workloads.0.env", [{"name": "A", "valueFrom": {"bogus": {}}}]),
     "spec.warmup.workloads[0].env[0].valueFrom"),
    ("two valueFrom sources", _with("warmup.workloads.0.env", [{"name": "A", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"key": "k"}}}]),
     "spec.warmup.workloads[0].env[0].valueFrom"),
    ("valueFrom without key", _with("warmup.workloads.0.env", [{"name": "A", "valueFrom": {
        "secretKeyRef": {"name": "s"}}}]), "spec.warmup.workloads[0].env[0].valueFrom.secretKeyRef.key"),
    ("valueFrom unknown field", _with("warmup.workloads.0.env", [{"name": "A", "valueFrom": {
        "fieldRef": {"fieldPath": "x", "bogus": 1}}}]), "spec.warmup.workloads[0].env[0].valueFrom.fieldRef.bogus"),
    ("env name", _with("warmup.workloads.0.env", [{"name": "1 A", "value": "x"}]),
     "spec.warmup.workloads[0].env[0].name"),
    ("gpus in requests", _with("warmup.resources", {"requests": {"nvidia.com/gpu": 4}}),
     "spec.warmup.resources.requests.nvidia.com/gpu"),
    ("a pool's gpuResource in limits", _with("warmup.pools", [{"name": "p", "gpuResource": "amd.com/gpu"}])
     | {"warmup": {**cache_spec()["warmup"], "pools": [{"name": "p", "gpuResource": "amd.com/gpu"}],
                   "resources": {"limits": {"amd.com/gpu": 1}}}}, "spec.warmup.resources.limits.amd.com/gpu"),
    ("negative cpu", _with("warmup.resources", {"requests": {"cpu": "-1"}}), "spec.warmup.resources.requests.cpu"),
    ("negative memory", _with("warmup.resources", {"limits": {"memory": -1}}), "spec.warmup.resources.limits.memory"),
    ("requests above limits", _with("warmup.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
     "spec.warmup.resources.requests.cpu"),
    ("unknown resource", _with("warmup.resources", {"limits": {"gpu": 1}}), "spec.warmup.resources.limits.gpu"),
    ("extended resource without limit", _with("warmup.resources", {"requests": {"example.com/fpga": 1}}),
     "spec.warmup.resources.requests.example.com/fpga"),
    ("extended resource with another limit", _with("warmup.resources", {"requests": {"example.com/fpga": 1},
     "limits": {"example.com/fpga": 2}}), "spec.warmup.resources.limits.example.com/fpga"),
    ("gpuResource not a resource", _with("warmup.pools", [{"name": "p", "gpuResource": "not a resource"}]),
     "spec.warmup.pools[0].gpuResource"),
    ("gpuResource without domain", _with("warmup.discover.gpuResource", "gpu"), "spec.warmup.discover.gpuResource"),
    ("nodeSelector value too long", _with("warmup.pools", [{"name": "p", "nodeSelector": {"gpu": "h" * 64}}]),
     "spec.warmup.pools[0].nodeSelector.gpu"),
    ("nodeSelector value not a label value", _with("warmup.discover.nodeSelector", {"gpu": "H100 80GB"}),
     "spec.warmup.discover.nodeSelector.gpu"),
    ("nodeSelector key not a label key", _with("warmup.discover.nodeSelector", {"a/b/c": "x"}),
     "spec.warmup.discover.nodeSelector.a/b/c"),
    ("toleration value", _with("warmup.pools", [{"name": "p", "tolerations": [{"key": "k", "value": "a b"}]}]),
     "spec.warmup.pools[0].tolerations[0].value"),
    ("podSelector value", _with("consumers", {"podSelector": {"matchLabels": {"app": "x" * 64}}}),
     "spec.consumers.podSelector.matchLabels.app"),
    ("workload on an undeclared pool", _with("warmup", {"image": "i", "pools": [{"name": "h100"}],
     "workloads": [{"name": "w", "entrypoint": "m:f", "pools": ["h100", "a100"]}]}),
     "spec.warmup.workloads[0].pools[1]"),
    ("pull secret not a name", _with("warmup.imagePullSecrets", [{"name": "Not_A_Secret"}]),
     "spec.warmup.imagePullSecrets[0].name"),
    ("steps with an entrypoint", _with("warmup.workloads", [{"name": "w", "entrypoint": "m:f", "steps": 2}]),
     "spec.warmup.workloads[0].steps"),
    ("steps zero", _with("warmup.workloads", [{"name": "w", "script": "/t.py", "steps": 0}]),
     "spec.warmup.workloads[0].steps"),
    ("stepFn with an entrypoint", _with("warmup.workloads", [{"name": "w", "entrypoint": "m:f", "stepFn": "step"}]),
     "spec.warmup.workloads[0].stepFn"),
    ("steps neither a count nor auto", _with("warmup.workloads", [{"name": "w", "script": "/t.py", "steps": "epoch"}]),
     "spec.warmup.workloads[0].steps"),
    ("budget with a step count", _with("warmup.workloads", [{"name": "w", "script": "/t.py", "steps": 2,
     "budget": "2m"}]), "spec.warmup.workloads[0].budget"),
    ("budget not a duration", _with("warmup.workloads", [{"name": "w", "script": "/t.py", "budget": "2 min"}]),
     "spec.warmup.workloads[0].budget"),
    ("budget under a second", _with("warmup.workloads", [{"name": "w", "script": "/t.py", "budget": "500ms"}]),
     "spec.warmup.workloads[0].budget"),
    ("steps auto on several hosts", _with("warmup", {"image": "i", "pools": [{"name": "p"}],
     "topologies": [{"hosts": 2}], "workloads": [{"name": "w", "script": "/t.py", "steps": "auto"}]}),
     "spec.warmup.workloads[0].steps"),
    ("budget past the deadline", _with("warmup", {"image": "i", "pools": [{"name": "p"}], "activeDeadlineSeconds": 600,
     "workloads": [{"name": "w", "script": "/t.py", "budget": "5m"}]}), "spec.warmup.workloads[0].budget"),
    ("stepFn not a name", _with("warmup.workloads", [{"name": "w", "script": "/t.py", "steps": 1, "stepFn": "a.b"}]),
     "spec.warmup.workloads[0].stepFn"),
    ("resume without a script", _with("warmup.workloads", [{"name": "w", "entrypoint": "m:f", "resume": False}]),
     "spec.warmup.workloads[0].resume"),
    ("resumeArgs with resume false", _with("warmup.workloads", [
        {"name": "w", "script": "/t.py", "steps": 1, "resume": False, "resumeArgs": ["--restore"]}]),
     "spec.warmup.workloads[0].resumeArgs"),
    ("resumeWhen with resume false", _with("warmup.workloads", [
        {"name": "w", "script": "/t.py", "steps": 1, "resume": False, "resumeWhen": "ckpt"}]),
     "spec.warmup.workloads[0].resumeWhen"),
    ("resumeWhen without a script", _with("warmup.workloads", [{"name": "w", "entrypoint": "m:f", "resumeWhen": "c"}]),
     "spec.warmup.workloads[0].resumeWhen"),
    *[(f"cron {text}", _with("schedule", text), "spec.schedule")
      for text in ["60 * * * *", "0 3 * * 8", "*/0 * * * *", "5-1 * * * *"]],
]  # fmt: skip


@pytest.mark.parametrize(("case", "spec", "field"), BAD, ids=[case for case, _, _ in BAD])
def test_bad_input_names_the_field(case, spec, field):
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"{field}: ")


def _examples():
    root = pathlib.Path(__file__).parent.parent / "examples"
    for path in sorted(root.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CompileCache":
                yield pytest.param(doc, id=f"{path.name}:{doc['metadata']['name']}")


@pytest.mark.parametrize("doc", list(_examples()))
def test_examples_pass_the_operators_validation(doc):
    spec = parse_spec(doc["spec"])
    assert spec.warmup.workloads
    # Every workload's pool references resolve, whatever the cluster has.
    resolve_pools(spec, cluster())


def test_there_are_examples_of_both_storages():
    docs = [param.values[0] for param in _examples()]
    assert {"pvc", "gcs"} <= {kind for doc in docs for kind in doc["spec"]["storage"]}


GOOD = [
    # issue 9: valid for Kubernetes and the CRD, refused by the parser before.
    ("pull secret with dots", _with("warmup.imagePullSecrets", [{"name": "gcr.io-pull"}])),
    ("entrypoint with an attribute path", _with("warmup.workloads.0.entrypoint", "pkg.mod:Model.targets")),
    ("valueFrom secret", _with("warmup.workloads.0.env", [{"name": "T", "valueFrom": {
        "secretKeyRef": {"name": "hf.token", "key": "token", "optional": True}}}])),
    ("valueFrom resource", _with("warmup.workloads.0.env", [{"name": "M", "valueFrom": {
        "resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}])),
    ("label value at 63", _with("warmup.discover.nodeSelector", {"example.com/" + "k" * 63: "v" * 63})),
    ("empty label value", _with("warmup.discover.nodeSelector", {"gpu": ""})),
    ("extended resource requests equal limits", _with("warmup.resources", {
        "requests": {"example.com/fpga": 1, "cpu": "500m"}, "limits": {"example.com/fpga": "1", "cpu": 1}})),
    ("hugepages", _with("warmup.resources", {"limits": {"hugepages-2Mi": "1Gi", "memory": "1Gi"}})),
    ("tmp below", _with("mountPath", "/tmp/cache")),
    ("dotted segments", _with("mountPath", "/var/.cache/..jax")),
    ("groupBy without prefix", _with("warmup.discover.groupBy", "gpu-product")),
    ("discover with defaults only", _with("warmup.discover", {})),
    ("gpuTypes with groupBy", _with("warmup.discover", {"groupBy": "cloud.google.com/gke-accelerator",
        "gpuTypes": [{"value": "nvidia-h100-80gb", "gpusPerPod": 8}, {"value": "nvidia-l4", "gpusPerPod": 0}]})),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spec"), GOOD, ids=[case for case, _ in GOOD])
def test_valid_input_is_accepted(case, spec):
    parse_spec(spec)


@pytest.mark.parametrize("name", ["c" * 64, "", None])
def test_a_cache_name_that_is_no_label_value_names_metadata_name(name):
    with pytest.raises(SpecError) as info:
        parse_cache({"metadata": {"name": name}, "spec": cache_spec()})
    assert info.value.field == "metadata.name"


def test_a_cache_name_of_63_characters_is_fine():
    assert parse_cache({"metadata": {"name": "c" * 63}, "spec": cache_spec()}).warmup.workloads
