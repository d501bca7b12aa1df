"""Any spec the CRD admits gives objects the API server accepts, or a SpecError naming a real field.

Issue 9, item 2: hypothesis draws CompileCaches from the CRD's own schema (tests/specgen.py; each
checked against the CRD with tests/crdschema.py, CEL included) and a synthetic node set, runs
the operator's pure pass (``plan()``, pass after pass, as the cluster runs what it creates: the
claim, the warm-up Jobs, the expiry Job) and requires either

- objects that pass kubernetes-validate (strict) for Kubernetes 1.30-1.35 and the API server's
  own name and label rules, which no OpenAPI schema carries (:func:`api_server_rules`), or
- a Failed status naming a field (``invalid spec: FIELD: ...``) that exists in the cache.

The CI run is bounded and seeded (derandomize); ``-m slow`` runs a longer one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import specs
from compilecache.cache import units
from compilecache.controller import api, expiryjob, jobs, plan, policy, runtime, status
from compilecache.controller.api import SpecError
from compilecache.controller.pools import resolve_pools
from compilecache.controller.snapshot import Cache, Snapshot
from compilecache.local.validation import dns1035_label
from crdschema import load_crd, openapi_schema
from k8snames import KUBERNETES_VERSIONS
from specgen import cache_objects, node_sets
from specs import OPEN_POLICY

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = openapi_schema(load_crd(ROOT / "crds" / "compilecache.yaml"), "v1alpha1")
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage", "storage"}


# --- the API server's rules that no schema carries -------------------------------------------


def api_server_rules(obj: Mapping[str, Any]) -> list[str]:
    """Violations of the name, label and resource rules kube-apiserver applies to ``obj``.

    From ``k8s.io/apimachinery/pkg/util/validation`` (DNS-1123 names, qualified names, label
    values) and ``pkg/apis/core/validation`` (containers, volumes, mounts, resources). A Job's name
    must also be a label value: the Job controller labels its pods with it (``job-name``); an
    Indexed Job's pods get the hostname ``<name>-<index>``, a DNS-1123 label, and their
    ``subdomain`` must be one too. A Service's name is a DNS-1035 label (a letter first).
    """
    found: list[str] = []
    kind, meta = obj["kind"], obj["metadata"]
    name = meta["name"]
    if not api.is_dns_subdomain(name):
        found.append(f"{kind} name {name!r} is not a DNS subdomain")
    if kind == "Job" and not api.is_label_value(name):
        found.append(f"Job name {name!r} is not a label value (the job-name pod label)")
    if kind == "Service":
        if dns1035_label(name):
            found.append(f"Service name {name!r} is not a DNS-1035 label")
        found += _labels(obj["spec"].get("selector") or {}, "Service selector")
    if kind == "Job" and obj["spec"].get("completionMode") == "Indexed":
        last = f"{name}-{obj['spec']['completions'] - 1}"
        if not api.is_dns_label(last):
            found.append(f"hostname {last!r} of the last index is not a DNS label")
        subdomain = obj["spec"]["template"]["spec"].get("subdomain", "")
        if not api.is_dns_label(subdomain):
            found.append(f"subdomain {subdomain!r} is not a DNS label")
        for term in obj["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]:
            found += _labels(term["labelSelector"].get("matchLabels") or {}, "anti-affinity selector")
    found += _labels(meta.get("labels") or {}, f"{kind} labels")
    found += _labels(meta.get("annotations") or {}, f"{kind} annotations", values=False)
    if kind == "PersistentVolumeClaim":
        spec = obj["spec"]
        if "storageClassName" in spec and not api.is_dns_subdomain(spec["storageClassName"]):
            found.append(f"storageClassName {spec['storageClassName']!r}")
        found += _quantity(spec["resources"]["requests"]["storage"], "claim size")
    if kind == "Job":
        template = obj["spec"]["template"]
        found += _labels(template["metadata"].get("labels") or {}, "pod labels")
        found += list(_pod_spec(template["spec"]))
    return found


def _labels(labels: Mapping[str, Any], where: str, *, values: bool = True) -> list[str]:
    found = [f"{where}: key {key!r}" for key in labels if not api.is_qualified_name(key)]
    if values:
        found += [f"{where}: value {v!r} of {k}" for k, v in labels.items() if not api.is_label_value(str(v))]
    return found


def _quantity(value: Any, where: str) -> list[str]:
    try:
        quantity = units.parse_quantity(value)
    except ValueError:
        return [f"{where}: {value!r} is not a quantity"]
    return [f"{where}: {value!r} is negative"] if quantity < 0 else []


def _pod_spec(pod: Mapping[str, Any]) -> Iterator[str]:
    yield from _labels(pod.get("nodeSelector") or {}, "nodeSelector")
    for account in [pod.get("serviceAccountName")] + [s["name"] for s in pod.get("imagePullSecrets", [])]:
        if account is not None and not api.is_dns_subdomain(account):
            yield f"{account!r} is not a DNS subdomain"
    volumes = [volume["name"] for volume in pod.get("volumes", [])]
    if len(set(volumes)) != len(volumes) or not all(api.is_dns_label(v) for v in volumes):
        yield f"volume names {volumes}"
    for volume in pod.get("volumes", []):
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim is not None and not api.is_dns_subdomain(claim):
            yield f"claimName {claim!r}"
    for toleration in pod.get("tolerations", []):
        key, value = toleration.get("key", ""), toleration.get("value", "")
        if key and not api.is_qualified_name(key):
            yield f"toleration key {key!r}"
        if not api.is_label_value(value):
            yield f"toleration value {value!r}"
        if toleration.get("operator") == "Exists" and value:
            yield "toleration Exists with a value"
        if not key and toleration.get("operator", "Equal") != "Exists":
            yield "toleration without key must use Exists"
    containers = [*pod.get("initContainers", []), *pod["containers"]]
    names = [container["name"] for container in containers]
    if len(set(names)) != len(names) or not all(api.is_dns_label(n) for n in names):
        yield f"container names {names}"
    for container in containers:
        yield from _container(container, set(volumes))


def _container(container: Mapping[str, Any], volumes: set[str]) -> Iterator[str]:
    where = f"container {container['name']}"
    image = container["image"]
    if image != image.strip() or not image:
        yield f"{where}: image {image!r} has surrounding whitespace"
    paths = [mount["mountPath"] for mount in container.get("volumeMounts", [])]
    if len(set(paths)) != len(paths):
        yield f"{where}: duplicate mountPath in {paths}"
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in volumes:
            yield f"{where}: mount of unknown volume {mount['name']}"
        if ".." in mount["mountPath"].split("/") or ":" in mount["mountPath"]:
            yield f"{where}: mountPath {mount['mountPath']!r}"
    for env in container.get("env", []):
        if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", env["name"]):
            yield f"{where}: env name {env['name']!r}"
        if "value" in env and "valueFrom" in env:
            yield f"{where}: env {env['name']} sets value and valueFrom"
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for kind, values in (("requests", requests), ("limits", limits)):
        for name, value in values.items():
            standard = name in _STANDARD_RESOURCES or name.startswith("hugepages-")
            if not (standard if "/" not in name else api.is_extended_resource_name(name)):
                yield f"{where}: {kind} of {name!r}, not a resource name"
            yield from _quantity(value, f"{where}: {kind}.{name}")
    for name, request in requests.items():
        if name in limits and _parsed(request) > _parsed(limits[name]):
            yield f"{where}: requests.{name} above limits"
        if "/" in name and (name not in limits or _parsed(request) != _parsed(limits[name])):
            yield f"{where}: extended resource {name} requests without equal limits"


def _parsed(value: Any) -> Any:
    try:
        return units.parse_quantity(value)
    except ValueError:
        return 0


def field_exists(obj: Any, field: str) -> bool:
    """Whether ``field`` (``spec.a.b[2].c``; map keys may contain dots and slashes) names a value in ``obj``."""
    if field == "":
        return True
    if field.startswith("["):
        close = field.index("]")
        index = int(field[1:close])
        return isinstance(obj, list) and 0 <= index < len(obj) and field_exists(obj[index], field[close + 1 :])
    field = field.removeprefix(".")
    if not isinstance(obj, Mapping):
        return False
    for key in sorted(obj, key=lambda k: -len(str(k))):  # longest first: "nvidia.com/gpu" before "nvidia"
        rest = field[len(str(key)) :]
        if field.startswith(str(key)) and (rest == "" or rest[0] in ".[") and field_exists(obj[key], rest):
            return True
    return False


# --- the property ------------------------------------------------------------------------------


NOW = "2026-11-22T10:00:00Z"
_KINDS = ("Job", "PersistentVolumeClaim", "Service", "PodTemplate", "ProvisioningRequest")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def provisioning_request_problems(obj: Mapping[str, Any]) -> list[str]:
    """What Cluster Autoscaler's ProvisioningRequest CRD refuses, from its kubebuilder markers
    (apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go): podSets 1..32, each count >= 1 and a
    podTemplateRef name that is a DNS subdomain of at most 253; the class likewise; at most 100
    parameters, each value at most 255 characters."""
    spec = obj.get("spec") or {}
    problems = []
    klass = spec.get("provisioningClassName") or ""
    if not (_SUBDOMAIN.match(klass) and len(klass) <= 253):
        problems.append(f"provisioningClassName {klass!r}")
    sets = spec.get("podSets") or []
    if not 1 <= len(sets) <= 32:
        problems.append(f"{len(sets)} podSets")
    for item in sets:
        name = (item.get("podTemplateRef") or {}).get("name") or ""
        if not (_SUBDOMAIN.match(name) and len(name) <= 253) or int(item.get("count") or 0) < 1:
            problems.append(f"podSet {item}")
    parameters = spec.get("parameters") or {}
    if len(parameters) > 100 or any(not isinstance(v, str) or len(v) > 255 for v in parameters.values()):
        problems.append("parameters")
    return problems


_INVALID = re.compile(r"^(invalid spec|refused by the operator's policy): (?P<field>[^:]+): ")


def manifests(
    cache: Mapping[str, Any], nodes: list[dict[str, Any]], rules: policy.Policy = OPEN_POLICY
) -> list[dict[str, Any]]:
    """What the operator's passes create for ``cache`` on ``nodes``: ``plan()`` run pass after pass.

    Each pass's creations come back in the next snapshot as the cluster would have them (the
    claim Bound, every warm-up Job Complete), so the passes reach the expiry Job too. A cache the
    operator refuses raises the SpecError its Failed status names (``invalid spec: FIELD: ...``).
    """
    # By default every spec the CRD admits, under a policy that refuses nothing (test_policy.py: the policy).
    snap = Snapshot(Cache.read(cache), nodes=tuple(nodes), policy=rules)
    created: dict[str, dict[str, Any]] = {}
    for _ in range(4):  # claim and warm-up Jobs, then the expiry Job, then nothing
        decided = plan.plan(snap, NOW)
        invalid = _INVALID.match(str(decided.status.get("message") or ""))
        if decided.status.get("phase") == status.FAILED and invalid:
            raise SpecError(invalid["field"], decided.status["message"])
        if decided.status.get("phase") == status.FAILED:  # valid input fails only where no pool can warm
            active = [p for p in decided.status.get("pools") or [] if p["state"] != status.POOL_NO_NODES]
            assert active and all(p["state"] in status.NOT_WARMED and p.get("reason") for p in active), decided.status
        if not decided.creates:
            break
        for create in decided.creates:
            created[create.key] = dict(create.manifest)
        snap = _after_the_cluster_ran(snap, decided)
    return list(created.values())


def _after_the_cluster_ran(snap: Snapshot, decided: plan.Plan) -> Snapshot:
    made = {kind: [dict(c.manifest) for c in decided.creates if c.manifest["kind"] == kind] for kind in _KINDS}
    claims = [claim | {"status": {"phase": "Bound"}} for claim in made["PersistentVolumeClaim"]]
    finished = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
    warmups = [job | finished for job in made["Job"] if expiryjob.LABEL_EXPIRY_OF not in job["metadata"]["labels"]]
    expiries = [job | finished for job in made["Job"] if expiryjob.LABEL_EXPIRY_OF in job["metadata"]["labels"]]
    return dataclasses.replace(
        snap,
        cache=Cache.read(dict(snap.cache.obj) | {"status": dict(decided.status)}),
        claim=claims[0] if claims else snap.claim,
        jobs=snap.jobs + tuple(warmups),
        expiry_jobs=snap.expiry_jobs + tuple(expiries),
        services=snap.services + tuple(made["Service"]),
    )


def check(
    cache: Mapping[str, Any], nodes: list[dict[str, Any]], versions: list[str], rules: policy.Policy = OPEN_POLICY
) -> str:
    """Run the property on one example; return ``"objects"`` or ``"SpecError"`` for statistics."""
    try:
        objects = manifests(cache, nodes, rules)
    except SpecError as error:
        assert field_exists(cache, error.field), f"SpecError names no field of the cache: {error}"
        return "SpecError"
    problems = [problem for obj in objects for problem in api_server_rules(obj)]
    problems += multihost_problems(objects)
    assert problems == [], problems
    for version in versions:
        for obj in objects:
            if obj["kind"] == "ProvisioningRequest":  # a CRD of Cluster Autoscaler's: no core schema
                assert provisioning_request_problems(obj) == [], obj
                continue
            kubernetes_validate.validate(obj, version, strict=True)
    return "objects, multi-host" if any(obj["kind"] == "Service" for obj in objects) else "objects"


def multihost_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Each Indexed warm-up Job has its headless Service: named as its pods' subdomain, selecting its pods."""
    services = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "Service"}
    found = []
    for job in (obj for obj in objects if obj["kind"] == "Job" and obj["spec"].get("completionMode") == "Indexed"):
        template = job["spec"]["template"]
        service = services.get(template["spec"]["subdomain"])
        if service is None:
            found.append(f"no Service for the subdomain of {job['metadata']['name']}")
            continue
        labels = template["metadata"]["labels"]
        if not service["spec"]["selector"] or any(labels.get(k) != v for k, v in service["spec"]["selector"].items()):
            found.append(f"Service {service['metadata']['name']} does not select the pods of its Job")
        if service["spec"].get("clusterIP") != "None":
            found.append(f"Service {service['metadata']['name']} is not headless")
    return found


