"""The Helm chart, checked with real tools: helm lint/template, its values schema, kubernetes-validate,
and RBAC derived from what the real operator was recorded doing against the API emulator.

How the RBAC check works: ``recorded`` runs the real operator (kopf and our handlers, in this
process) against the emulator through a representative scenario, once cluster-wide with kopf
peering and once in one namespace with peering, and turns every request the operator made
(told apart from the test's own requests by their User-Agent) into an RBAC (verb, group,
resource[/subresource], namespace). Each must be authorized by the chart's rules for the
matching values, and each rule the chart writes must have been used, or be on ``NOT_RECORDED``
with its reason.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kmock
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import podsecurity
from chartrender import (
    CHART,
    NAMESPACE,
    ROOT,
    ApiCall,
    grants_of,
    helm,
    one,
    only,
    rbac_verb,
    render,
    wildcards,
)
from compilecache.controller import checks, expiryjob, plan, policy, template, webhook
from compilecache.controller.admission import selector_matches
from compilecache.controller.api import parse_cache
from compilecache.controller.snapshot import Cache, Snapshot
from compilecache.local.apiserver import KubeEmulator
from compilecache.local.validation import DNS1123_LABEL
from conftest import SESSION_KUBECONFIG, KubeClient, running_emulator, write_kubeconfig
from k8snames import KUBERNETES_VERSIONS
from specs import PRODUCT, cache, cache_spec, cluster

CC = "compilecache.dev/v1alpha1/compilecaches"
DIGEST = "sha256:" + "0123456789abcdef" * 4
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
_SPREAD = {
    "weight": 100,
    "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "compilecache-operator"}},
    },
}
_PROD = {"key": "env", "operator": "In", "values": ["prod"]}
JOBS = "batch/v1/jobs"
WATCHED = "team-a"

# Representative value sets: each must lint --strict, render and validate.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "webhook-off": {"webhook": {"enabled": False}},
    "cert-manager": {"webhook": {"enabled": True, "certManager": {"enabled": True}}},
    "cert-manager-issuer": {
        "webhook": {
            "enabled": True,
            "certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "ca"}},
        }
    },
    "namespaces": {"watchNamespaces": [WATCHED, "team-b"], "logLevel": "debug"},
    "own-namespace-selector": {
        "webhook": {"namespaceSelector": {"matchLabels": {"team": "ml"}, "matchExpressions": [_PROD]}}
    },
    "own-namespace-labels": {"webhook": {"namespaceSelector": {"matchLabels": {"team": "ml"}}}},
    "gcs-identities": {
        "cacheServiceAccounts": [
            {"namespace": "ml-team", "name": "cache-writer", "gcpServiceAccount": "w-1@proj-1.iam.gserviceaccount.com"},
            {
                "namespace": "ml-team",
                "name": "cache-reader",
                "gcpServiceAccount": "r-1@proj-1.iam.gserviceaccount.com",
                "annotations": {"team": "ml"},
            },
        ]
    },
    "replicas-2": {"replicas": 2, "logLevel": "quiet"},
    "replicas-2-namespaces": {"replicas": 2, "watchNamespaces": [WATCHED]},
    "metrics-all": {
        "metrics": {
            "enabled": True,
            "port": 9090,
            "serviceMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "prom"}},
            "dashboard": {"enabled": True, "annotations": {"grafana_folder": "ML"}},
        }
    },
    "metrics-off": {"metrics": {"enabled": False, "port": 8000}},
    "kueue": {"kueue": {"enabled": True}, "watchNamespaces": [WATCHED]},
    "kueue-all-namespaces": {"kueue": {"enabled": True, "admissionCheck": {"name": "ml.compilecache-warm"}}},
    "pinned-image": {
        "image": {"repository": "registry.example:5000/ml/compilecache-operator", "tag": "v0.1.0-rc.1"},
        "runtime": {"image": {"repository": "registry.example:5000/ml/compilecache-runtime", "digest": DIGEST}},
        "imagePullSecrets": [{"name": "pull"}],
    },
    # What a platform team sets: two replicas, a ServiceMonitor, a digest, placement, proxies, a CA file.
    "platform": {
        "replicas": 2,
        "watchNamespaces": [WATCHED],
        "image": {"repository": "registry.example/ml/compilecache-operator", "digest": DIGEST},
        "metrics": {"enabled": True, "port": 8000, "serviceMonitor": {"enabled": True}},
        "priorityClassName": "platform-critical",
        "nodeSelector": {"node-role.kubernetes.io/infra": ""},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [_SPREAD]}},
        "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"cpu": 1, "memory": "600Mi"}},
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "extraVolumes": [{"name": "proxy-ca", "configMap": {"name": "proxy-ca"}}],
        "extraVolumeMounts": [{"name": "proxy-ca", "mountPath": "/etc/proxy-ca", "readOnly": True}],
    },
    # OpenShift's restricted SCC assigns the UID: nothing may force one (the defaults force none).
    "openshift": {
        "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "policy": {"runAsUser": 0},  # nor do the pods the operator creates
    },
    # Where no platform assigns one, the image's user pinned explicitly.
    "pinned-uid": {"podSecurityContext": {"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532}},
    "existing-secret": {"webhook": {"enabled": True, "existingSecret": "my-webhook-tls", "caBundle": CA_BUNDLE}},
    "policy": {
        "policy": {
            "images": {"allow": ["registry.example.com/ml/*"], "requirePinned": False},
            "serviceAccounts": {"allow": ["default", "cache-writer"]},
            "claims": {"allow": ["shared-*"], "deny": ["shared-db-*"]},
            "maxGpusPerPod": 0,
            "maxGateTimeout": "45m",
        }
    },
}
# The platform team's values with Kueue, whose AdmissionCheck that team manages itself.
VALUE_SETS["platform-kueue"] = VALUE_SETS["platform"] | {
    "watchNamespaces": [WATCHED, "team-b"],
    "kueue": {"enabled": True, "admissionCheck": {"create": False, "name": "gpu-caches-warm"}},
}

# Values values.schema.json must reject, and a word its message must name.
BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "replicas-0": ({"replicas": 0}, "replicas"),
    "unknown-log-level": ({"logLevel": "loud"}, "logLevel"),
    "malformed-tag": (
        {"image": {"repository": "compilecache/operator", "tag": "v1 beta", "pullPolicy": "Always"}},
        "tag",
    ),
    "malformed-repository": ({"image": {"repository": "Compile Cache/op", "pullPolicy": "Always"}}, "repository"),
    "bad-pull-policy": ({"image": {"repository": "compilecache/operator", "pullPolicy": "Sometimes"}}, "pullPolicy"),
    "runtime-malformed-tag": ({"runtime": {"image": {"tag": "v1 beta"}}}, "tag"),
    "runtime-unknown-key": ({"runtime": {"image": {"registry": "registry.example"}}}, "registry"),
    "bad-namespace": ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    "unknown-key": ({"replica": 2}, "replica"),
    "gcp-account-not-an-email": (
        {"cacheServiceAccounts": [{"namespace": "ml", "name": "w", "gcpServiceAccount": "writer"}]},
        "gcpServiceAccount",
    ),
    "metrics-on-webhook-port": ({"metrics": {"enabled": True, "port": 9443}}, "port"),
    "policy-unknown-key": ({"policy": {"image": {"allow": ["*"]}}}, "image"),
    "policy-bad-gate-timeout": ({"policy": {"maxGateTimeout": "forever"}}, "maxGateTimeout"),
    "policy-patterns-not-a-list": ({"policy": {"serviceAccounts": {"allow": "default"}}}, "allow"),
    "bad-scrape-interval": (
        {"metrics": {"enabled": True, "port": 8000, "serviceMonitor": {"interval": "often"}}},
        "interval",
    ),
    "misspelt-security-context": ({"podSecurityContext": {"runAsUsr": 1000}}, "runAsUsr"),
    "negative-uid": ({"securityContext": {"runAsUser": -1}}, "runAsUser"),
    "env-the-chart-sets": ({"extraEnv": [{"name": "COMPILECACHE_WEBHOOK", "value": "off"}]}, "extraEnv"),
    # The AdmissionCheck controller without its RBAC: kopf would fail on the denied watches.
    "env-kueue-the-chart-sets": ({"extraEnv": [{"name": "COMPILECACHE_KUEUE", "value": "true"}]}, "extraEnv"),
    "env-value-and-value-from": (
        {"extraEnv": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        "extraEnv",
    ),
    "mount-over-tmp": ({"extraVolumeMounts": [{"name": "x", "mountPath": "/tmp"}]}, "mountPath"),
    "volume-named-certs": ({"extraVolumes": [{"name": "certs", "emptyDir": {}}]}, "extraVolumes"),
    "existing-secret-without-ca": ({"webhook": {"enabled": True, "existingSecret": "mine"}}, "caBundle"),
    "existing-secret-and-cert-manager": (
        {"webhook": {"enabled": True, "existingSecret": "mine", "caBundle": "QUJD", "certManager": {"enabled": True}}},
        "certManager",
    ),
}

# Rules the chart grants that no recorded session uses, each with why it stays. Keep it short.
NOT_RECORDED: dict[tuple[str, str, str], str] = {
    ("update", "compilecache.dev", "compilecaches/finalizers"): (
        "no call: OwnerReferencesPermissionEnforcement checks it when a Job or claim sets blockOwnerDeletion"
    ),
    # Passes read claims and PodTemplates from the watch-fed indexes; after a 409 on a create (an object
    # the watch has not brought yet) and at a periodic audit a pass reads them again by name, which a
    # session makes only by timing; the validating webhook reads a cache's existing claim.
    ("get", "", "persistentvolumeclaims"): (
        "a pass's read after a 409 on a create or at its audit (controller/reconcile.py); the validating "
        "webhook's (handlers._claim)"
    ),
    ("get", "", "podtemplates"): "a pass's read after a 409 on a create or at its audit (controller/reconcile.py)",
}

# Requests the chart needs no rule for: discovery (/api, /apis, /apis/GROUP/VERSION) is granted to
# every authenticated user by the cluster's default `system:discovery` ClusterRole.
OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")  # kopf's aiohttp client; our kubernetes-client calls
TEST_AGENT = "Python-urllib/"  # tests/conftest.py's KubeClient


# --- the chart's own files (fast, no helm) ---------------------------------------------------------


def test_chart_crd_is_byte_identical_to_the_top_level_crd():
    """One source of truth: `make generate` writes crds/compilecache.yaml and the chart's copy from the model."""
    top = (ROOT / "crds" / "compilecache.yaml").read_bytes()
    chart = (CHART / "crds" / "compilecache.yaml").read_bytes()
    assert chart == top, "helm/compilecache-operator/crds/compilecache.yaml differs: run `make generate`"


