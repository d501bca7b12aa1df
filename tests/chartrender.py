"""Helpers of the chart tests: the real helm binary, rendered objects, and an RBAC evaluator.

``tools/install-helm.sh`` (``make tools``) puts helm into ``.tools/bin``; when it could not, it
left the reason in ``.tools/helm.unavailable``, and the tests that need helm skip with it.

The RBAC evaluator answers "may this ServiceAccount make this API call?" the way the API
server's RBAC authorizer does for the rules the chart writes: exact verbs, API groups,
resources (``plural`` or ``plural/subresource``), no ``resourceNames``; a ClusterRole bound
by a ClusterRoleBinding applies everywhere, a (Cluster)Role bound by a RoleBinding only in
that binding's namespace. Wildcards are not evaluated at all: the chart must not use any.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "compilecache-operator"
TOOLS = ROOT / ".tools"
RELEASE = "cc"
NAMESPACE = "compilecache-system"


def helm_binary() -> Path:
    """The helm that ``make tools`` installed (or ``$HELM``); skip the test with the reason if none."""
    if env := os.environ.get("HELM"):
        return Path(env)
    helm = TOOLS / "bin" / "helm"
    if helm.is_file() and os.access(helm, os.X_OK):
        return helm
    marker = TOOLS / "helm.unavailable"
    reason = marker.read_text().strip() if marker.is_file() else "tools/install-helm.sh has not run"
    pytest.skip(f"no helm binary in {helm} ({reason}); run `make tools`")


def hadolint_binary() -> Path:
    """hadolint from the virtualenv (``make tools``) or ``$PATH``; skip the test with the reason if none."""
    venv = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "hadolint"
    if venv.is_file() and os.access(venv, os.X_OK):
        return venv
    if found := shutil.which("hadolint"):
        return Path(found)
    marker = TOOLS / "hadolint.unavailable"
    reason = marker.read_text().strip() if marker.is_file() else "tools/install-hadolint.sh has not run"
    pytest.skip(f"no hadolint binary ({reason}); run `make tools`")


def helm(*args: str, values: Mapping[str, Any] | None = None, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``helm ARGS... CHART -f VALUES`` (values written to a file, as a user passes them)."""
    command = [str(helm_binary()), *args, str(CHART)]
    if values is not None:
        path = tmp / f"values-{len(list(tmp.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        command += ["-f", str(path)]
    # No kube context: `helm template` and `lint` must never reach a cluster (HOME keeps helm's caches out of ~).
    env = {**os.environ, "KUBECONFIG": str(tmp / "no-kubeconfig"), "HELM_CACHE_HOME": str(tmp / "helm-cache")}
    env |= {"HELM_CONFIG_HOME": str(tmp / "helm-config"), "HELM_DATA_HOME": str(tmp / "helm-data")}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


def render(values: Mapping[str, Any] | None, tmp: Path, *, crds: bool = False) -> list[dict[str, Any]]:
    """``helm template`` the chart as release ``cc`` in ``compilecache-system``; the objects it renders."""
    args = ["template", RELEASE, "--namespace", NAMESPACE, *(["--include-crds"] if crds else [])]
    done = helm(*args, values=values, tmp=tmp)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def only(objects: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """The objects of one kind."""
    return [obj for obj in objects if obj.get("kind") == kind]


def one(objects: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    """The single object of one kind."""
    found = only(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


@dataclasses.dataclass(frozen=True)
class ApiCall:
    """One authorizable API request: verb, API group, resource[/subresource], namespace (None: cluster scope)."""

    verb: str
    group: str
    resource: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {where}"

    @property
    def rule(self) -> tuple[str, str, str]:
        """What an RBAC rule names: (verb, group, resource)."""
        return (self.verb, self.group, self.resource)


def rbac_verb(method: str, name: str | None, params: Mapping[str, str]) -> str:
    """The RBAC verb of an HTTP request, as the API server's request-info resolver assigns it."""
    method = method.upper()
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method in verbs:
        return verbs[method]
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    raise ValueError(f"no RBAC verb for HTTP {method}")


@dataclasses.dataclass(frozen=True)
class _Rule:
    verbs: frozenset[str]
    groups: frozenset[str]
    resources: frozenset[str]

    def allows(self, call: ApiCall) -> bool:
        return call.verb in self.verbs and call.group in self.groups and call.resource in self.resources


def rules_of(role: Mapping[str, Any]) -> list[_Rule]:
    """A Role's or ClusterRole's rules (no resourceNames, no nonResourceURLs: the chart uses neither)."""
    parsed = []
    for rule in role.get("rules") or []:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        parsed.append(
            _Rule(
                frozenset(rule.get("verbs") or ()), frozenset(rule.get("apiGroups") or ()), frozenset(rule["resources"])
            )
        )
    return parsed


def wildcards(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every ``*`` in a Role's or ClusterRole's rules, as ``name: field``."""
    found = []
    for role in [*only(objects, "Role"), *only(objects, "ClusterRole")]:
        for rule in role.get("rules") or []:
            for field in ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"):
                if any("*" in str(item) for item in rule.get(field) or ()):
                    found.append(f"{role['metadata']['name']}: {field}={rule[field]}")
    return found


@dataclasses.dataclass(frozen=True)
class Grants:
    """The rules a ServiceAccount holds: everywhere (ClusterRoleBindings) and per namespace (RoleBindings)."""

    everywhere: tuple[_Rule, ...]
    per_namespace: Mapping[str, tuple[_Rule, ...]]

    def allows(self, call: ApiCall) -> bool:
        """Whether the API server would authorize the call."""
        if any(rule.allows(call) for rule in self.everywhere):
            return True
        if call.namespace is None:  # cluster scope, or a namespaced resource across all namespaces
            return False
        return any(rule.allows(call) for rule in self.per_namespace.get(call.namespace, ()))

    def rules(self) -> Iterator[tuple[str | None, tuple[str, str, str]]]:
        """Every (namespace or None, (verb, group, resource)) granted, expanded one verb at a time."""
        for namespace, rules in [(None, self.everywhere), *self.per_namespace.items()]:
            for rule in rules:
                for verb in rule.verbs:
                    for group in rule.groups:
                        for resource in rule.resources:
                            yield namespace, (verb, group, resource)


def grants_of(objects: list[dict[str, Any]], service_account: str, namespace: str) -> Grants:
    """What the rendered bindings grant the ServiceAccount ``namespace/service_account``."""

    def binds(binding: Mapping[str, Any]) -> bool:
        return any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == service_account
            and s.get("namespace", binding["metadata"].get("namespace")) == namespace
            for s in binding.get("subjects") or []
        )

    def role(ref: Mapping[str, Any], binding_namespace: str | None) -> Mapping[str, Any]:
        for obj in objects:
            same = obj["kind"] == ref["kind"] and obj["metadata"]["name"] == ref["name"]
            if same and (ref["kind"] == "ClusterRole" or obj["metadata"].get("namespace") == binding_namespace):
                return obj
        raise AssertionError(f"binding refers to a missing {ref['kind']} {ref['name']}")

    everywhere: list[_Rule] = []
    per_namespace: dict[str, list[_Rule]] = {}
    for binding in only(objects, "ClusterRoleBinding"):
        if binds(binding):
            everywhere += rules_of(role(binding["roleRef"], None))
    for binding in only(objects, "RoleBinding"):
        if binds(binding):
            ns = binding["metadata"]["namespace"]
            per_namespace.setdefault(ns, []).extend(rules_of(role(binding["roleRef"], ns)))
    return Grants(tuple(everywhere), {ns: tuple(rules) for ns, rules in per_namespace.items()})
