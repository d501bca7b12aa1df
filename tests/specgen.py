"""Hypothesis strategies for CompileCaches the CRD admits, built from the CRD's own schema.

Every field's strategy comes from its schema node (type, enum, pattern, minLength/maxLength,
minimum, maxItems, list-map keys), so a field added to the CRD is generated without a change
here. Strings mix what the pattern generates with edge values that the node admits: names at
63 and 253 characters, label values with dots and underscores, upper case, unicode. A few
nodes whose CEL rules tie fields together (exactly one of pvc/gcs, entrypoint/script, a
toleration's operator and value, ...) get hand-written strategies, so that most drawn objects
pass; :func:`cache_objects` still checks each against the CRD (crdschema.validate: OpenAPI,
list types and CEL) and rejects the rest, so nothing inadmissible reaches a test.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from compilecache.controller.accelerators import ACCELERATOR_LABELS
from crdschema import Schema, apply_defaults, validate

_LIST_CAP = 3  # items per generated list: enough for duplicates, conflicts and order
_MAP_CAP = 3
_TEXT_CAP = 40  # length of free text when a node has no maxLength

_LABEL_VALUES = [
    "NVIDIA-H100-80GB-HBM3",
    "nvidia-h100-80gb-hbm3",
    "a" * 63,
    "A.b_c-D",
    "x",
    "",
    "9",
    "true",
]
_LABEL_KEYS = [
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "example.com/" + "k" * 63,
    "k" * 63,
    "Upper_Case.key",
    "a" * 253 + "/b",  # prefix over 253 with the slash: not a label key
    "a/b/c",
    "bad key",
    "é",
    "",
]  # in the edge values of every string
_RESOURCE_NAMES = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "hugepages-2Mi",
    "nvidia.com/gpu",
    "amd.com/gpu",
    "example.com/fpga",
    "gpu",
    "kubernetes.io/thing",
    "requests.example.com/x",
]


def _edge_strings(max_length: int) -> list[str]:
    label = "a" * 63
    subdomain = ".".join([label, label, label, "a" * 61])  # 253 characters
    return [
        "a" * max_length,
        "a",
        label,
        "a" * 64,
        subdomain,
        subdomain + "a",
        "a-b.c_d",
        "A" * 63,
        "0" * 63,
        "x" * (max_length - 1) + "-",
        "é" * min(max_length, 63),
        "日本語",
        "a b",
        "a..b",
        *_LABEL_VALUES,
        *_LABEL_KEYS,
    ]


def string(node: Schema) -> st.SearchStrategy[str]:
    """Strings ``node`` admits: from its pattern, plus edge values that match it."""
    return _string(int(node.get("minLength", 0)), int(node.get("maxLength", _TEXT_CAP)), node.get("pattern"))


# Strategies are built once and reused: hypothesis validates a new strategy object (and compiles
# its regex) on first use, which cost most of a draw when every draw built its own (the property
# tests drew for minutes). The same structure draws the same examples from the same choices.
@functools.cache
def _string(low: int, high: int, pattern: str | None) -> st.SearchStrategy[str]:

    def fits(text: str) -> bool:
        return low <= len(text) <= high and (pattern is None or re.search(pattern, text) is not None)

    if pattern is not None:
        base = st.from_regex(pattern, fullmatch=True)
    else:
        base = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=min(high, _TEXT_CAP))
    edges = [text for text in _edge_strings(high) if fits(text)]
    if not edges:
        return base.filter(fits)
    # Mostly what the pattern generates, one draw in six an edge value.
    edge, generated = st.sampled_from(edges), base.filter(fits)
    return st.integers(0, 5).flatmap(lambda pick: edge if pick == 0 else generated)


def _integer(node: Schema) -> st.SearchStrategy[int]:
    high = 2**31 - 1 if node.get("format") == "int32" else 2**53
    high = min(high, int(node["maximum"])) if "maximum" in node else high
    low = int(node["minimum"]) if "minimum" in node else -(2**31)
    return st.one_of(st.integers(low, min(high, low + 10_000)), st.sampled_from([low, high]))


def from_schema(node: Schema, path: str = "", *, override: bool = True) -> st.SearchStrategy[Any]:
    """A strategy for values of ``node`` (``path`` in crdschema's notation picks overrides)."""
    if override and path in OVERRIDES:
        return OVERRIDES[path](node, path)
    if node.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(-5, 2**40), string(node))
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "string":
        return string(node)
    if kind == "integer":
        return _integer(node)
    if kind == "number":
        return st.floats(float(node.get("minimum", -1e6)), 1e6, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        items = from_schema(node["items"], f"{path}[]")
        keys = node.get("x-kubernetes-list-map-keys")
        unique_by: Callable[[Any], Any] | None = None
        if node.get("x-kubernetes-list-type") == "map" and keys:
            unique_by = lambda item: tuple(item.get(key) for key in keys)  # noqa: E731
        elif node.get("x-kubernetes-list-type") == "set":
            unique_by = lambda item: item  # noqa: E731
        return st.lists(
            items,
            min_size=int(node.get("minItems", 0)),
            max_size=min(int(node.get("maxItems", _LIST_CAP)), _LIST_CAP),
            unique_by=unique_by,
        )
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        keys = MAP_KEYS.get(path, string({"pattern": _QN, "minLength": 1, "maxLength": 316}))
        return st.dictionaries(keys, from_schema(node["additionalProperties"], f"{path}{{}}"), max_size=_MAP_CAP)
    if kind == "object":
        properties = node.get("properties", {})
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {name: from_schema(child, _join(path, name)) for name, child in properties.items() if name in required},
            optional={
                name: from_schema(child, _join(path, name))
                for name, child in properties.items()
                if name not in required
            },
        )
    raise ValueError(f"{path}: no strategy for {node}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


_QN = (
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
)


def _without(node: Schema, *names: str) -> Schema:
    trimmed = copy.deepcopy(dict(node))
    for name in names:
        trimmed.get("properties", {}).pop(name, None)
        if name in trimmed.get("required", []):
            trimmed["required"] = [r for r in trimmed["required"] if r != name]
    trimmed.pop("x-kubernetes-validations", None)
    return trimmed


def _storage(node: Schema, path: str) -> st.SearchStrategy[dict[str, Any]]:
    props = node["properties"]
    return st.one_of(
        from_schema(props["pvc"], f"{path}.pvc").map(lambda pvc: {"pvc": pvc}),
        from_schema(props["gcs"], f"{path}.gcs").map(lambda gcs: {"gcs": gcs}),
    )


def _workload(node: Schema, path: str) -> st.SearchStrategy[dict[str, Any]]:
    props = node["properties"]
    base = from_schema(_without(node, "entrypoint", "script", "args"), path, override=False)
    entry = st.fixed_dictionaries({"entrypoint": string(props["entrypoint"])})
    script = st.fixed_dictionaries(
        {"script": string(props["script"])}, optional={"args": from_schema(props["args"], f"{path}.args")}
    )
    return st.tuples(base, st.one_of(entry, script)).map(lambda pair: {**pair[0], **pair[1]})


def _env(node: Schema, path: str) -> st.SearchStrategy[dict[str, Any]]:
    props = node["properties"]
    source = st.one_of(
        st.just({}),
        string(props["value"]).map(lambda value: {"value": value}),
        _value_from(props["valueFrom"], f"{path}.valueFrom").map(lambda value: {"valueFrom": value}),
    )
    return st.tuples(string(props["name"]), source).map(lambda pair: {"name": pair[0], **pair[1]})


def _value_from(node: Schema, path: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        [
            from_schema(child, f"{path}.{name}").map(lambda ref, name=name: {name: ref})
            for name, child in node["properties"].items()
        ]
    )


def _toleration(node: Schema, path: str) -> st.SearchStrategy[dict[str, Any]]:
    props = node["properties"]
    effect = st.sampled_from(props["effect"]["enum"])
    exists = st.fixed_dictionaries(
        {"operator": st.just("Exists")}, optional={"key": string(props["key"]), "effect": effect}
    )
    equal = st.fixed_dictionaries(
        {"key": string(props["key"]).filter(bool)},
        optional={"operator": st.just("Equal"), "value": string(props["value"]), "effect": effect},
    )
    seconds = st.integers(0, 3600).map(lambda s: {"effect": "NoExecute", "tolerationSeconds": s})
    return st.tuples(st.one_of(exists, equal), st.one_of(st.just({}), seconds)).map(lambda p: {**p[0], **p[1]})


def _requirement(node: Schema, path: str) -> st.SearchStrategy[dict[str, Any]]:
    props = node["properties"]
    key = string(props["key"])
    values = from_schema(props["values"], f"{path}.values")
    with_values = st.fixed_dictionaries(
        {"key": key, "operator": st.sampled_from(["In", "NotIn"]), "values": values.filter(bool)}
    )
    without = st.fixed_dictionaries({"key": key, "operator": st.sampled_from(["Exists", "DoesNotExist"])})
    return st.one_of(with_values, without)


_TEMPLATE_VOLUMES = [  # what a training template may bring, and what the policy refuses (hostPath, nfs)
    {"persistentVolumeClaim": {"claimName": "training-data"}},
    {"configMap": {"name": "train-config"}},
    {"secret": {"secretName": "hf-token"}},
    {"emptyDir": {}},
    {"hostPath": {"path": "/"}},
    {"nfs": {"server": "nfs.example", "path": "/export"}},
]
_TEMPLATE_PATHS = ["/data", "/etc/train", "/data/in", "/tmp", "/var/cache/compilecache", "/", "data", "/a/../b"]


@st.composite
def template_pod_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Training's pod spec (``podTemplate.spec`` preserves unknown fields: the schema says nothing)."""
    label = string({"maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"})
    volumes = draw(
        st.lists(
            st.tuples(label, st.sampled_from(_TEMPLATE_VOLUMES)).map(lambda pair: {"name": pair[0], **pair[1]}),
            max_size=3,
            unique_by=lambda volume: volume["name"],
        )
    )
    names = [volume["name"] for volume in volumes] or ["none"]
    mounts = draw(
        st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(names), "mountPath": st.sampled_from(_TEMPLATE_PATHS)},
                optional={"readOnly": st.booleans(), "mountPropagation": st.just("Bidirectional")},
            ),
            max_size=3,
        )
    )
    env_names = st.sampled_from(["DATA", "TMPDIR", "HOME", "JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS", "bad name"])
    container = st.fixed_dictionaries(
        {"name": label},
        optional={
            "env": st.lists(st.fixed_dictionaries({"name": env_names, "value": st.sampled_from(["1", "/data"])})),
            "envFrom": st.lists(st.sampled_from([{"configMapRef": {"name": "c"}}, {"secretRef": {"name": "s"}}])),
            "workingDir": st.sampled_from(["/app", "app"]),
            "command": st.sampled_from([["python", "/app/train.py"], ["/bin/sh", "-c", "x"]]),
            "args": st.lists(st.sampled_from(["--data", "/data/train.bin", "--steps", "3"]), max_size=4),
            "securityContext": st.just({"privileged": True}),  # never taken
        },
    )
    spec: dict[str, Any] = {"containers": [{**draw(container), "volumeMounts": mounts}], "volumes": volumes}
    if draw(st.booleans()):
        spec["serviceAccountName"] = draw(st.sampled_from(["default", "training", "namespace-admin"]))
    if draw(st.booleans()):
        spec["imagePullSecrets"] = [{"name": "pull"}]
    if draw(st.booleans()):
        spec["hostNetwork"] = True  # never taken
    return spec


