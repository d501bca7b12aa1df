"""The Kubernetes objects shipped in ``examples/`` are what the API server admits.

CompileCaches are checked against the CRD by ``tests/test_crd.py`` and run end to end by
``tests/test_e2e.py``; this checks everything else (the training Jobs and their Services)
against the OpenAPI schemas of Kubernetes 1.30-1.35 (kubernetes-validate, strict), and the
names a multi-host training Job derives from its own: ``<job>-<index>`` pod hostnames must be
DNS-1123 labels, as the Job controller makes them (pkg/controller/job/indexed_job_utils.go).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from compilecache.controller import policy
from compilecache.local.validation import dns1035_label, dns1123_label
from k8snames import KUBERNETES_VERSIONS

ROOT = Path(__file__).resolve().parent.parent


def _objects() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") != "CompileCache":
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


OBJECTS = _objects()
# The operator policy each CompileCache example needs beyond the chart's default, as its first lines
# tell (the end-to-end tests run the operator with it; the test below checks the two agree).
EXAMPLE_POLICIES: dict[str, dict[str, Any]] = {
    "cache-gcs.yaml": {"serviceAccounts": {"allow": ["default", "cache-writer", "cache-reader"]}},
}
CACHES = sorted(
    path
    for path in (ROOT / "examples").glob("*.yaml")
    if any(doc and doc.get("kind") == "CompileCache" for doc in yaml.safe_load_all(path.read_text()))
)
# A `--set` the header names, quoted or not (`--set 'policy.serviceAccounts.allow={a,b}'`).
_SET = re.compile(r"--set[ =]('[^']*'|\S+)")


def header(path: Path) -> str:
    """An example's first lines: the comment block before its first YAML line."""
    return "\n".join(itertools.takewhile(lambda line: line.startswith("#"), path.read_text().splitlines()))


def chart_policy(tmp: Path, sets: list[str]) -> policy.Policy:
    """The policy the chart hands the operator (its Deployment's COMPILECACHE_POLICY), installed with ``sets``."""
    from chartrender import NAMESPACE, RELEASE, helm, only

    args = ["template", RELEASE, "--namespace", NAMESPACE, *(arg for value in sets for arg in ("--set", value))]
    done = helm(*args, tmp=tmp)
    assert done.returncode == 0, done.stderr
    [deployment] = only([doc for doc in yaml.safe_load_all(done.stdout) if doc], "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [raw] = [env["value"] for env in container["env"] if env["name"] == policy.POLICY_ENV]
    return policy.parse(json.loads(raw))


@pytest.mark.parametrize("path", CACHES, ids=[path.name for path in CACHES])
def test_each_example_applies_to_the_chart_as_the_readme_installs_it_or_its_first_lines_say_what_to_set(
    path: Path, tmp_path: Path
) -> None:
    """What the validating webhook does to ``kubectl apply -f examples/X.yaml`` under the chart's policy."""
    caches = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "CompileCache"]
    sets = [value.strip("'") for value in _SET.findall(header(path))]
    refused = [found for cache in caches for found in policy.admission_violations(cache, chart_policy(tmp_path, []))]
    if not refused:
        assert path.name not in EXAMPLE_POLICIES
        return
    assert sets, (
        f"{path.name} is refused by the chart's default policy ({policy.describe(refused)}); "
        "its first lines name no --set"
    )
    assert [
        found for cache in caches for found in policy.admission_violations(cache, chart_policy(tmp_path, sets))
    ] == []
    needed = policy.parse(EXAMPLE_POLICIES[path.name])
    assert [found for cache in caches for found in policy.admission_violations(cache, needed)] == []


def test_the_examples_ship_single_and_multi_host_training() -> None:
    kinds = [name for name, _ in OBJECTS]
    assert "training-job.yaml:Job/llama-train" in kinds
    assert {"training-multihost.yaml:Job/llama-train-mh", "training-multihost.yaml:Service/llama-train-mh"} <= set(
        kinds
    )


@pytest.mark.parametrize("obj", [obj for _, obj in OBJECTS], ids=[name for name, _ in OBJECTS])
def test_example_objects_validate_against_kubernetes_schemas(obj: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate)"
    )
    failures = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{version}: {error.message}")
    assert failures == []


def test_the_multi_host_training_job_reaches_process_0_by_the_name_it_is_given() -> None:
    objects = {obj["kind"]: obj for name, obj in OBJECTS if name.startswith("training-multihost.yaml:")}
    job, service = objects["Job"], objects["Service"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    # A Service name is a DNS-1035 label; each pod's hostname <job>-<index> a DNS-1123 label.
    assert dns1035_label(service["metadata"]["name"]) == []
    assert all(dns1123_label(f"{job['metadata']['name']}-{index}") == [] for index in range(spec["completions"]))
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    host, port = env["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)
    assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}" and port.isdigit()
    assert int(env["COMPILECACHE_NUM_PROCESSES"]) == spec["completions"]
    # One process per node, and every pod opts in to the cache the example warms.
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert (
        term["topologyKey"] == "kubernetes.io/hostname"
        and term["labelSelector"]["matchLabels"].items() <= labels.items()
    )
    assert labels["compilecache.dev/cache"] == "llama-multihost"