def test_values_yaml_documents_every_value():
    """Every key in values.yaml has a comment right above it (or is a group whose keys do)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("-") or ":" not in stripped:
            continue
        is_group = stripped.endswith(":")
        previous = lines[i - 1].strip() if i else ""
        if not is_group and not previous.startswith("#") and not previous.endswith(":"):
            # A value in a documented group of siblings (e.g. requests/limits) is fine; a lone one is not.
            indent = len(line) - len(line.lstrip())
            sibling_before = i and (len(lines[i - 1]) - len(lines[i - 1].lstrip())) == indent and ":" in previous
            if not sibling_before:
                undocumented.append(stripped)
    assert undocumented == []


def test_values_schema_accepts_the_default_values():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


# --- helm lint / template ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_lint_strict(name: str, tmp_path: Path):
    done = helm("lint", "--strict", "--namespace", NAMESPACE, values=VALUE_SETS[name], tmp=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_schema_rejects_bad_values_in_lint_and_template(name: str, tmp_path: Path):
    values, field = BAD_VALUES[name]
    for args in (("lint", "--strict"), ("template", "cc")):
        done = helm(*args, values=values, tmp=tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode != 0, f"helm {args[0]} accepted {values}"
        assert "schema" in output and field in output, output


@pytest.mark.slow
def test_notes_tell_what_to_apply_next(tmp_path: Path):
    values = {"watchNamespaces": [WATCHED]}
    done = helm("install", "cc", "--namespace", NAMESPACE, "--dry-run=client", values=values, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"kubectl apply -f examples/cache-pvc.yaml -n {WATCHED}" in notes
    assert f"kubectl get cc -n {WATCHED}" in notes
    # The webhook check of docs/install.md, in a namespace the webhook serves.
    verify = "kubectl run compilecache-check --image=busybox --restart=Never --dry-run=server"
    assert f"{verify} --labels=compilecache.dev/cache=compilecache-check -n {WATCHED}" in notes
    off = helm("install", "cc", "--dry-run=client", values={"webhook": {"enabled": False}}, tmp=tmp_path)
    assert off.returncode == 0, off.stderr
    assert "compilecache-check" not in off.stdout.split("NOTES:", 1)[1]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every value set rendered once (with the CRDs), by name."""
    tmp = tmp_path_factory.mktemp("render")
    return {name: render(values, tmp, crds=True) for name, values in VALUE_SETS.items()}


def deployment_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment: dict[str, Any] = dict(one(objects, "Deployment"))
    return deployment


def container_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = deployment_of(objects)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def env_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container_of(objects)["env"]}


# kubernetes-validate ships no schema for custom resources other than the CRD kind itself.
CUSTOM_KINDS = {"Certificate", "Issuer", "KopfPeering", "ClusterKopfPeering", "ServiceMonitor", "AdmissionCheck"}


@pytest.mark.slow
def test_rendered_manifests_validate_strictly_against_kubernetes_1_30_to_1_35(rendered):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate)"
    )
    from kubernetes_validate import utils

    shipped = {utils.major_minor(v) for v in utils.all_versions()}
    missing = [v for v in KUBERNETES_VERSIONS if v not in shipped]
    assert not missing, f"kubernetes-validate {kubernetes_validate.__version__} lacks schemas for {missing}"

    unique: dict[str, dict[str, Any]] = {}
    for name, objects in rendered.items():
        for obj in objects:
            if obj["kind"] not in CUSTOM_KINDS:
                unique.setdefault(json.dumps(obj, sort_keys=True), obj | {"_set": name})
    kinds = {obj["kind"] for obj in unique.values()}
    assert {"Deployment", "ClusterRole", "MutatingWebhookConfiguration", "CustomResourceDefinition"} <= kinds
    failures = []
    for version in KUBERNETES_VERSIONS:
        for obj in unique.values():
            body = {k: v for k, v in obj.items() if k != "_set"}
            try:
                kubernetes_validate.validate(body, version, strict=True)
            except (kubernetes_validate.ValidationError, utils.SchemaNotFoundError) as exc:
                message = getattr(exc, "message", str(exc))
                failures.append(f"{version} {obj['_set']} {obj['kind']}/{obj['metadata']['name']}: {message}")
    assert failures == []