OVERRIDES: dict[str, Callable[[Schema, str], st.SearchStrategy[Any]]] = {
    "spec.warmup.podTemplate.spec": lambda node, path: template_pod_specs(),
    "spec.storage": _storage,
    "spec.warmup.workloads[]": _workload,
    "spec.warmup.workloads[].env[]": _env,
    "spec.warmup.pools[].tolerations[]": _toleration,
    "spec.warmup.discover.tolerations[]": _toleration,
    "spec.consumers.podSelector.matchExpressions[]": _requirement,
    # Mostly real schedules (the pattern alone draws words that are no month or weekday names).
    "spec.schedule": lambda node, path: st.one_of(
        st.sampled_from(["0 3 * * *", "*/15 * * * *", "0 0 29 2 *", "0 0 30 2 *", "5-1 * * * *", "0 9 * * mon-fri"]),
        string(node),
    ),
    # Mostly topologies that the node sets below can place (up to 3 nodes a pool), and the edges.
    "spec.warmup.topologies[].hosts": lambda node, path: st.one_of(st.integers(1, 4), _integer(node)),
    # No kopf bookkeeping or status in a spec test.
    "status": lambda node, path: st.just({}),
}

MAP_KEYS: dict[str, st.SearchStrategy[str]] = {
    "spec.warmup.resources.requests": st.sampled_from(_RESOURCE_NAMES),
    "spec.warmup.resources.limits": st.sampled_from(_RESOURCE_NAMES),
}