@st.composite
def examples(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cache = draw(cache_objects(SCHEMA))
    return cache, draw(node_sets(cache))


_HEALTH = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


@settings(derandomize=True, max_examples=30, deadline=None, suppress_health_check=_HEALTH)
@given(examples())
def test_admitted_specs_give_valid_objects_or_name_the_field(example: tuple[dict[str, Any], list[Any]]) -> None:
    event(check(*example, KUBERNETES_VERSIONS))  # --hypothesis-show-statistics: objects vs SpecError


# The chart's default: an operator that injects its runtime (controller/runtime.py) into every Job it makes.
WITH_RUNTIME = dataclasses.replace(
    OPEN_POLICY, runtime=runtime.Runtime("ghcr.io/compilecache/compilecache-runtime:0.1.0", "IfNotPresent")
)


@settings(derandomize=True, max_examples=15, deadline=None, suppress_health_check=_HEALTH)
@given(examples())
def test_admitted_specs_give_valid_objects_with_the_runtime_injected(example: tuple[dict[str, Any], list[Any]]) -> None:
    """The same property where the operator injects its runtime: init container, emptyDir, mount, PYTHONPATH."""
    event(check(*example, KUBERNETES_VERSIONS[-1:], WITH_RUNTIME))


def test_the_jobs_with_the_runtime_injected_validate() -> None:
    """An example the property above runs through, checked to carry the runtime (so the property is about it)."""
    objects = manifests(specs.cache(), specs.cluster(), WITH_RUNTIME)
    made = [obj for obj in objects if obj["kind"] == "Job"]
    assert len(made) >= 3  # the warm-ups and the expiry
    for job in made:
        pod = job["spec"]["template"]["spec"]
        assert pod["initContainers"][0]["name"] == runtime.VOLUME, pod
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(900)
@settings(derandomize=True, max_examples=500, deadline=None, suppress_health_check=_HEALTH)
@given(examples())
def test_admitted_specs_long_run(example: tuple[dict[str, Any], list[Any]]) -> None:
    event(check(*example, KUBERNETES_VERSIONS[-1:]))


# --- the checks themselves can fail ------------------------------------------------------------


def test_field_exists() -> None:
    cache = {"spec": {"warmup": {"resources": {"requests": {"nvidia.com/gpu": 4}}, "workloads": [{"pools": ["a"]}]}}}
    assert field_exists(cache, "spec.warmup.resources.requests.nvidia.com/gpu")
    assert field_exists(cache, "spec.warmup.workloads[0].pools[0]")
    assert not field_exists(cache, "spec.warmup.workloads[1]")
    assert not field_exists(cache, "spec.warmup.resources.limits")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda job: job["metadata"].update(name="x" * 64), "not a label value"),
        (lambda job: job["metadata"]["labels"].update({"compilecache.dev/cache": "c" * 64}), "value"),
        (lambda job: job["spec"]["template"]["spec"].update(nodeSelector={"a/b/c": "x"}), "key"),
        (lambda job: _warm(job)["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"}), "duplicate mountPath"),
        (lambda job: _warm(job).update(resources={"requests": {"nvidia.com/gpu": 4}, "limits": {"nvidia.com/gpu": 8}}),
         "extended resource"),
        (lambda job: _warm(job).update(resources={"requests": {"cpu": "-1"}}), "negative"),
        (lambda job: _warm(job).update(resources={"limits": {"not a resource": 1}}), "not a resource name"),
        (lambda job: job["spec"]["template"]["spec"].update(imagePullSecrets=[{"name": "Bad_Name"}]), "subdomain"),
    ],
)  # fmt: skip
def test_api_server_rules_notice(mutate: Any, expected: str) -> None:
    cache = {"metadata": {"name": "llama", "namespace": "default", "uid": "u"}, "spec": _spec()}
    spec = api.parse_cache(cache)
    job = jobs.warmup_job(cache, spec, resolve_pools(spec, [])[0])
    assert api_server_rules(job) == []
    mutate(job)
    assert any(expected in problem for problem in api_server_rules(job)), api_server_rules(job)


def _warm(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def _spec() -> dict[str, Any]:
    return {
        "storage": {"pvc": {"claimName": "cache", "create": {"size": "1Gi"}}},
        "warmup": {"image": "i:1", "workloads": [{"name": "w", "entrypoint": "m:f"}], "pools": [{"name": "p"}]},
    }