# --- assertions on the rendered objects ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_pod_security(rendered, name: str):
    objects = rendered[name]
    pod = deployment_of(objects)["spec"]["template"]["spec"]
    container = container_of(objects)
    assert podsecurity.violations(deployment_of(objects), podsecurity.RESTRICTED) == []
    assert pod["securityContext"]["runAsNonRoot"] is True
    # A UID only where the values pin one: OpenShift's restricted SCC rejects a UID outside its range.
    pinned = VALUE_SETS[name].get("podSecurityContext", {}).get("runAsUser")
    assert pod["securityContext"].get("runAsUser") == pinned
    assert "runAsUser" not in container["securityContext"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert volumes[mounts["/tmp"]["name"]] == {"name": "tmp", "emptyDir": {}}
    # kopf's liveness endpoint serves both probes.
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert "command" not in container  # the image's entrypoint is `compilecache operator`


@pytest.mark.slow
def test_the_checker_rejects_a_chart_pod_that_the_values_made_unsafe(tmp_path: Path):
    """The restricted check above can fail: values the schema admits but Pod Security forbids."""
    unsafe = {
        "podSecurityContext": {"runAsNonRoot": False, "runAsUser": 0},
        "securityContext": {
            "privileged": True,
            "allowPrivilegeEscalation": True,
            "capabilities": {"add": ["SYS_ADMIN"]},
        },
        "extraVolumes": [{"name": "host", "hostPath": {"path": "/var/run"}}],
    }
    found = podsecurity.violations(deployment_of(render(unsafe, tmp_path)))
    named = {line.split(":")[0].rsplit(".", 1)[-1] for line in found}
    assert {"runAsNonRoot", "runAsUser", "privileged", "allowPrivilegeEscalation", "add", "hostPath"} <= named


@pytest.mark.slow
def test_platform_values_reach_the_pod(rendered):
    objects = rendered["platform"]
    pod = deployment_of(objects)["spec"]["template"]["spec"]
    container = container_of(objects)
    values = VALUE_SETS["platform"]
    assert container["image"] == f"registry.example/ml/compilecache-operator@{DIGEST}"  # the digest pins it
    assert pod["priorityClassName"] == "platform-critical"
    assert (pod["nodeSelector"], pod["tolerations"], pod["affinity"]) == (
        values["nodeSelector"],
        values["tolerations"],
        values["affinity"],
    )
    assert container["resources"] == values["resources"]
    # The chart's own variables first, then the user's, each once.
    names = [item["name"] for item in container["env"]]
    assert names[-2:] == ["HTTPS_PROXY", "NODE"] and len(names) == len(set(names))
    assert container["env"][-2:] == values["extraEnv"]
    # extraEnv may not set what the chart sets: the schema's list is the chart's variables, all of them.
    schema = json.loads((CHART / "values.schema.json").read_text())
    refused = schema["properties"]["extraEnv"]["items"]["properties"]["name"]["not"]["enum"]
    assert sorted(refused) == sorted(names[:-2])
    assert pod["volumes"][-1] == values["extraVolumes"][0]
    assert container["volumeMounts"][-1] == values["extraVolumeMounts"][0]
    assert {"tmp", "certs"} <= {volume["name"] for volume in pod["volumes"]}
    # The defaults add nothing of that.
    defaults = rendered["defaults"]
    assert not {"priorityClassName", "nodeSelector", "tolerations", "affinity"} & set(
        deployment_of(defaults)["spec"]["template"]["spec"]
    )
    assert [v["name"] for v in deployment_of(defaults)["spec"]["template"]["spec"]["volumes"]] == ["tmp", "certs"]


@pytest.mark.slow
def test_no_uid_is_forced_unless_asked(rendered):
    """OpenShift's restricted SCC assigns a UID from the namespace's range and rejects any other."""
    for name in ("defaults", "openshift", "platform"):
        pod = deployment_of(rendered[name])["spec"]["template"]["spec"]
        contexts = [pod["securityContext"], container_of(rendered[name])["securityContext"]]
        assert not [key for context in contexts for key in ("runAsUser", "runAsGroup", "fsGroup") if key in context]
    pinned = deployment_of(rendered["pinned-uid"])["spec"]["template"]["spec"]["securityContext"]
    # The pinned values merge over the defaults: the rest of the hardening stays.
    assert pinned == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert "ARG UID=65532" in dockerfile and "USER ${UID}:${UID}" in dockerfile  # numeric: runAsNonRoot is checkable


@pytest.mark.slow
def test_deployment_image_env_and_kopf_options(rendered):
    defaults = rendered["defaults"]
    container = container_of(defaults)
    chart_version = (CHART / "Chart.yaml").read_text()
    assert 'appVersion: "0.1.0"' in chart_version
    # Where `make push` pushes by default (tests/test_install.py); the tag defaults to appVersion.
    assert container["image"] == "ghcr.io/compilecache/compilecache-operator:0.1.0"
    assert container["args"][:2] == ["--peering=cc-compilecache-operator", "--all-namespaces"]
    assert not {"--debug", "--verbose", "--quiet"} & set(container["args"])
    env = env_of(defaults)
    assert env["COMPILECACHE_RESYNC_SECONDS"] == "60"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert deployment_of(defaults)["spec"]["replicas"] == 1

    pinned = container_of(rendered["pinned-image"])
    assert pinned["image"] == "registry.example:5000/ml/compilecache-operator:v0.1.0-rc.1"
    assert deployment_of(rendered["pinned-image"])["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "pull"}]

    namespaced = container_of(rendered["namespaces"])["args"]
    assert "--all-namespaces" not in namespaced
    assert [a for a in namespaced if a.startswith("--namespace=")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--debug" in namespaced
    assert "--quiet" in container_of(rendered["replicas-2"])["args"]


@pytest.mark.slow
def test_peering_with_any_replicas_and_a_pdb_with_more_than_one(rendered):
    # One replica runs --peering too: a rolling update's surge pod starts paused behind it.
    one_replica = rendered["defaults"]
    name = one(one_replica, "ClusterKopfPeering")["metadata"]["name"]
    assert f"--peering={name}" in container_of(one_replica)["args"]
    assert not only(one_replica, "PodDisruptionBudget")
    for objects in (one_replica, rendered["replicas-2"]):
        strategy = deployment_of(objects)["spec"]["strategy"]
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    two = rendered["replicas-2"]
    pdb = one(two, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    labels = deployment_of(two)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["metadata"]["namespace"] == NAMESPACE
    assert deployment_of(two)["spec"]["replicas"] == 2
    args = container_of(two)["args"]
    assert "--standalone" not in args
    peering = one(two, "ClusterKopfPeering")
    assert f"--peering={peering['metadata']['name']}" in args
    assert not only(two, "KopfPeering")
    # kopf's peering CRDs ship in crds/ so that the peering object can be created.
    crds = {crd["metadata"]["name"] for crd in only(two, "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev", "compilecaches.compilecache.dev"} <= crds

    namespaced = rendered["replicas-2-namespaces"]
    peerings = only(namespaced, "KopfPeering")
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings] == [
        (WATCHED, peering["metadata"]["name"])
    ]
    assert not only(namespaced, "ClusterKopfPeering")


def webhooks_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    config = one(objects, "MutatingWebhookConfiguration")
    return {webhook["name"]: webhook for webhook in config["webhooks"]}


def webhook_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The webhook for pods labelled with a cache (the one every install uses)."""
    return webhooks_of(objects)["pods.compilecache.dev"]


def webhooks_sent(objects: list[dict[str, Any]], namespace_labels: dict[str, str], pod_labels: dict[str, str]):
    """The webhooks an API server sends a new pod to, by their selectors (as `rules` match every pod)."""
    return sorted(
        name
        for name, webhook in webhooks_of(objects).items()
        if selector_matches(webhook["namespaceSelector"], namespace_labels)
        and selector_matches(webhook["objectSelector"], pod_labels)
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["defaults", "cert-manager", "namespaces"])
def test_webhook_selectors_policy_and_path(rendered, name: str):
    objects = rendered[name]
    webhook = webhook_of(objects)
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["timeoutSeconds"] == 5
    assert webhook["objectSelector"] == {
        "matchExpressions": [
            {"key": "compilecache.dev/cache", "operator": "Exists"},
            {"key": "compilecache.dev/inject", "operator": "NotIn", "values": ["false"]},
            {"key": "compilecache.dev/role", "operator": "DoesNotExist"},
        ]
    }
    assert webhook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    service_ref = webhook["clientConfig"]["service"]
    assert (service_ref["path"], service_ref["port"], service_ref["namespace"]) == ("/mutate-pods", 443, NAMESPACE)
    # The Service leads port 443 to the container's webhook port 9443, on the operator's pods.
    service = next(s for s in only(objects, "Service") if s["metadata"]["name"] == service_ref["name"])
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    pod_labels = deployment_of(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container_of(objects)["ports"]
    env = env_of(objects)
    assert env["COMPILECACHE_WEBHOOK"] == "tls"
    assert env["COMPILECACHE_WEBHOOK_PORT"] == "9443"
    assert (env["COMPILECACHE_WEBHOOK_CERT_FILE"], env["COMPILECACHE_WEBHOOK_KEY_FILE"]) == (
        "/certs/tls.crt",
        "/certs/tls.key",
    )
    mount = next(m for m in container_of(objects)["volumeMounts"] if m["mountPath"] == "/certs")
    assert mount["readOnly"] is True
    volume = next(
        v for v in deployment_of(objects)["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    secret_name = volume["secret"]["secretName"]

    selector = webhook["namespaceSelector"]["matchExpressions"]
    injection = {"key": "compilecache.dev/injection", "operator": "In", "values": ["enabled"]}
    if name == "namespaces":
        served = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [WATCHED, "team-b"]}
    else:
        served = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    assert selector == [served]
    # The namespace-wide webhook differs only in its selectors: everything else is the same call.
    selected = webhooks_of(objects)["selected-pods.compilecache.dev"]
    same = {key: value for key, value in selected.items() if key not in ("name", "objectSelector", "namespaceSelector")}
    assert same == {key: value for key, value in webhook.items() if key in same}
    assert selected["namespaceSelector"]["matchExpressions"] == [injection, served]

    config = one(objects, "MutatingWebhookConfiguration")
    if name == "cert-manager":
        certificate = one(objects, "Certificate")
        assert certificate["spec"]["secretName"] == secret_name
        assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
        assert certificate["spec"]["issuerRef"]["name"] == one(objects, "Issuer")["metadata"]["name"]
        annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert annotation == f"{NAMESPACE}/{certificate['metadata']['name']}"
        assert "caBundle" not in webhook["clientConfig"]
        assert not [s for s in only(objects, "Secret") if s["metadata"]["name"] == secret_name]
    else:
        secret = one(objects, "Secret")
        assert secret["metadata"]["name"] == secret_name and secret["type"] == "kubernetes.io/tls"
        assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        for key in ("tls.crt", "ca.crt"):
            assert base64.b64decode(secret["data"][key]).startswith(b"-----BEGIN CERTIFICATE-----")
        assert b"PRIVATE KEY-----" in base64.b64decode(secret["data"]["tls.key"])
        assert "annotations" not in config["metadata"]
        assert not only(objects, "Certificate")


# (namespace labels, pod labels) → the webhooks that must see the pod: the cache label anywhere;
# consumers.podSelector only for pods labelled compilecache.dev/inject=true in a namespace labelled
# compilecache.dev/injection=enabled (Istio's convention); never the operator's own pods.
ENABLED = {"compilecache.dev/injection": "enabled"}
INJECT = {"compilecache.dev/inject": "true"}
WARMUP = {"compilecache.dev/role": "warmup", "app.kubernetes.io/instance": "llama"}
ROUTES = [
    ({}, {}, []),
    ({}, {"app": "llama-train"}, []),
    ({}, {"app": "llama-train"} | INJECT, []),
    ({}, {"compilecache.dev/cache": "llama"}, ["pods.compilecache.dev"]),
    ({}, {"compilecache.dev/cache": "llama", "compilecache.dev/inject": "false"}, []),
    ({}, {"compilecache.dev/cache": "llama"} | WARMUP, []),
    (ENABLED, {"app": "llama-train"}, []),
    (ENABLED, {"app": "llama-train"} | INJECT, ["selected-pods.compilecache.dev"]),
    (ENABLED, {"compilecache.dev/cache": "x"}, ["pods.compilecache.dev"]),
    (ENABLED, {"compilecache.dev/cache": "x"} | INJECT, ["pods.compilecache.dev"]),
    (ENABLED, {"app": "x", "compilecache.dev/inject": "false"}, []),
    (ENABLED, WARMUP, []),
    (ENABLED, WARMUP | INJECT, []),
    ({"compilecache.dev/injection": "disabled"}, {"app": "llama-train"} | INJECT, []),
    ({"compilecache.dev/injection": "disabled"}, {"compilecache.dev/cache": "x"}, ["pods.compilecache.dev"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("namespace_labels", "pod_labels", "expected"), ROUTES)
def test_each_pod_reaches_the_webhook_once_by_label_or_by_namespace(rendered, namespace_labels, pod_labels, expected):
    namespace = {"kubernetes.io/metadata.name": "team-a"} | namespace_labels
    assert webhooks_sent(rendered["defaults"], namespace, pod_labels) == expected
    # kube-system is never served, whatever its labels say.
    system = namespace | {"kubernetes.io/metadata.name": "kube-system"}
    assert webhooks_sent(rendered["defaults"], system, pod_labels) == []


@pytest.mark.slow
def test_an_own_namespace_selector_narrows_both_webhooks(rendered):
    objects = rendered["own-namespace-selector"]
    enabled = {"compilecache.dev/injection": "enabled"}
    labelled = {"compilecache.dev/cache": "llama"}
    assert webhooks_sent(objects, {"team": "ml", "env": "prod"}, labelled) == ["pods.compilecache.dev"]
    assert webhooks_sent(objects, {"team": "ml", "env": "prod"} | enabled, {"app": "x"} | INJECT) == [
        "selected-pods.compilecache.dev"
    ]
    assert webhooks_sent(objects, {"team": "ml", "env": "dev"}, labelled) == []
    assert webhooks_sent(objects, {"team": "ops", "env": "prod"} | enabled, {"app": "x"} | INJECT) == []


@pytest.mark.slow
def test_a_namespace_selector_of_labels_only_still_narrows_both_webhooks(rendered):
    objects = rendered["own-namespace-labels"]
    labelled = {"compilecache.dev/cache": "llama"}
    assert webhooks_sent(objects, {"team": "ml"}, labelled) == ["pods.compilecache.dev"]
    assert webhooks_sent(objects, {"team": "ml"} | ENABLED, {"app": "x"} | INJECT) == ["selected-pods.compilecache.dev"]
    assert webhooks_sent(objects, {"team": "ops"} | ENABLED, labelled) == []


@pytest.mark.slow
def test_gcs_identities_are_service_accounts_with_their_workload_identity(rendered):
    """docs/gcs.md: a writer and a reader ServiceAccount, each annotated with its Google service account."""
    accounts = {
        (sa["metadata"]["namespace"], sa["metadata"]["name"]): sa
        for sa in only(rendered["gcs-identities"], "ServiceAccount")
        if sa["metadata"]["namespace"] == "ml-team"
    }
    assert set(accounts) == {("ml-team", "cache-writer"), ("ml-team", "cache-reader")}
    writer, reader = accounts["ml-team", "cache-writer"], accounts["ml-team", "cache-reader"]
    assert writer["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": "w-1@proj-1.iam.gserviceaccount.com"}
    assert reader["metadata"]["annotations"] == {
        "team": "ml",
        "iam.gke.io/gcp-service-account": "r-1@proj-1.iam.gserviceaccount.com",
    }
    assert writer["automountServiceAccountToken"] is False and reader["automountServiceAccountToken"] is False
    assert not [sa for sa in only(rendered["defaults"], "ServiceAccount") if sa["metadata"]["namespace"] == "ml-team"]


@pytest.mark.slow
def test_an_existing_secret_serves_the_webhook_and_nothing_is_generated(rendered, tmp_path: Path):
    """GitOps (Argo CD renders with `helm template`): the same Secret and caBundle on every render."""
    objects = rendered["existing-secret"]
    assert not only(objects, "Secret") and not only(objects, "Certificate") and not only(objects, "Issuer")
    for config in webhooks_of(objects).values():
        assert config["clientConfig"]["caBundle"] == CA_BUNDLE
    volume = next(v for v in deployment_of(objects)["spec"]["template"]["spec"]["volumes"] if v["name"] == "certs")
    assert volume == {"name": "certs", "secret": {"secretName": "my-webhook-tls"}}
    assert render(VALUE_SETS["existing-secret"], tmp_path, crds=True) == objects
    # The chart-generated certificate is not stable across renders without a cluster to look it up in.
    generated = [one(render({}, tmp_path), "Secret")["data"]["ca.crt"] for _ in range(2)]
    assert generated[0] != generated[1]


@pytest.mark.slow
def test_cert_manager_with_a_given_issuer(rendered):
    objects = rendered["cert-manager-issuer"]
    assert one(objects, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "ca"}
    assert not only(objects, "Issuer")


@pytest.mark.slow
def test_metrics_port_service_service_monitor_and_dashboard(rendered):
    defaults = rendered["defaults"]
    assert env_of(defaults)["COMPILECACHE_METRICS_PORT"] == "8000"
    assert {"name": "metrics", "containerPort": 8000, "protocol": "TCP"} in container_of(defaults)["ports"]
    [service] = [
        o for o in only(defaults, "Service") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    ]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8000, "targetPort": "metrics", "protocol": "TCP"}]
    assert (
        service["spec"]["selector"].items() <= deployment_of(defaults)["spec"]["template"]["metadata"]["labels"].items()
    )
    assert not only(defaults, "ServiceMonitor") and not only(defaults, "ConfigMap")  # off by default

    full = rendered["metrics-all"]
    assert env_of(full)["COMPILECACHE_METRICS_PORT"] == "9090"
    [monitor] = only(full, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    # honorLabels: a cache's `namespace` label is kept, not overwritten with the operator's namespace.
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "30s"}
    ]
    [metrics_service] = [
        o for o in only(full, "Service") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    ]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    [dashboard] = only(full, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert json.loads(dashboard["data"]["compilecache-operator.json"]) == json.loads(
        (CHART.parent.parent / "docs" / "grafana-dashboard.json").read_text()
    )

    off = rendered["metrics-off"]
    assert env_of(off)["COMPILECACHE_METRICS_PORT"] == "0"
    assert "metrics" not in {port["name"] for port in container_of(off)["ports"]}
    assert not [o for o in only(off, "Service") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"]


def test_chart_dashboard_is_byte_identical_to_the_docs_dashboard():
    chart = (CHART / "dashboards" / "compilecache-operator.json").read_bytes()
    assert chart == (CHART.parent.parent / "docs" / "grafana-dashboard.json").read_bytes()


@pytest.mark.slow
def test_policy_values_reach_the_operator_and_the_defaults_are_the_operators(rendered):
    """values.yaml's policy is policy.DEFAULT (one source of truth); set values arrive as the operator parses them."""
    for name in ("defaults", "cert-manager"):
        parsed = policy.from_env(env_of(rendered[name]))
        # The one part not of values.policy: the runtime image the chart names by default (values.runtime.image).
        assert parsed.runtime is not None and parsed.runtime.image.startswith(
            "ghcr.io/compilecache/compilecache-runtime:"
        )
        assert dataclasses.replace(parsed, runtime=None) == policy.DEFAULT
    parsed = policy.from_env(env_of(rendered["policy"]))
    assert parsed.images == policy.Rules(allow=("registry.example.com/ml/*",), deny=())
    assert not parsed.require_pinned_images
    assert parsed.claims.permits("shared-cache") and not parsed.claims.permits("shared-db-data")
    assert (parsed.max_gpus_per_pod, parsed.max_gate_timeout_seconds) == (None, 45 * 60)
    assert parsed.tolerations == policy.DEFAULT.tolerations  # unset keys keep the defaults


@pytest.mark.slow
def test_with_run_as_user_0_no_pod_of_the_operator_pins_a_uid(rendered):
    """The chart's OpenShift setting: the operator's own pods pin none by default, and the warm-up and expiry
    pods it creates pin none either, and still pass the restricted Pod Security Standard."""
    objects = rendered["openshift"]
    rules = policy.from_env(env_of(objects))
    assert rules.run_as_user is None
    pinned = {"runAsUser", "runAsGroup", "fsGroup"}
    assert not pinned & set(deployment_of(objects)["spec"]["template"]["spec"].get("securityContext") or {})
    obj = cache()
    made: list[dict[str, Any]] = []
    snapshot = Snapshot(Cache.read(obj), nodes=tuple(cluster()), policy=rules)
    warmups = [
        dict(c.manifest) for c in plan.plan(snapshot, "2026-11-26T10:00:00Z").creates if c.manifest["kind"] == "Job"
    ]
    made += warmups
    made.append(expiryjob.expiry_job(obj, parse_cache(obj), [w["metadata"]["name"] for w in warmups], run_as_user=None))
    assert len(made) > 1
    for job in made:
        context = job["spec"]["template"]["spec"]["securityContext"]
        assert not pinned & set(context) and context["runAsNonRoot"] is True, context
        assert podsecurity.violations(job) == [], job["metadata"]["name"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["defaults", "namespaces", "cert-manager"])
def test_validating_webhook_checks_compilecaches_and_fails_closed(rendered, name: str):
    objects = rendered[name]
    [hook] = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["clientConfig"]["service"]["path"] == webhook.VALIDATE_PATH
    assert hook["clientConfig"]["service"]["name"] == webhook_of(objects)["clientConfig"]["service"]["name"]
    [rule] = hook["rules"]
    assert (rule["operations"], rule["apiGroups"], rule["resources"]) == (
        ["CREATE", "UPDATE"],
        ["compilecache.dev"],
        ["compilecaches"],
    )
    selected = hook.get("namespaceSelector")
    if name == "namespaces":
        assert selected == {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [WATCHED, "team-b"]}
            ]
        }
    else:
        assert selected is None  # every namespace: the operator serves caches in all of them
    if name == "cert-manager":
        assert "caBundle" not in hook["clientConfig"]
    else:
        assert hook["clientConfig"]["caBundle"] == webhook_of(objects)["clientConfig"]["caBundle"]


@pytest.mark.slow
def test_webhook_off_removes_all_of_it(rendered):
    objects = rendered["webhook-off"]
    kinds = {obj["kind"] for obj in objects}
    assert not kinds & {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Secret",
        "Certificate",
        "Issuer",
    }
    services = [obj["metadata"]["labels"]["app.kubernetes.io/component"] for obj in only(objects, "Service")]
    assert services == ["metrics"]  # the metrics Service only
    assert env_of(objects)["COMPILECACHE_WEBHOOK"] == "off"
    assert not any(key.startswith("COMPILECACHE_WEBHOOK_") for key in env_of(objects))
    assert "/certs" not in {m["mountPath"] for m in container_of(objects)["volumeMounts"]}
    # The pods rules stay: the operator watches gated pods whether or not the webhook gates them.
    grants = grants_of(objects, "cc-compilecache-operator", NAMESPACE)
    assert {rule for _, rule in grants.rules() if rule[2] == "pods"} == {
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("patch", "", "pods"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rbac_has_no_wildcards_and_binds_the_deployments_service_account(rendered, name: str):
    objects = rendered[name]
    assert wildcards(objects) == []
    bound = deployment_of(objects)["spec"]["template"]["spec"]["serviceAccountName"]
    accounts = [obj for obj in only(objects, "ServiceAccount") if obj["metadata"]["name"] == bound]
    assert len(accounts) == 1, f"the Deployment's ServiceAccount {bound} is rendered {len(accounts)} times"
    account = accounts[0]
    assert account["metadata"]["namespace"] == NAMESPACE
    # The caches' own accounts (cacheServiceAccounts) are identities for warm-up and training pods: no grants.
    for other in only(objects, "ServiceAccount"):
        if other is not account:
            assert not list(grants_of(objects, other["metadata"]["name"], other["metadata"]["namespace"]).rules())
    grants = grants_of(objects, account["metadata"]["name"], NAMESPACE)
    assert list(grants.rules()), "the ServiceAccount is bound to nothing"
    namespaces = VALUE_SETS[name].get("watchNamespaces") or []
    # Watching named namespaces grants namespaced resources only there, never cluster-wide.
    if namespaces:
        assert set(grants.per_namespace) == set(namespaces)
        assert not [rule for ns, rule in grants.rules() if ns is None and rule[2] in ("jobs", "pods", "compilecaches")]


# --- RBAC derived from a recorded session of the real operator ---------------------------------------


TRAINER = "trainer.kubeflow.org"  # Kubeflow Trainer's group (controller/template.py)


def _add_resources(emulator: KubeEmulator) -> KubeEmulator:
    """What a real cluster with the chart installed also serves: CRDs (kopf's peerings are in RESOURCES)."""
    verbs = {"create", "delete", "get", "list", "patch", "update", "watch"}
    extra = {
        "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
            kind="CustomResourceDefinition", namespaced=False
        ),
        "v1/services": kmock.ResourceInfo(kind="Service", namespaced=True),  # multi-host warm-ups
        # Kubeflow Trainer's kinds (a TrainJob a templateRef names, and its runtimes): the scenario makes
        # some, so the pass reads the runtime after the TrainJob (the other workload kinds answer 404).
        f"{TRAINER}/v1alpha1/trainjobs": kmock.ResourceInfo(kind="TrainJob", namespaced=True),
        f"{TRAINER}/v1alpha1/trainingruntimes": kmock.ResourceInfo(kind="TrainingRuntime", namespaced=True),
        f"{TRAINER}/v1alpha1/clustertrainingruntimes": kmock.ResourceInfo(
            kind="ClusterTrainingRuntime", namespaced=False
        ),
    }
    for resource, info in extra.items():
        info.verbs = set(verbs)
        emulator.resources[resource] = info
    return emulator


def _calls_of(requests: list[Any]) -> set[ApiCall]:
    """The operator's authorizable requests; fails on a client it does not know."""
    calls: set[ApiCall] = set()
    for request in requests:
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
        if agent.startswith(TEST_AGENT):
            continue
        assert agent.startswith(OPERATOR_AGENTS), f"a request from an unknown client {agent!r}: {request.url}"
        if request.resource is None or request.resource.plural is None:
            assert request.method == "GET", f"a non-resource request that is not discovery: {request.url}"
            continue
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        verb = rbac_verb(str(request.method.value), request.name, request.params)
        calls.add(ApiCall(verb, request.resource.group or "", resource, request.namespace))
    return calls


def _operator_session(tmp: Path, argv: list[str], namespace: str, prepare: Any, scenario: Any) -> set[ApiCall]:
    """Run the real operator with kopf options ``argv`` through ``scenario(kube)``; its API calls."""
    from kopf.testing import KopfRunner

    from compilecache.controller import handlers
    from compilecache.controller.runner import served_namespaces

    with running_emulator(tmp, _add_resources(KubeEmulator())) as runner, pytest.MonkeyPatch.context() as patch:
        write_kubeconfig(SESSION_KUBECONFIG, runner.url)  # kopf's login and our client read it
        patch.setenv("KUBECONFIG", str(SESSION_KUBECONFIG))
        patch.setenv(handlers.RESYNC_SECONDS_ENV, "0.3")
        # What `compilecache operator` tells the gate watchdog (it is not in the way under KopfRunner).
        patch.setenv(handlers.WATCHDOG_NAMESPACES_ENV, json.dumps(served_namespaces(argv)))
        kube = KubeClient(runner)
        try:
            for node in cluster():
                kube.create("v1/nodes", node)
            prepare(kube)
            with KopfRunner(["run", *argv], registry=handlers.registry, timeout=30) as operator:
                scenario(kube, namespace)
            assert operator.exception is None, operator.output
            assert "Traceback" not in operator.output, operator.output

            async def requests() -> list[Any]:
                return list(runner.emulator)

            return _calls_of(runner.call(requests))
        finally:
            SESSION_KUBECONFIG.unlink(missing_ok=True)


def _jobs(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    return kube.list(JOBS, namespace, "compilecache.dev/cache=llama")


def _full_scenario(kube: KubeClient, namespace: str) -> None:
    """A cache on a created claim: Jobs appear, a gated training pod waits, the Jobs finish, expiry
    runs as a Job and finishes, and the pod is released, a new image replaces the Jobs, the cache goes."""
    kube.create(CC, {"metadata": {"name": "llama"}, "spec": cache_spec()}, namespace)
    jobs = kube.wait_for(lambda: len(_jobs(kube, namespace)) == 2 and _jobs(kube, namespace))
    pod = {
        "metadata": {"name": "trainer", "labels": {"compilecache.dev/cache": "llama"}},
        "spec": {"schedulingGates": [{"name": "compilecache.dev/warm"}], "containers": [{"name": "t", "image": "x"}]},
    }
    kube.create("v1/pods", pod, namespace)  # as the webhook admits it: gated until the cache is Ready
    done = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1, "startTime": "2026-01-01T00:00:00Z"}
    for job in jobs:
        kube.patch(JOBS, job["metadata"]["name"], {"status": done}, namespace, "status")
    # Then the expiry Job: its pod's termination message carries the summary the operator reads.
    [expiry] = kube.wait_for(lambda: kube.list(JOBS, namespace, "compilecache.dev/expiry-of=llama"))
    # As the Job controller makes it: the template's labels, and job-name.
    labels = expiry["spec"]["template"]["metadata"]["labels"] | {"job-name": expiry["metadata"]["name"]}
    expiry_pod = {"metadata": {"name": "expiry", "labels": labels}}
    kube.create("v1/pods", expiry_pod | {"spec": {"containers": [{"name": "expire", "image": "x"}]}}, namespace)
    summary = '{"schema": "compilecache.dev/expiry/v1", "ok": true, "after": {"entries": 1, "bytes": 9}}'
    terminated = {"state": {"terminated": {"exitCode": 0, "message": summary}}}
    expiry_status = {"containerStatuses": [{"name": "expire", **terminated}]}
    kube.patch("v1/pods", "expiry", {"status": expiry_status}, namespace, "status")
    kube.patch(JOBS, expiry["metadata"]["name"], {"status": done}, namespace, "status")
    kube.wait_for(lambda: not (kube.get("v1/pods", "trainer", namespace) or {})["spec"].get("schedulingGates"))
    old = {job["metadata"]["name"] for job in jobs}
    warmup = cache_spec()["warmup"] | {"image": "registry.example/trainer:1.3"}
    kube.patch(CC, "llama", {"spec": {"warmup": warmup}}, namespace)  # a new spec hash: the old Jobs go
    kube.wait_for(lambda: (names := {j["metadata"]["name"] for j in _jobs(kube, namespace)}) and not names & old)
    _multihost_scenario(kube, namespace)
    _capacity_scenario(kube, namespace)
    _provisioning_scenario(kube, namespace)
    _template_scenario(kube, namespace)
    kube.delete(CC, "llama", namespace)
    kube.wait_for(lambda: _jobs(kube, namespace) == [])
    time.sleep(0.5)  # a resync round after the deletion


def _multihost_scenario(kube: KubeClient, namespace: str) -> None:
    """A 2-host warm-up: its headless Service is created with the Job, and deleted once the Job finished."""
    spec = cache_spec()
    h100 = {"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}}
    spec["warmup"] |= {"topologies": [{"hosts": 2}], "pools": [h100]}
    spec["warmup"].pop("discover")
    # Its own claim: llama's (labelled for llama) is not this cache's to mount (policy.claim_violation).
    spec["storage"] = {"pvc": {"claimName": "multi-cache", "create": {"size": "1Gi"}}}
    kube.create(CC, {"metadata": {"name": "multi"}, "spec": spec}, namespace)
    services = "compilecache.dev/cache=multi"
    [job] = kube.wait_for(lambda: kube.list(JOBS, namespace, services))
    [service] = kube.wait_for(lambda: kube.list("v1/services", namespace, services))
    assert service["metadata"]["name"] == job["metadata"]["name"]
    done = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2, "startTime": "2026-01-01T00:00:00Z"}
    kube.patch(JOBS, job["metadata"]["name"], {"status": done}, namespace, "status")
    kube.wait_for(lambda: kube.list("v1/services", namespace, services) == [])  # the operator deleted it
    kube.delete(CC, "multi", namespace)


def _capacity_scenario(kube: KubeClient, namespace: str) -> None:
    """A pool with no node yet (its GPUs declared): its Job is made, its pod waits for a node, and the pass
    reads what the autoscaler said on that pod (a list of the pod's Events)."""
    spec = cache_spec()
    spec["warmup"]["pools"] = [{"name": "l4", "nodeSelector": {PRODUCT: "NVIDIA-L4"}, "gpusPerPod": 1}]
    spec["warmup"].pop("discover")
    spec["storage"] = {"pvc": {"claimName": "scaled-cache", "create": {"size": "1Gi"}}}
    kube.create(CC, {"metadata": {"name": "scaled"}, "spec": spec}, namespace)
    [job] = kube.wait_for(lambda: kube.list(JOBS, namespace, "compilecache.dev/cache=scaled"))
    labels = job["spec"]["template"]["metadata"]["labels"] | {"job-name": job["metadata"]["name"]}
    pod = kube.create("v1/pods", {"metadata": {"name": "scaled-warm", "labels": labels}, "spec": {}}, namespace)
    involved = {"kind": "Pod", "name": "scaled-warm", "namespace": namespace, "uid": pod["metadata"]["uid"]}
    said = "pod triggered scale-up: [{l4-pool 0->1 (max: 2)}]"
    scale_up = {"reason": "TriggeredScaleUp", "message": said, "source": {"component": "cluster-autoscaler"}}
    kube.create("v1/events", {"metadata": {"name": "scaled-warm.1"}, "involvedObject": involved, **scale_up}, namespace)
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}
    kube.patch(
        "v1/pods", "scaled-warm", {"status": {"phase": "Pending", "conditions": [unschedulable]}}, namespace, "status"
    )
    kube.wait_for(
        lambda: any(
            said in p.get("message", "")
            for p in (kube.get(CC, "scaled", namespace) or {}).get("status", {}).get("pools") or []
        )
    )
    kube.delete(CC, "scaled", namespace)


def _provisioning_scenario(kube: KubeClient, namespace: str) -> None:
    """A cache that asks for its capacity: a PodTemplate and a ProvisioningRequest, the Job suspended; the
    request Provisioned (as Cluster Autoscaler writes it): the Job let go; finished: the request deleted."""
    spec = cache_spec()
    spec["warmup"]["pools"] = [{"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}, "gpusPerPod": 8}]
    spec["warmup"].pop("discover")
    spec["warmup"]["provisioningRequest"] = {"className": "queued-provisioning.gke.io"}
    spec["storage"] = {"pvc": {"claimName": "queued-cache", "create": {"size": "1Gi"}}}
    kube.create(CC, {"metadata": {"name": "queued"}, "spec": spec}, namespace)
    requests = "autoscaling.x-k8s.io/v1/provisioningrequests"
    [request] = kube.wait_for(lambda: kube.list(requests, namespace, "compilecache.dev/cache=queued"))
    [job] = kube.wait_for(lambda: kube.list(JOBS, namespace, "compilecache.dev/cache=queued"))
    assert job["spec"]["suspend"] is True
    assert kube.get("v1/podtemplates", request["metadata"]["name"], namespace) is not None
    provisioned = {
        "type": "Provisioned",
        "status": "True",
        "reason": "Provisioned",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    kube.patch(requests, request["metadata"]["name"], {"status": {"conditions": [provisioned]}}, namespace, "status")
    kube.wait_for(lambda: (kube.get(JOBS, job["metadata"]["name"], namespace) or {})["spec"].get("suspend") is False)
    done = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1, "startTime": "2026-01-01T00:00:00Z"}
    kube.patch(JOBS, job["metadata"]["name"], {"status": done}, namespace, "status")
    kube.wait_for(lambda: kube.list(requests, namespace, "compilecache.dev/cache=queued") == [])
    assert kube.get("v1/podtemplates", request["metadata"]["name"], namespace) is None
    kube.delete(CC, "queued", namespace)


def _template_scenario(kube: KubeClient, namespace: str) -> None:
    """Caches whose warm-ups take training's pod template by reference: a PodTemplate from the index, each
    workload kind read (get) by name, and two TrainJobs with their runtimes, a namespaced TrainingRuntime and
    a ClusterTrainingRuntime, read after them (no runtime exists: the cache fails naming it, after the read)."""
    for name, runtime in (("tj-ns", "TrainingRuntime"), ("tj-cluster", "ClusterTrainingRuntime")):
        job = {"metadata": {"name": name}, "spec": {"runtimeRef": {"name": "torch", "kind": runtime}}}
        kube.create(f"{TRAINER}/v1alpha1/trainjobs", job, namespace)
    refs = [(kind, "training") for kind in template.KINDS if kind != "TrainJob"]
    for kind, ref in [*refs, ("TrainJob", "tj-ns"), ("TrainJob", "tj-cluster")]:
        spec = cache_spec()
        spec["warmup"]["podTemplate"] = {"templateRef": {"kind": kind, "name": ref}}
        spec["storage"] = {"pvc": {"claimName": f"{kind.lower()}-{ref}-cache", "create": {"size": "1Gi"}}}
        name = f"tpl-{kind.lower()}-{ref}"
        kube.create(CC, {"metadata": {"name": name}, "spec": spec}, namespace)
        kube.wait_for(lambda name=name: (kube.get(CC, name, namespace) or {}).get("status", {}).get("phase"))
        kube.delete(CC, name, namespace)


@pytest.fixture(scope="module")
def peering_name(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The name of the peering object the chart creates."""
    objects = render(VALUE_SETS["replicas-2"], tmp_path_factory.mktemp("peering"))
    name: str = one(objects, "ClusterKopfPeering")["metadata"]["name"]
    return name


def _cluster_peering(peering_name: str, kube: KubeClient) -> None:
    kube.create("kopf.dev/v1/clusterkopfpeerings", {"metadata": {"name": peering_name}})


def _namespace_and_peering(peering_name: str, kube: KubeClient) -> None:
    kube.create("v1/namespaces", {"metadata": {"name": WATCHED, "labels": {"kubernetes.io/metadata.name": WATCHED}}})
    kube.create("kopf.dev/v1/kopfpeerings", {"metadata": {"name": peering_name}}, WATCHED)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, peering_name: str) -> dict[str, set[ApiCall]]:
    """The operator's API calls through the full scenario: with peering in all namespaces, and in one."""

    cluster_peering = functools.partial(_cluster_peering, peering_name)
    namespace_and_peering = functools.partial(_namespace_and_peering, peering_name)

    clusterwide = _operator_session(
        tmp_path_factory.mktemp("all"), [f"--peering={peering_name}", "-A"], "default", cluster_peering, _full_scenario
    )
    namespaced = _operator_session(
        tmp_path_factory.mktemp("one"),
        [f"--peering={peering_name}", f"--namespace={WATCHED}"],
        WATCHED,
        namespace_and_peering,
        _full_scenario,
    )
    return {"replicas-2": clusterwide, "replicas-2-namespaces": namespaced}


# (recorded session, value set rendered): the chart always runs kopf with --peering.
RBAC_CASES = [
    ("replicas-2", "replicas-2"),
    ("replicas-2-namespaces", "replicas-2-namespaces"),
    ("replicas-2", "defaults"),
    ("replicas-2-namespaces", "namespaces"),
]


@pytest.mark.slow
@pytest.mark.emulator
def test_recorded_session_covers_what_the_operator_does(recorded):
    """The scenario exercised every kind of call the code makes (else the derivation proves little)."""
    rules = {call.rule for call in recorded["replicas-2"]}
    expected = {
        ("list", "compilecache.dev", "compilecaches"),
        ("watch", "compilecache.dev", "compilecaches"),
        ("get", "compilecache.dev", "compilecaches"),
        ("patch", "compilecache.dev", "compilecaches/status"),
        ("list", "batch", "jobs"),
        ("watch", "batch", "jobs"),
        ("create", "batch", "jobs"),
        ("delete", "batch", "jobs"),
        ("list", "", "persistentvolumeclaims"),
        ("watch", "", "persistentvolumeclaims"),
        ("create", "", "persistentvolumeclaims"),
        ("list", "", "nodes"),
        ("watch", "", "nodes"),
        ("create", "", "events"),
        ("list", "", "events"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("patch", "", "pods"),
        ("patch", "kopf.dev", "clusterkopfpeerings"),
        ("list", "", "services"),
        ("watch", "", "services"),
        ("create", "", "services"),
        ("delete", "", "services"),
        ("list", "", "podtemplates"),
        ("watch", "", "podtemplates"),
        ("get", "batch", "jobs"),
        ("get", "jobset.x-k8s.io", "jobsets"),
        ("get", "leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("get", TRAINER, "trainjobs"),
        ("get", TRAINER, "trainingruntimes"),
        ("get", TRAINER, "clustertrainingruntimes"),
        ("get", "kubeflow.org", "pytorchjobs"),
        ("get", "ray.io", "rayjobs"),
        ("patch", "batch", "jobs"),
        ("create", "", "podtemplates"),
        ("delete", "", "podtemplates"),
        ("list", "autoscaling.x-k8s.io", "provisioningrequests"),
        ("create", "autoscaling.x-k8s.io", "provisioningrequests"),
        ("delete", "autoscaling.x-k8s.io", "provisioningrequests"),
    }
    assert expected <= rules, sorted(expected - rules)
    assert ("list", "", "namespaces") in {call.rule for call in recorded["replicas-2-namespaces"]}


@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize(("session", "values"), RBAC_CASES, ids=[f"{s}->{v}" for s, v in RBAC_CASES])
def test_rbac_allows_every_recorded_call(recorded, rendered, session: str, values: str):
    calls = recorded[session]
    grants = grants_of(rendered[values], "cc-compilecache-operator", NAMESPACE)
    denied = sorted(str(call) for call in calls if not grants.allows(call))
    assert denied == []


@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize(("session", "values"), RBAC_CASES, ids=[f"{s}->{v}" for s, v in RBAC_CASES])
def test_rbac_grants_nothing_unused(recorded, rendered, session: str, values: str):
    used = {call.rule for call in recorded[session]}
    grants = grants_of(rendered[values], "cc-compilecache-operator", NAMESPACE)
    unused = sorted({rule for _, rule in grants.rules() if rule not in used and rule not in NOT_RECORDED})
    assert unused == []


# --- Kueue (kueue.enabled): the AdmissionCheck controller's environment, RBAC and AdmissionCheck -----------

KUEUE = "kueue.x-k8s.io"
DEFAULT_CHECK = "compilecache-warm"
# What the operator does with Workloads (namespaced) and AdmissionChecks (cluster-scoped): read and
# watch them, and patch their status; never create, update or delete either.
KUEUE_NAMESPACED = {("get", KUEUE, "workloads"), ("list", KUEUE, "workloads"), ("watch", KUEUE, "workloads")}
KUEUE_NAMESPACED |= {("patch", KUEUE, "workloads/status")}
KUEUE_CLUSTER = {("list", KUEUE, "admissionchecks")}
KUEUE_CLUSTER |= {("watch", KUEUE, "admissionchecks"), ("patch", KUEUE, "admissionchecks/status")}

# Kueue v0.19's AdmissionCheck as its CRD validates it (config/components/crd/bases/
# kueue.x-k8s.io_admissionchecks.yaml, from apis/kueue/v1beta2/admissioncheck_types.go): spec.controllerName
# required, parameters optional with apiGroup, kind and name all required; metadata.name, as for every
# object, a DNS-1123 subdomain. Unknown fields are refused here, where the API server would prune them.
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KUEUE_ADMISSION_CHECK = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"enum": [f"{KUEUE}/v1beta2", f"{KUEUE}/v1beta1"]},
        "kind": {"const": "AdmissionCheck"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "not": {"required": ["namespace"]},  # cluster-scoped
            "properties": {
                "name": {"type": "string", "maxLength": 253, "pattern": _SUBDOMAIN},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["controllerName"],
            "additionalProperties": False,
            "properties": {
                "controllerName": {"type": "string", "minLength": 1},
                "retryDelayMinutes": {"type": "integer"},
                "parameters": {
                    "type": "object",
                    "required": ["apiGroup", "kind", "name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiGroup": {"type": "string", "maxLength": 253, "pattern": _SUBDOMAIN},
                        "kind": {"type": "string", "maxLength": 63, "pattern": "^[A-Za-z]([-A-Za-z0-9]*[A-Za-z0-9])?$"},
                        "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                    },
                },
            },
        },
    },
}


def kueue_values(name: str) -> dict[str, Any]:
    """The set's kueue values with the chart's defaults filled in."""
    values = VALUE_SETS[name].get("kueue", {})
    check = {"create": True, "name": DEFAULT_CHECK} | values.get("admissionCheck", {})
    return {"enabled": bool(values.get("enabled")), "admissionCheck": check}


def is_dns_subdomain(name: str) -> bool:
    """Kubernetes' IsDNS1123Subdomain, stated apart from the schema's regex: at most 253 characters, and
    dot-separated parts that are each a DNS-1123 label's characters (no 63-character cap per part)."""
    return 0 < len(name) <= 253 and all(DNS1123_LABEL.fullmatch(part) for part in name.split("."))


# Names near and past the 253 limit, and short ones of every character that matters.
_NAMES = st.one_of(
    st.text(alphabet="az09-.A_ ", max_size=12),
    st.builds(lambda n, tail: "a" * n + tail, st.integers(240, 260), st.sampled_from(["", "b", ".c", "-", "."])),
)


@given(_NAMES)
@settings(max_examples=300, deadline=None)
def test_values_schema_takes_an_admission_check_name_exactly_when_kubernetes_would(name: str):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    values = {"kueue": {"enabled": True, "admissionCheck": {"create": True, "name": name}}}
    errors = list(validator.iter_errors(values))
    assert (errors == []) == is_dns_subdomain(name), [e.message for e in errors]
    assert all(list(error.absolute_path) == ["kueue", "admissionCheck", "name"] for error in errors)


def test_values_schema_types_the_kueue_keys():
    """The AdmissionCheck's controllerName is the chart's, not a value; create is a boolean."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    assert list(validator.iter_errors({"kueue": {"enabled": True, "admissionCheck": {"create": False}}})) == []
    for check in ({"controllerName": "someone-else/warm"}, {"create": "yes"}, {"name": 7}):
        assert list(validator.iter_errors({"kueue": {"enabled": True, "admissionCheck": check}})), check


def test_values_schema_types_both_images_alike():
    """The operator's image and the injected runtime's (issue 33) take the same keys, each typed."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    good = {"repository": "registry.example:5000/ml/compilecache-runtime", "tag": "0.1.0", "pullPolicy": "Always"}
    bad = [
        {"repository": "Registry Example/runtime"},
        {"repository": "registry.example/" + "r" * 255},
        {"tag": "v1 beta"},
        {"tag": 1},
        {"digest": "sha256:short"},
        {"pullPolicy": "Sometimes"},
        {"pullPolicy": None},
        {"command": ["sh"]},
    ]
    for keys in (["image"], ["runtime", "image"]):

        def values(image: dict[str, Any], keys: list[str] = keys) -> dict[str, Any]:
            return {keys[0]: image} if len(keys) == 1 else {keys[0]: {keys[1]: image}}

        assert list(validator.iter_errors(values(good))) == []
        assert list(validator.iter_errors(values(good | {"digest": DIGEST, "tag": ""}))) == []
        for change in bad:
            errors = list(validator.iter_errors(values(good | change)))
            assert errors, (keys, change)
            assert all(list(error.absolute_path)[: len(keys)] == keys for error in errors), (keys, change)
        for required in ("repository", "pullPolicy"):
            assert list(validator.iter_errors(values({k: v for k, v in good.items() if k != required}))), required
    assert list(validator.iter_errors({"runtime": {"image": good, "resources": {}}}))  # nothing but the image
    assert list(validator.iter_errors({"runtime": {}}))


@pytest.mark.slow
def test_helm_refuses_an_admission_check_name_that_is_no_dns_subdomain(tmp_path: Path):
    good = {"kueue": {"enabled": True, "admissionCheck": {"name": "team-a.warm"}}}
    assert one(render(good, tmp_path), "AdmissionCheck")["metadata"]["name"] == "team-a.warm"
    for bad in ("Compile_Warm", "", "a" * 254, "-warm"):
        values = {"kueue": {"enabled": True, "admissionCheck": {"name": bad}}}
        done = helm("template", "cc", values=values, tmp=tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode != 0, f"helm template accepted the name {bad!r}"
        assert "schema" in output and "/kueue/admissionCheck/name" in output, output


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_kueue_rbac_is_granted_exactly_when_enabled(rendered, name: str):
    """Workloads where the operator serves caches (the ClusterRole, or the watched namespaces' Roles),
    AdmissionChecks cluster-wide (they are cluster-scoped); nothing of Kueue's when it is off."""
    grants = grants_of(rendered[name], "cc-compilecache-operator", NAMESPACE)
    found = {(namespace, rule) for namespace, rule in grants.rules() if rule[1] == KUEUE}
    wanted: set[tuple[str | None, tuple[str, str, str]]] = set()
    if kueue_values(name)["enabled"]:
        namespaces: list[str | None] = list(VALUE_SETS[name].get("watchNamespaces") or [None])
        wanted = {(None, rule) for rule in KUEUE_CLUSTER}
        wanted |= {(namespace, rule) for namespace in namespaces for rule in KUEUE_NAMESPACED}
    assert found == wanted
    assert not {rule[0] for _, rule in found} & {"create", "update", "delete", "deletecollection"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_operator_runs_the_admission_check_controller_exactly_when_enabled(rendered, name: str):
    assert env_of(rendered[name])["COMPILECACHE_KUEUE"] == ("true" if kueue_values(name)["enabled"] else "false")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_admission_check_is_rendered_when_enabled_and_created_and_validates(rendered, name: str):
    jsonschema = pytest.importorskip("jsonschema")
    objects = rendered[name]
    rendered_checks = only(objects, "AdmissionCheck")
    kueue = kueue_values(name)
    if not (kueue["enabled"] and kueue["admissionCheck"]["create"]):
        assert rendered_checks == []
        return
    [check] = rendered_checks
    jsonschema.validate(check, KUEUE_ADMISSION_CHECK)
    assert check["apiVersion"] == f"{KUEUE}/v1beta2"
    assert check["metadata"]["name"] == kueue["admissionCheck"]["name"]
    assert check["spec"] == {"controllerName": checks.CONTROLLER_NAME}  # no parameters: the cache is in the pod sets
    assert check["metadata"]["labels"] == one(objects, "ClusterRole")["metadata"]["labels"]
    # The schema above can fail: what Kueue's CRD refuses, it refuses.
    refused = [
        {**check, "spec": {}},
        {**check, "spec": {"controllerName": checks.CONTROLLER_NAME, "parameters": {"kind": "X", "name": "y"}}},
        {**check, "metadata": {"name": "Warm_Check"}},
        {**check, "metadata": {"name": "warm", "namespace": NAMESPACE}},
    ]
    for body in refused:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(body, KUEUE_ADMISSION_CHECK)


@pytest.mark.slow
def test_notes_say_how_a_cluster_queue_lists_the_check(tmp_path: Path):
    values = {"kueue": {"enabled": True, "admissionCheck": {"name": "gpu-warm"}}}
    done = helm("install", "cc", "--namespace", NAMESPACE, "--dry-run=client", values=values, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "spec.admissionChecksStrategy.admissionChecks: [{name: gpu-warm}]" in notes
    assert "spec.admissionChecks: [gpu-warm]" in notes and 'created "gpu-warm"' in notes
    own = {"kueue": {"enabled": True, "admissionCheck": {"create": False, "name": "gpu-warm"}}}
    done = helm("install", "cc", "--namespace", NAMESPACE, "--dry-run=client", values=own, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "[{name: gpu-warm}]" in notes and "created" not in notes
    off = helm("install", "cc", "--namespace", NAMESPACE, "--dry-run=client", values={}, tmp=tmp_path)
    assert "Kueue" not in off.stdout.split("NOTES:", 1)[1]


# The AdmissionCheck controller registers its handlers once per process (handlers.serve_admission_checks),
# so its session runs `compilecache operator` as the chart's Deployment does, in a process of its own.
def _kueue_session(tmp: Path, argv: list[str], namespace: str, prepare: Any) -> set[ApiCall]:
    """The calls of the operator with COMPILECACHE_KUEUE=true while it activates our AdmissionCheck and
    lets through a Workload whose pods opt into no existing cache (its check goes Ready at once)."""
    workloads = "kueue.x-k8s.io/v1beta2/workloads"
    with running_emulator(tmp, _add_resources(KubeEmulator())) as runner:
        kubeconfig = tmp / "kubeconfig"
        write_kubeconfig(kubeconfig, runner.url)
        kube = KubeClient(runner)
        prepare(kube)
        env = os.environ | {
            "KUBECONFIG": str(kubeconfig),
            "COMPILECACHE_KUEUE": "true",
            "COMPILECACHE_METRICS_PORT": "0",
        }
        command = [str(Path(sys.executable).parent / "compilecache"), "operator", *argv]
        log = tmp / "operator.log"
        with log.open("w") as out, subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT) as operator:
            try:
                check = {"metadata": {"name": DEFAULT_CHECK}, "spec": {"controllerName": checks.CONTROLLER_NAME}}
                kube.create("kueue.x-k8s.io/v1beta2/admissionchecks", check)
                kube.wait_for(
                    lambda: (kube.get("kueue.x-k8s.io/v1beta2/admissionchecks", DEFAULT_CHECK) or {})["status"],
                    timeout=60,
                )
                pod_set = {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "metadata": {"labels": {"compilecache.dev/cache": "nowhere"}},
                        "spec": {"containers": [{"name": "train", "image": "trainer:1"}]},
                    },
                }
                body = {"metadata": {"name": "job-train"}, "spec": {"queueName": "training", "podSets": [pod_set]}}
                kube.create(workloads, body, namespace)
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                reserved = {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""}
                pending = {"name": DEFAULT_CHECK, "state": "Pending", "message": "", "lastTransitionTime": now}
                status = {"conditions": [reserved | {"lastTransitionTime": now}], "admissionChecks": [pending]}
                kube.patch(workloads, "job-train", {"status": status}, namespace, "status")
                kube.wait_for(
                    lambda: (
                        kube.get(workloads, "job-train", namespace)["status"]["admissionChecks"][0]["state"] == "Ready"
                    ),
                    timeout=60,
                )
            finally:
                operator.terminate()
                operator.wait(timeout=30)
        assert "Traceback" not in log.read_text(), log.read_text()

        async def requests() -> list[Any]:
            return list(runner.emulator)

        return _calls_of(runner.call(requests))


@pytest.fixture(scope="module")
def recorded_kueue(tmp_path_factory: pytest.TempPathFactory, peering_name: str) -> dict[str, set[ApiCall]]:
    """The AdmissionCheck controller's calls: in all namespaces (ClusterRole) and in one (Roles)."""

    cluster_peering = functools.partial(_cluster_peering, peering_name)
    namespace_and_peering = functools.partial(_namespace_and_peering, peering_name)

    all_namespaces = [f"--peering={peering_name}", "-A"]
    one_namespace = [f"--peering={peering_name}", f"--namespace={WATCHED}"]
    return {
        "kueue-all-namespaces": _kueue_session(
            tmp_path_factory.mktemp("kueue-all"), all_namespaces, "default", cluster_peering
        ),
        "kueue": _kueue_session(tmp_path_factory.mktemp("kueue-one"), one_namespace, WATCHED, namespace_and_peering),
    }


# Kueue grants no recorded session uses, each with why it stays.
KUEUE_NOT_RECORDED: dict[tuple[str, str, str], str] = {
    ("get", KUEUE, "workloads"): "an audit pass reads each Workload its index says waits (reconcile.release_workloads)",
}


@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("name", ["kueue-all-namespaces", "kueue"])
def test_kueue_rbac_allows_every_call_of_the_admission_check_controller_and_nothing_unused(
    recorded_kueue, rendered, name: str
):
    calls = recorded_kueue[name]
    used = {call.rule for call in calls}
    assert {rule for rule in used if rule[1] == KUEUE} <= KUEUE_NAMESPACED | KUEUE_CLUSTER
    assert {("patch", KUEUE, "workloads/status"), ("patch", KUEUE, "admissionchecks/status")} <= used
    grants = grants_of(rendered[name], "cc-compilecache-operator", NAMESPACE)
    assert sorted(str(call) for call in calls if not grants.allows(call)) == []
    granted = {rule for _, rule in grants.rules() if rule[1] == KUEUE}
    assert sorted(granted - used - set(KUEUE_NOT_RECORDED)) == []
