"""The CompileCache CRD: structural, fully described, and it accepts exactly what docs/resource.md says.

No API server is involved: tests/crdschema.py re-creates defaulting, OpenAPI validation, list
types and CEL rules (with cel-python) so that a broken schema or rule fails here, not at
`kubectl apply` time on a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from crdschema import (
    Schema,
    Violation,
    apply_defaults,
    cel_violations,
    compile_rule,
    crd_version,
    iter_defaults,
    iter_nodes,
    iter_rules,
    load_crd,
    openapi_schema,
    resolve,
    schema_violations,
    structural_violations,
    undescribed_fields,
    update_violations,
    validate,
)

ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "compilecache.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VERSION = "v1alpha1"

CRD = load_crd(CRD_PATH)
SCHEMA = openapi_schema(CRD, VERSION)


def _example_caches() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "CompileCache":
                found.append((f"{path.name}:{doc['metadata']['name']}", doc))
    return found


EXAMPLE_CACHES = _example_caches()


# --- the definition itself ---------------------------------------------------------------


def test_names_group_and_version() -> None:
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    assert spec["group"] == "compilecache.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "CompileCache",
        "listKind": "CompileCacheList",
        "plural": "compilecaches",
        "singular": "compilecache",
        "shortNames": ["cc"],
    }
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [(VERSION, True, True)]
    assert CRD["metadata"]["labels"] == {
        "app.kubernetes.io/name": "compilecache-operator",
        "app.kubernetes.io/part-of": "compilecache-operator",
    }


def test_status_subresource_is_on() -> None:
    # Without it the operator's status writes would go through the main resource and bump
    # metadata.generation, and users could overwrite status with `kubectl apply`.
    assert crd_version(CRD, VERSION).get("subresources", {}).get("status") == {}


def test_schema_is_structural() -> None:
    assert structural_violations(SCHEMA) == []


def test_every_field_has_a_description() -> None:
    # `kubectl explain compilecache.spec...` shows these; an empty one teaches nothing.
    assert undescribed_fields(SCHEMA) == []


def test_defaults_are_valid_for_their_own_schema() -> None:
    checked = 0
    for path, node, default in iter_defaults(SCHEMA):
        # The API server prunes and defaults a default before it validates it.
        value = apply_defaults(node, default)
        problems = schema_violations(node, value, base=path) + cel_violations(node, value, path)
        assert problems == [], f"default of {path} is invalid: {problems}"
        checked += 1
    assert checked >= 15, "the schema lost most of its defaults"


@pytest.mark.parametrize(
    ("path", "default"),
    [
        ("spec.mountPath", "/var/cache/compilecache"),
        ("spec.storage.pvc.create.accessModes", ["ReadWriteMany"]),
        ("spec.storage.pvc.deleteWithCache", False),
        ("spec.storage.gcs.prefix", ""),
        ("spec.warmup.pools[].gpuResource", "nvidia.com/gpu"),
        ("spec.warmup.discover.groupBy", None),  # each node's first accelerator label (controller/accelerators.py)
        ("spec.warmup.discover.gpuResource", "nvidia.com/gpu"),
        ("spec.warmup.backoffLimit", 2),
        ("spec.warmup.activeDeadlineSeconds", 7200),
        ("spec.warmup.ttlSecondsAfterFinished", 86400),
        ("spec.warmup.jobs", 1),
        ("spec.warmup.verify", True),
        ("spec.warmup.jax.minCompileTimeSecs", 0),
        ("spec.warmup.jax.minEntrySizeBytes", 0),
        ("spec.lifecycle.verify", True),
        ("spec.consumers.readOnly", True),
        ("spec.consumers.gate", True),
        ("spec.consumers.gateTimeout", "30m"),
        ("spec.consumers.initContainers", False),
    ],
)
def test_documented_defaults(path: str, default: object) -> None:
    nodes = dict(iter_nodes(SCHEMA))
    assert path in nodes, f"{path} is not in the schema"
    assert nodes[path].get("default") == default


def test_tolerations_have_one_shape() -> None:
    # The Toleration schema is written out twice (CRDs have no $ref); keep the copies equal.
    nodes = dict(iter_nodes(SCHEMA))
    pool = copy.deepcopy(nodes["spec.warmup.pools[].tolerations"])
    discover = copy.deepcopy(nodes["spec.warmup.discover.tolerations"])
    pool.pop("description")
    discover.pop("description")
    assert pool == discover


def test_every_rule_compiles() -> None:
    rules = list(iter_rules(SCHEMA))
    assert rules, "the schema has no CEL rules"
    for path, rule in rules:
        compile_rule(rule["rule"])  # raises on a syntax error
        assert rule.get("message", "").strip(), f"rule at {path} has no message"


@pytest.mark.parametrize("column", crd_version(CRD, VERSION)["additionalPrinterColumns"], ids=lambda c: c["name"])
def test_printer_column_points_at_a_field(column: dict[str, Any]) -> None:
    expected = {"Phase", "Pools", "Reason", "Entries", "Size", "Last Warmed", "Age", "Message"}
    assert column["name"] in expected
    if column["jsonPath"] == ".metadata.creationTimestamp":
        assert column["type"] == "date"
        return
    assert column["jsonPath"].startswith(".status."), "columns show what the operator observed"
    node = resolve(SCHEMA, column["jsonPath"])
    assert node is not None, f"{column['jsonPath']} is not in the schema"
    if column["type"] == "date":
        assert node.get("format") == "date-time"
    else:
        assert node.get("type") == column["type"]


def test_printer_columns_are_the_documented_ones() -> None:
    columns = {c["name"]: c["jsonPath"] for c in crd_version(CRD, VERSION)["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Pools": ".status.poolsReady",
        "Reason": ".status.reason",
        "Entries": ".status.cache.entries",
        "Size": ".status.cache.size",
        "Last Warmed": ".status.cache.lastWarmed",
        "Age": ".metadata.creationTimestamp",
        "Message": ".status.message",
    }


def test_status_enums() -> None:
    nodes = dict(iter_nodes(SCHEMA))
    assert nodes["status.phase"]["enum"] == ["Pending", "Warming", "Expiring", "Ready", "Degraded", "Failed"]
    assert nodes["status.pools[].state"]["enum"] == [
        "Pending",
        "Running",
        "Succeeded",
        "Failed",
        "NoNodes",
        "TooFewNodes",
    ]
    assert nodes["status.conditions[].status"]["enum"] == ["True", "False", "Unknown"]
    assert nodes["status.conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    # One entry per pool × topology; records from before topologies default to hosts 1.
    assert nodes["status.pools"]["x-kubernetes-list-map-keys"] == ["name", "hosts"]
    assert nodes["status.pools[].hosts"]["default"] == 1


def test_a_full_status_validates() -> None:
    status: dict[str, Any] = {
        "phase": "Ready",
        "observedGeneration": 3,
        "message": "2/2 pools warmed, 41 entries",
        "specHash": "a1b2c3d4",
        "poolsReady": "2/2",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Warmed",
                "message": "ok",
                "lastTransitionTime": "2025-01-02T03:04:05Z",
                "observedGeneration": 3,
            }
        ],
        "pools": [
            {
                "name": "h100",
                "nodes": 4,
                "gpusPerNode": 8,
                "gpusPerPod": 8,
                "job": "llama-h100-a1b2c3d4",
                "state": "Succeeded",
                "entries": 41,
                "bytes": 123456789,
                "reason": "Completed",
                "message": "",
                "startedAt": "2025-01-02T03:00:00Z",
                "finishedAt": "2025-01-02T03:04:00+00:00",
            }
        ],
        "cache": {
            "entries": 41,
            "bytes": 123456789,
            "size": "117.7Mi",
            "versions": [{"jax": "0.6.0", "jaxlib": "0.6.0", "backend": "gpu", "deviceKind": "H100", "entries": 41}],
            "lastWarmed": "2025-01-02T03:04:05Z",
            "lastExpired": "2025-01-02T03:04:06Z",
        },
        "kopf": {"progress": {"anything": {"retries": 1}}},
    }
    status_schema = SCHEMA["properties"]["status"]
    assert validate(status_schema, status) == []
    bad = copy.deepcopy(status)
    bad["cache"]["lastWarmed"] = "yesterday"
    bad["pools"][0]["state"] = "Done"
    assert {v.path for v in validate(status_schema, bad)} == {"cache.lastWarmed", "pools[0].state"}


# --- the examples ------------------------------------------------------------------------


def test_examples_exist() -> None:
    names = {name.split(":")[1] for name, _ in EXAMPLE_CACHES}
    assert {"llama-pvc", "llama-gcs"} <= names


@pytest.mark.parametrize(("name", "cache"), EXAMPLE_CACHES, ids=[n for n, _ in EXAMPLE_CACHES])
def test_example_is_accepted(name: str, cache: dict[str, Any]) -> None:
    assert cache["apiVersion"] == f"{CRD['spec']['group']}/{VERSION}"
    assert [str(v) for v in validate(SCHEMA, cache)] == []


def test_defaults_fill_a_minimal_example() -> None:
    pvc = dict(EXAMPLE_CACHES)["cache-pvc.yaml:llama-pvc"]
    spec = apply_defaults(SCHEMA, pvc)["spec"]
    assert spec["mountPath"] == "/var/cache/compilecache"
    assert "groupBy" not in spec["warmup"]["discover"], "groupBy has no default: unset, it follows the nodes' labels"
    assert spec["warmup"]["discover"]["gpuResource"] == "nvidia.com/gpu"
    assert spec["warmup"]["jax"] == {"minCompileTimeSecs": 0, "minEntrySizeBytes": 0}
    assert spec["storage"]["pvc"]["deleteWithCache"] is False
    assert "mountPath" not in pvc["spec"], "defaulting must not change its input"


# --- bad specs fail with the intended rule -----------------------------------------------

# A small valid spec that each bad case below breaks in one way.
BASE: dict[str, Any] = {
    "apiVersion": "compilecache.dev/v1alpha1",
    "kind": "CompileCache",
    "metadata": {"name": "base"},
    "spec": {
        "storage": {"pvc": {"claimName": "cache", "create": {"size": "10Gi"}}},
        "warmup": {
            "image": "trainer:1",
            "workloads": [{"name": "step", "entrypoint": "pkg.mod:targets"}],
            "pools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}, "gpusPerPod": 8}],
        },
    },
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets ``spec.<path>`` (dotted, with integer list indexes) to ``value``."""

    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = obj["spec"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    """A mutation that removes ``spec.<path>``."""

    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = obj["spec"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return mutate


def _append(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation that appends ``value`` to the list at ``spec.<path>``."""

    def mutate(obj: dict[str, Any]) -> None:
        node: Any = obj["spec"]
        for part in path.split("."):
            node = node[int(part)] if part.isdigit() else node[part]
        node.append(value)

    return mutate


def _both(*mutations: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(obj)

    return mutate


TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# (id, mutation, path of the violation, kind of check, text the message starts with or contains)
BAD_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str, str]] = [
    (
        "both-storages",
        _set("storage.gcs", {"bucket": "b-1", "serviceAccountName": "w"}),
        "spec.storage",
        "cel",
        "storage must set exactly one of pvc or gcs",
    ),
    ("no-storage", _set("storage", {}), "spec.storage", "cel", "storage must set exactly one of pvc or gcs"),
    (
        "no-image-no-template",
        _delete("warmup.image"),
        "spec.warmup",
        "cel",
        "warmup must set image, or podTemplate to take training's image from it",
    ),
    (
        "template-spec-and-ref",
        _set("warmup.podTemplate", {"spec": {}, "templateRef": {"kind": "Job", "name": "train"}}),
        "spec.warmup.podTemplate",
        "cel",
        "podTemplate must set exactly one of spec or templateRef",
    ),
    (
        "template-ref-kind",
        _set("warmup.podTemplate", {"templateRef": {"kind": "Deployment", "name": "train"}}),
        "spec.warmup.podTemplate.templateRef.kind",
        "enum",
        "",
    ),
    ("storage-missing", _delete("storage"), "spec", "required", "'storage' is a required property"),
    ("no-workloads", _set("warmup.workloads", []), "spec.warmup.workloads", "minItems", ""),
    (
        "entrypoint-and-script",
        _set("warmup.workloads.0.script", "/app/x.py"),
        "spec.warmup.workloads[0]",
        "cel",
        "a workload must set exactly one of entrypoint or script",
    ),
    (
        "neither-entrypoint-nor-script",
        _delete("warmup.workloads.0.entrypoint"),
        "spec.warmup.workloads[0]",
        "cel",
        "a workload must set exactly one of entrypoint or script",
    ),
    (
        "args-without-script",
        _set("warmup.workloads.0.args", ["--x"]),
        "spec.warmup.workloads[0]",
        "cel",
        "a workload's args are only allowed with script",
    ),
    (
        "steps-without-script",
        _set("warmup.workloads.0.steps", 2),
        "spec.warmup.workloads[0]",
        "cel",
        "steps (the exact mode) runs a script",
    ),
    (
        "step-fn-without-script",
        _set("warmup.workloads.0.stepFn", "train_step"),
        "spec.warmup.workloads[0]",
        "cel",
        "stepFn names the function that steps counts, in a script",
    ),
    (
        "budget-without-script",
        _set("warmup.workloads.0.budget", "2m"),
        "spec.warmup.workloads[0]",
        "cel",
        "budget bounds steps auto",
    ),
    (
        "budget-with-a-step-count",
        _set("warmup.workloads.0", {"name": "t", "script": "/app/t.py", "steps": 2, "budget": "2m"}),
        "spec.warmup.workloads[0]",
        "cel",
        "budget bounds steps auto",
    ),
    (
        "steps-neither-count-nor-auto",
        _set("warmup.workloads.0", {"name": "t", "script": "/app/t.py", "steps": "all"}),
        "spec.warmup.workloads[0].steps",
        "pattern",
        "",
    ),
    (
        "steps-zero",
        _set("warmup.workloads.0", {"name": "t", "script": "/app/t.py", "steps": 0}),
        "spec.warmup.workloads[0].steps",
        "minimum",
        "",
    ),
    (
        "resume-without-steps",
        _set("warmup.workloads.0.resume", False),
        "spec.warmup.workloads[0]",
        "cel",
        "resume is a setting of the exact mode",
    ),
    (
        "resume-args-without-steps",
        _set("warmup.workloads.0.resumeArgs", ["--restore"]),
        "spec.warmup.workloads[0]",
        "cel",
        "resumeArgs are added to the resumed run",
    ),
    (
        "resume-when-with-resume-false",
        _set("warmup.workloads.0", {"name": "t", "script": "/app/t.py", "resume": False, "resumeWhen": "ckpt"}),
        "spec.warmup.workloads[0]",
        "cel",
        "resumeWhen says when the resumed run happens",
    ),
    (
        "empty-pools-no-discover",
        _set("warmup.pools", []),
        "spec.warmup",
        "cel",
        "warmup must set pools, discover, or both",
    ),
    (
        "neither-pools-nor-discover",
        _delete("warmup.pools"),
        "spec.warmup",
        "cel",
        "warmup must set pools, discover, or both",
    ),
    (
        "gpu-types-without-group-by",
        _set("warmup.discover", {"gpuTypes": [{"value": "nvidia-h100-80gb", "gpusPerPod": 8}]}),
        "spec.warmup.discover",
        "cel",
        "gpuTypes needs groupBy",
    ),
    (
        "gpu-types-duplicate-value",
        _set(
            "warmup.discover",
            {
                "groupBy": "cloud.google.com/gke-accelerator",
                "gpuTypes": [{"value": "nvidia-l4", "gpusPerPod": 1}, {"value": "nvidia-l4", "gpusPerPod": 2}],
            },
        ),
        "spec.warmup.discover.gpuTypes[1]",
        "listType",
        "Duplicate value",
    ),
    (
        "gpu-type-not-a-label-value",
        _set(
            "warmup.discover",
            {"groupBy": "cloud.google.com/gke-accelerator", "gpuTypes": [{"value": "h100 80gb", "gpusPerPod": 8}]},
        ),
        "spec.warmup.discover.gpuTypes[0].value",
        "pattern",
        "",
    ),
    (
        "malformed-duration",
        _set("lifecycle", {"maxAge": "7days"}),
        "spec.lifecycle.maxAge",
        "pattern",
        "7days",
    ),
    (
        "malformed-gate-timeout",
        _set("consumers", {"gateTimeout": "30 min"}),
        "spec.consumers.gateTimeout",
        "pattern",
        "30 min",
    ),
    (
        "malformed-quantity",
        _set("storage.pvc.create.size", "200GB"),
        "spec.storage.pvc.create.size",
        "pattern",
        "200GB",
    ),
    (
        "malformed-max-size",
        _set("lifecycle", {"maxSize": "-1Gi"}),
        "spec.lifecycle.maxSize",
        "pattern",
        "-1Gi",
    ),
    (
        "malformed-resource",
        _set("warmup.resources", {"limits": {"memory": "64 GiB"}}),
        "spec.warmup.resources.limits.memory",
        "pattern",
        "64 GiB",
    ),
    (
        "relative-mount-path",
        _set("mountPath", "var/cache/compilecache"),
        "spec.mountPath",
        "pattern",
        "var/cache",
    ),
    ("root-mount-path", _set("mountPath", "/"), "spec.mountPath", "pattern", "'/'"),
    # issue 9: the parser refused these while the CRD admitted them, or the reverse.
    (
        "name-longer-than-a-label-value",
        lambda obj: obj["metadata"].update(name="c" * 64),
        "<root>",
        "cel",
        "the name of a CompileCache is at most 63 characters",
    ),
    ("double-slash-mount-path", _set("mountPath", "//x"), "spec.mountPath", "pattern", "'//x'"),
    ("dot-dot-mount-path", _set("mountPath", "/var/../tmp"), "spec.mountPath", "pattern", "'/var/../tmp'"),
    ("tmp-mount-path", _set("mountPath", "/tmp"), "spec.mountPath", "cel", "mountPath must not be /tmp"),
    (
        "pull-secret-not-a-name",
        _set("warmup.imagePullSecrets", [{"name": "Not_A_Secret"}]),
        "spec.warmup.imagePullSecrets[0].name",
        "pattern",
        "Not_A_Secret",
    ),
    (
        "value-from-unknown-source",
        _set("warmup.workloads.0.env", [{"name": "A", "valueFrom": {"bogus": {"x": 1}}}]),
        "spec.warmup.workloads[0].env[0].valueFrom",
        "additionalProperties",
        "bogus",
    ),
    (
        "value-from-two-sources",
        _set(
            "warmup.workloads.0.env",
            [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "a"}, "secretKeyRef": {"key": "k"}}}],
        ),
        "spec.warmup.workloads[0].env[0].valueFrom",
        "maxProperties",
        "",
    ),
    (
        "value-from-without-key",
        _set("warmup.workloads.0.env", [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]),
        "spec.warmup.workloads[0].env[0].valueFrom.secretKeyRef",
        "required",
        "key",
    ),
    (
        "node-selector-value-too-long",
        _set("warmup.pools.0.nodeSelector", {"gpu": "h" * 64}),
        "spec.warmup.pools[0].nodeSelector.gpu",
        "maxLength",
        "",
    ),
    (
        "node-selector-value-not-a-label-value",
        _set("warmup.pools.0.nodeSelector", {"gpu": "H100 80GB"}),
        "spec.warmup.pools[0].nodeSelector.gpu",
        "pattern",
        "H100 80GB",
    ),
    (
        "negative-cpu",
        _set("warmup.resources", {"requests": {"cpu": "-1"}}),
        "spec.warmup.resources.requests.cpu",
        "pattern",
        "-1",
    ),
    (
        "negative-integer-memory",
        _set("warmup.resources", {"limits": {"memory": -1}}),
        "spec.warmup.resources.limits.memory",
        "minimum",
        "-1",
    ),
    (
        "gpu-resource-not-a-resource",
        _set("warmup.pools.0.gpuResource", "not a resource"),
        "spec.warmup.pools[0].gpuResource",
        "pattern",
        "not a resource",
    ),
    ("cron-four-fields", _set("schedule", "0 3 * *"), "spec.schedule", "pattern", "0 3 * *"),
    ("cron-words", _set("schedule", "every day at 3"), "spec.schedule", "pattern", "every day"),
    (
        "delete-with-cache-without-create",
        _both(_delete("storage.pvc.create"), _set("storage.pvc.deleteWithCache", True)),
        "spec.storage.pvc",
        "cel",
        "storage.pvc.deleteWithCache requires storage.pvc.create",
    ),
    (
        "bad-entrypoint",
        _set("warmup.workloads.0.entrypoint", "pkg/mod.py"),
        "spec.warmup.workloads[0].entrypoint",
        "pattern",
        "pkg/mod.py",
    ),
    (
        "workload-name-not-dns-label",
        _set("warmup.workloads.0.name", "Train_Step"),
        "spec.warmup.workloads[0].name",
        "pattern",
        "Train_Step",
    ),
    (
        "duplicate-workload",
        _append("warmup.workloads", {"name": "step", "script": "/a.py"}),
        "spec.warmup.workloads[1]",
        "listType",
        "Duplicate",
    ),
    (
        "duplicate-pool",
        _append("warmup.pools", {"name": "h100"}),
        "spec.warmup.pools[1]",
        "listType",
        "Duplicate",
    ),
    (
        "duplicate-topology",
        _set("warmup.topologies", [{"hosts": 2}, {"hosts": 2}]),
        "spec.warmup.topologies[1]",
        "listType",
        "Duplicate",
    ),
    ("no-topology", _set("warmup.topologies", []), "spec.warmup.topologies", "minItems", ""),
    ("zero-hosts", _set("warmup.topologies", [{"hosts": 0}]), "spec.warmup.topologies[0].hosts", "minimum", ""),
    ("too-many-hosts", _set("warmup.topologies", [{"hosts": 257}]), "spec.warmup.topologies[0].hosts", "maximum", ""),
    (
        "negative-gpus",
        _set("warmup.pools.0.gpusPerPod", -1),
        "spec.warmup.pools[0].gpusPerPod",
        "minimum",
        "",
    ),
    (
        "unknown-field",
        _set("warmup.pools.0.gpusPerNode", 8),
        "spec.warmup.pools[0]",
        "additionalProperties",
        "gpusPerNode",
    ),
    (
        "bad-pull-policy",
        _set("warmup.imagePullPolicy", "Sometimes"),
        "spec.warmup.imagePullPolicy",
        "enum",
        "",
    ),
    (
        "bucket-with-scheme",
        _both(_delete("storage.pvc"), _set("storage.gcs", {"bucket": "gs://b"})),
        "spec.storage.gcs.bucket",
        "pattern",
        "gs://b",
    ),
    (
        "env-value-and-value-from",
        _set(
            "warmup.workloads.0.env",
            [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        ),
        "spec.warmup.workloads[0].env[0]",
        "cel",
        "an env var sets value or valueFrom, not both",
    ),
    (
        "env-sets-cache-dir",
        _set("warmup.workloads.0.env", [{"name": "JAX_COMPILATION_CACHE_DIR", "value": "/x"}]),
        "spec.warmup.workloads[0].env[0]",
        "cel",
        "JAX cache settings and XLA_FLAGS come from",
    ),
    (
        "env-sets-xla-flags",
        _set("warmup.workloads.0.env", [{"name": "XLA_FLAGS", "value": "--x"}]),
        "spec.warmup.workloads[0].env[0]",
        "cel",
        "JAX cache settings and XLA_FLAGS come from",
    ),
    (
        "toleration-exists-with-value",
        _set("warmup.pools.0.tolerations", [{**TOLERATION, "value": "x"}]),
        "spec.warmup.pools[0].tolerations[0]",
        "cel",
        "a toleration with operator Exists must not set value",
    ),
    (
        "toleration-without-key",
        _set("warmup.pools.0.tolerations", [{"operator": "Equal", "value": "x"}]),
        "spec.warmup.pools[0].tolerations[0]",
        "cel",
        "a toleration without key must use operator Exists",
    ),
    (
        "toleration-seconds-without-no-execute",
        _set("warmup.discover", {"tolerations": [{**TOLERATION, "tolerationSeconds": 60}]}),
        "spec.warmup.discover.tolerations[0]",
        "cel",
        "tolerationSeconds is only allowed with effect NoExecute",
    ),
    (
        "selector-in-without-values",
        _set("consumers", {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}),
        "spec.consumers.podSelector.matchExpressions[0]",
        "cel",
        "operators In and NotIn need values",
    ),
    (
        "selector-exists-with-values",
        _set(
            "consumers",
            {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}},
        ),
        "spec.consumers.podSelector.matchExpressions[0]",
        "cel",
        "operators In and NotIn need values",
    ),
    (
        "selector-that-cannot-narrow",
        _set("consumers", {"podSelector": {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}}),
        "spec.consumers.podSelector",
        "cel",
        "podSelector must require a label the pods have",
    ),
    ("selector-empty", _set("consumers", {"podSelector": {}}), "spec.consumers.podSelector", "cel", "podSelector must"),
    (
        "gcs-reader-is-the-writer",
        _set("storage", {"gcs": {"bucket": "b-1", "serviceAccountName": "w", "readerServiceAccountName": "w"}}),
        "spec.storage.gcs",
        "cel",
        "storage.gcs.readerServiceAccountName must differ from storage.gcs.serviceAccountName",
    ),
    (
        "gcs-reader-is-the-warmup-writer",
        _both(
            _set("storage", {"gcs": {"bucket": "b-1", "readerServiceAccountName": "w"}}),
            _set("warmup.serviceAccountName", "w"),
        ),
        "spec",
        "cel",
        "storage.gcs.readerServiceAccountName must not be warmup.serviceAccountName",
    ),
    (
        "gcs-without-a-writer",
        _set("storage", {"gcs": {"bucket": "b-1", "readerServiceAccountName": "r"}}),
        "spec",
        "cel",
        "a GCS cache names its writer, storage.gcs.serviceAccountName",
    ),
    (
        "gcs-writer-is-default",
        _set("storage", {"gcs": {"bucket": "b-1", "serviceAccountName": "default"}}),
        "spec.storage.gcs",
        "cel",
        "storage.gcs.serviceAccountName (the writer) must not be default",
    ),
    (
        "gcs-warmup-writer-is-default",
        _both(_set("storage", {"gcs": {"bucket": "b-1"}}), _set("warmup.serviceAccountName", "default")),
        "spec",
        "cel",
        "warmup.serviceAccountName of a GCS cache (its writer) must not be default",
    ),
]


def test_base_is_valid() -> None:
    # Otherwise a bad case could fail for a reason other than its own mutation.
    assert validate(SCHEMA, BASE) == []


@pytest.mark.parametrize(("mutate", "path", "kind", "text"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_spec_is_rejected(mutate: Callable[[dict[str, Any]], None], path: str, kind: str, text: str) -> None:
    obj = copy.deepcopy(BASE)
    mutate(obj)
    found = validate(SCHEMA, obj)
    assert found, "the bad spec was accepted"
    # Exactly the intended failure: one violation, at the intended field, of the intended kind.
    assert [(v.path, v.kind) for v in found] == [(path, kind)], [str(v) for v in found]
    assert text in found[0].message


# Updates the transition rules (oldSelf) refuse: (id, field changed, old value, new value, message start).
BAD_UPDATES: list[tuple[str, str, Any, Any, str]] = [
    ("framework-changed", "framework", "jax", "pytorch", "framework cannot be changed"),
]


@pytest.mark.parametrize(("field", "old", "new", "text"), [c[1:] for c in BAD_UPDATES], ids=[c[0] for c in BAD_UPDATES])
def test_bad_update_is_rejected_and_an_unchanged_one_is_not(field: str, old: Any, new: Any, text: str) -> None:
    before, after = copy.deepcopy(BASE), copy.deepcopy(BASE)
    _set(field, old)(before)
    _set(field, new)(after)
    assert validate(SCHEMA, after) == [], "the new object alone must be valid: only the change is refused"
    found = update_violations(SCHEMA, apply_defaults(SCHEMA, before), apply_defaults(SCHEMA, after))
    assert [(v.path, v.kind) for v in found] == [(f"spec.{field}", "cel")], [str(v) for v in found]
    assert found[0].message.startswith(text)
    assert update_violations(SCHEMA, apply_defaults(SCHEMA, after), apply_defaults(SCHEMA, after)) == []


def test_every_rule_is_exercised_by_a_bad_case() -> None:
    # A rule no bad case trips could be always-true (e.g. a typo'd field under has()).
    messages = {" ".join(rule["message"].split()) for _, rule in iter_rules(SCHEMA)}
    tripped = {text for _, _, _, kind, text in BAD_CASES if kind == "cel"} | {c[-1] for c in BAD_UPDATES}
    untested = {m for m in messages if not any(m.startswith(t) for t in tripped)}
    assert untested == set()


# --- the checker itself can fail ---------------------------------------------------------


def _mutated_schema(mutate: Callable[[Schema], None]) -> Schema:
    schema = copy.deepcopy(SCHEMA)
    mutate(schema)
    return schema


def _spec(schema: Schema) -> Schema:
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: _spec(s)["properties"]["mountPath"].pop("type"), "spec.mountPath: no type"),
        (lambda s: _spec(s)["required"].append("nope"), "spec: required field 'nope'"),
        (
            lambda s: _spec(s)["properties"]["warmup"]["properties"]["workloads"]["items"]["required"].clear(),
            "spec.warmup.workloads: map key 'name' must be required",
        ),
        (
            lambda s: _spec(s)["properties"]["warmup"]["properties"]["resources"]["properties"]["limits"][
                "additionalProperties"
            ]["anyOf"].append({"type": "number", "description": "x"}),
            "not allowed inside a logical junctor",
        ),
        (lambda s: s["properties"]["metadata"].update(description="x"), "metadata: only `type: object`"),
    ],
    ids=["missing-type", "unknown-required", "list-map-key-optional", "typed-junctor", "metadata-described"],
)
def test_structural_checker_notices(mutate: Callable[[Schema], None], expected: str) -> None:
    problems = structural_violations(_mutated_schema(mutate))
    assert any(expected in p for p in problems), problems


def test_description_checker_notices() -> None:
    schema = _mutated_schema(lambda s: _spec(s)["properties"]["schedule"].update(description=" "))
    assert undescribed_fields(schema) == ["spec.schedule"]


def test_cel_errors_are_reported_not_swallowed() -> None:
    # Reading an absent field without has() is an evaluation error; the API server rejects
    # the object, and so must the checker (celError), rather than treat it as true or false.
    schema: Schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "self.a == 'x'", "message": "a must be x"}],
    }
    assert cel_violations(schema, {"a": "x"}) == []
    assert cel_violations(schema, {"a": "y"}) == [Violation("<root>", "cel", "a must be x")]
    assert [v.kind for v in cel_violations(schema, {})] == ["celError"]


# --- docs/resource.md is the contract ----------------------------------------------------


def _doc_rows(section: str) -> list[list[str]]:
    """The table rows (cells, stripped) under ``## <section>`` in docs/resource.md."""
    text = (ROOT / "docs" / "resource.md").read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    # No cell of these tables contains a "|", so a plain split is exact (empty cells included).
    rows = [line.strip().strip("|").split("|") for line in body.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row] for row in rows]


def _doc_path(cell: str, root: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return f"{root}.{cell.strip('`')}"


def test_documented_spec_fields_match_the_schema() -> None:
    nodes = dict(iter_nodes(SCHEMA))
    rows = _doc_rows("spec")
    assert len(rows) > 40
    assert {len(cells) for cells in rows} == {4}, "a spec row is not | field | type | default | meaning |"
    for cells in rows:
        path, default = _doc_path(cells[0], "spec"), cells[2]
        assert path in nodes, f"docs/resource.md documents {path}, the CRD lacks it"
        if default.startswith("`") and default.endswith("`") and default.count("`") == 2:
            # A literal default in the docs must be the CRD's, value for value.
            assert nodes[path].get("default") == yaml.safe_load(default.strip("`")), path
        else:
            # Prose ("cluster default", "all pools") means the operator decides, not the schema.
            assert "default" not in nodes[path], f"{path} has a CRD default the docs do not show"


def test_every_spec_field_is_documented() -> None:
    # A field counts as documented when it, an ancestor (a Kubernetes shape such as a
    # Toleration) or a descendant (an intermediate object) has a row.
    documented = {_doc_path(cells[0], "spec") for cells in _doc_rows("spec")}
    undocumented = [
        path
        for path, _ in iter_nodes(SCHEMA["properties"]["spec"], "spec")
        if path != "spec"
        and not any(d == path or path.startswith((f"{d}.", f"{d}[", f"{d}{{")) for d in documented)
        and not any(d.startswith((f"{path}.", f"{path}[")) for d in documented)
    ]
    assert undocumented == []


def test_documented_status_fields_match_the_schema() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    documented = {cells[0].strip("`").removesuffix("[]") for cells in _doc_rows("status")}
    assert documented == set(status)
