"""The spec parser: defaults equal the CRD's, and every bad input names its field."""

import pathlib

import pytest
import yaml

from compilecache.controller.api import DEFAULT_MOUNT_PATH, SpecError, parse_spec
from compilecache.controller.pools import resolve_pools
from specs import cache_spec, cluster


def test_defaults_are_applied():
    spec = parse_spec(cache_spec())
    assert spec.mount_path == DEFAULT_MOUNT_PATH
    assert spec.cache_dir == DEFAULT_MOUNT_PATH
    assert spec.pvc is not None and spec.pvc.create is not None
    assert spec.pvc.create.access_modes == ("ReadWriteMany",)
    assert spec.warmup.discover is not None and spec.warmup.discover.group_by == "nvidia.com/gpu.product"
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
    ("no image", _with("warmup.image", None), "spec.warmup.image"),
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
