"""The real-cluster path of docs/install.md (and the README's short form of it), checked as far as this
machine can: the commands in the doc are exactly the ones tested here; ``make -n`` shows that the image
targets run what the Dockerfiles expect; the documented ``helm install`` flags render, with the image
``make push`` made, a pod that passes ``restricted``; ``helm show crds`` gives the CRDs the upgrade
applies; the verify step's warning is the one the webhook gives. No cluster or container runtime runs
here, so ``docker``, ``kubectl`` and ``helm install/upgrade`` themselves are not run.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import podsecurity
from chartrender import CHART, ROOT, helm, one
from compilecache.controller import admission, policy

DOC = ROOT / "docs" / "install.md"
REGISTRY, TAG, NEXT_TAG = "registry.example.com/ml", "0.1.0", "0.2.0"
RELEASE, NAMESPACE = "compilecache-operator", "compilecache-system"
CHART_PATH = "./helm/compilecache-operator"
CHECK = "compilecache-check"

# Every shell command of docs/install.md, in order; a change to the doc must change this (and the tests).
COMMANDS = [
    f"make push REGISTRY={REGISTRY} TAG={TAG}",
    f"helm install {RELEASE} {CHART_PATH} --namespace {NAMESPACE} --create-namespace"
    f" --set image.repository={REGISTRY}/compilecache-operator --set image.tag={TAG}",
    f"kubectl --namespace {NAMESPACE} rollout status deployment/{RELEASE} --timeout=3m",
    f"kubectl run {CHECK} --image=busybox --restart=Never --dry-run=server --labels=compilecache.dev/cache={CHECK}",
    f"make push REGISTRY={REGISTRY} TAG={NEXT_TAG}",
    f"helm show crds {CHART_PATH} | kubectl apply --server-side --force-conflicts -f -",
    f"helm upgrade {RELEASE} {CHART_PATH} --namespace {NAMESPACE} --reset-then-reuse-values --set image.tag={NEXT_TAG}",
    f"helm uninstall {RELEASE} --namespace {NAMESPACE}",
]


def shell_blocks(text: str) -> list[str]:
    """The commands of the ```sh blocks of a Markdown text, one per line."""
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def readme_commands() -> list[str]:
    """The indented commands of the README's real-cluster section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Install on a real cluster", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def test_the_documented_commands_are_the_tested_ones():
    assert shell_blocks(DOC.read_text()) == COMMANDS


def test_the_readme_takes_its_steps_from_the_install_doc():
    commands = readme_commands()
    assert commands and set(commands) <= set(COMMANDS), sorted(set(commands) - set(COMMANDS))
    for step in ("make push", "helm install", "rollout status", "--dry-run=server", "helm show crds", "helm upgrade"):
        assert any(step in command for command in commands), step
    assert "helm uninstall" in (ROOT / "README.md").read_text()


def make_n(*args: str) -> list[str]:
    # As a user types it: under `make test` (CI) the parent make's variables would make this one a
    # sub-make, which prints "make[1]: Entering directory ..." among the commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    done = subprocess.run(
        ["make", "-n", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the root) out of the build context.

    As docker reads it: the last pattern that matches the path or one of its parent folders decides,
    and a ``!`` pattern lets the path back in.
    """
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    excluded = False
    parts = Path(path).parts
    for line in (line for line in lines if line and not line.startswith("#")):
        keep = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            excluded = not keep
    return excluded


def test_make_push_builds_every_dockerfile_from_the_root_and_pushes_what_it_built():
    lines = make_n(*shlex.split(COMMANDS[0])[1:])
    names = ("operator", "warmer", "warmer-torch")
    tags = [f"{REGISTRY}/compilecache-{name}:{TAG}" for name in names]
    assert lines == [
        *(f"docker build -f images/{name}/Dockerfile -t {tag} ." for name, tag in zip(names, tags, strict=True)),
        *(f"docker push {tag}" for tag in tags),
    ]
    assert sorted(path.parent.name for path in (ROOT / "images").glob("*/Dockerfile")) == sorted(names)
    for line in lines[: len(names)]:
        dockerfile = ROOT / shlex.split(line)[3]
        text = dockerfile.read_text()
        assert "Build from the repository root" in text  # the context `.` is what the Dockerfile expects
        sources = [
            source
            for args in re.findall(r"^COPY (?!--from)(.+)$", text, re.MULTILINE)
            for source in shlex.split(args)[:-1]
        ]
        assert sources, dockerfile
        assert dockerignored("tests/conftest.py") and dockerignored(".venv/bin/python")  # the rules do exclude
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile}: COPY {source} is not in the repository"
            assert not dockerignored(source), f"{dockerfile}: COPY {source} is excluded by .dockerignore"


def test_make_images_tags_the_charts_app_version_by_default():
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    lines = make_n("images")
    assert lines[0].endswith(f"-t compilecache/compilecache-operator:{app_version} .")
    assert lines == [line for line in make_n("images", f"TAG={app_version}")]
    assert not [line for line in lines if "push" in line]


def helm_args(command: str) -> list[str]:
    """A documented helm command's arguments after the subcommand, without the chart path."""
    args = shlex.split(command)
    assert args[0] == "helm" and CHART_PATH in args, command
    return [arg for arg in args[2:] if arg != CHART_PATH]


@pytest.mark.slow
def test_the_documented_install_renders_the_pushed_image_in_a_restricted_pod(tmp_path: Path):
    args = helm_args(COMMANDS[1])
    done = helm("template", *args, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    deployment: dict[str, Any] = dict(one(objects, "Deployment"))
    assert deployment["metadata"]["name"] == RELEASE  # the name the verify step waits for
    assert deployment["metadata"]["namespace"] == NAMESPACE
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    pushes = [line.split()[-1] for line in make_n(*shlex.split(COMMANDS[0])[1:]) if line.startswith("docker push ")]
    [pushed] = [image for image in pushes if image.rsplit("/", 1)[-1].startswith("compilecache-operator:")]
    assert container["image"] == pushed
    assert podsecurity.violations(deployment) == []
    # The webhook the verify step reaches: by the cache label, also for dry-run requests.
    config = one(objects, "MutatingWebhookConfiguration")
    assert {webhook["sideEffects"] for webhook in config["webhooks"]} == {"None"}


@pytest.mark.slow
def test_the_crd_upgrade_applies_exactly_the_charts_crds(tmp_path: Path):
    """`helm show crds` (what the upgrade pipes to kubectl) is the chart's crds/, whole and unchanged."""
    show, _pipe = COMMANDS[5].split(" | ")
    done = helm(*shlex.split(show)[1:3], tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = sorted((doc for doc in yaml.safe_load_all(done.stdout) if doc), key=lambda crd: crd["metadata"]["name"])
    files = sorted(
        (doc for path in sorted((CHART / "crds").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())),
        key=lambda crd: crd["metadata"]["name"],
    )
    assert shown == files
    assert [crd["metadata"]["name"] for crd in shown] == [
        "clusterkopfpeerings.kopf.dev",
        "compilecaches.compilecache.dev",
        "kopfpeerings.kopf.dev",
    ]
    assert (CHART / "crds" / "compilecache.yaml").read_bytes() == (ROOT / "crds" / "compilecache.yaml").read_bytes()


@pytest.mark.slow
def test_the_documented_upgrade_flags_exist_in_this_helm(tmp_path: Path):
    args = helm_args(COMMANDS[6])
    usage = helm("upgrade", "--help", tmp=tmp_path).stdout  # the chart path after --help is ignored
    for flag in (arg.split("=")[0] for arg in args if arg.startswith("--")):
        assert f"{flag} " in usage or f"{flag}=" in usage, flag
    # The upgraded values render: the user's repository kept, the new tag taken.
    done = helm("template", *helm_args(COMMANDS[1]), "--set", f"image.tag={NEXT_TAG}", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{REGISTRY}/compilecache-operator:{NEXT_TAG}" in done.stdout


def test_the_verify_pod_gets_the_documented_warning_from_the_webhook():
    """The pod `kubectl run ... --labels=compilecache.dev/cache=compilecache-check` sends, admitted as the
    webhook admits it in a namespace with no such CompileCache: the one warning the doc shows."""
    args = shlex.split(COMMANDS[3])
    labels = dict(arg.split("=", 2)[1:] for arg in args if arg.startswith("--labels="))
    assert labels == {"compilecache.dev/cache": CHECK}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": args[2], "labels": labels},
        "spec": {"containers": [{"name": args[2], "image": "busybox"}], "restartPolicy": "Never"},
    }
    mutation = admission.admit(pod, [], rules=policy.DEFAULT)
    assert mutation.pod == pod  # admitted unchanged: the check leaves nothing behind
    [warning] = mutation.warnings
    assert f"Warning: {warning}\npod/{CHECK} created (server dry run)" in DOC.read_text()