_NAME = string({"maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"})


_SPEC_STRATEGIES: dict[int, tuple[Schema, st.SearchStrategy[dict[str, Any]]]] = {}


def _spec_strategy(schema: Schema) -> st.SearchStrategy[dict[str, Any]]:
    """``from_schema`` of the spec, built once per schema (the schema is kept, so its id stays its own)."""
    if id(schema) not in _SPEC_STRATEGIES:
        _SPEC_STRATEGIES[id(schema)] = (schema, from_schema(schema["properties"]["spec"], "spec"))
    return _SPEC_STRATEGIES[id(schema)][1]


@st.composite
def cache_objects(draw: st.DrawFn, schema: Schema) -> dict[str, Any]:
    """A CompileCache the CRD admits, as the API server stores it (defaults applied)."""
    spec = draw(_spec_strategy(schema))
    warmup = spec["warmup"]
    pool_names = [pool["name"] for pool in warmup.get("pools", [])]
    if pool_names and draw(st.booleans()):
        # Mostly coherent workload pools, so that most examples get as far as manifests.
        for workload in warmup["workloads"]:
            chosen = draw(st.lists(st.sampled_from(pool_names), unique=True, max_size=len(pool_names)))
            if chosen:
                workload["pools"] = chosen
            else:
                workload.pop("pools", None)
    obj = {
        "apiVersion": "compilecache.dev/v1alpha1",
        "kind": "CompileCache",
        "metadata": {"name": draw(_NAME), "namespace": "default", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }
    obj = apply_defaults(schema, obj)
    assume(not validate(schema, obj))
    return obj


@st.composite
def node_sets(draw: st.DrawFn, cache: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Nodes for the cache's pools: explicit pools' selectors, and discovered groups with odd label values."""
    warmup = cache["spec"]["warmup"]
    nodes = []
    valid_values = _VALID_LABEL_VALUES

    def node(labels: dict[str, str], resource: str) -> dict[str, Any]:
        gpus = draw(st.sampled_from(["0", "1", "4", "8", "16"]))
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"node-{len(nodes)}", "labels": labels},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", resource: gpus}},
        }

    # Up to 3 nodes a pool: multi-host topologies (warmup.topologies) get placed, or TooFewNodes.
    for pool in warmup.get("pools", []):
        for _ in range(draw(st.integers(0, 3))):
            nodes.append(node(dict(pool.get("nodeSelector") or {}), pool.get("gpuResource", "nvidia.com/gpu")))
    discover = warmup.get("discover")
    if discover is not None:
        for value in draw(st.lists(valid_values, max_size=3)):
            if "groupBy" in discover:
                group = {discover["groupBy"]: value}
            else:  # unset: the nodes carry one of the accelerator labels clouds and GPU operators set
                entry = draw(st.sampled_from(ACCELERATOR_LABELS))
                group = {entry.key: value, entry.group_key: value}
            labels = {**(discover.get("nodeSelector") or {}), **group}
            for _ in range(draw(st.integers(1, 3))):
                nodes.append(node(labels, discover.get("gpuResource", "nvidia.com/gpu")))
    return nodes


_LV = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_VALID_LABEL_VALUES = st.one_of(
    st.sampled_from([v for v in _LABEL_VALUES if v]), string({"maxLength": 63, "pattern": _LV})
)
