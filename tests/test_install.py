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

PUBLISHED = "ghcr.io/compilecache"  # the Makefile's default REGISTRY, where the chart's defaults point
# Every shell command of docs/install.md, in order; a change to the doc must change this (and the tests).
PUSH = f"make push REGISTRY={REGISTRY} TAG={TAG}"
MIRROR = [
    f"crane copy {PUBLISHED}/compilecache-{name}:{TAG} {REGISTRY}/compilecache-{name}:{TAG}"
    for name in ("operator", "runtime")
]
INSTALL = (
    f"helm install {RELEASE} {CHART_PATH} --namespace {NAMESPACE} --create-namespace"
    f" --set image.repository={REGISTRY}/compilecache-operator --set image.tag={TAG}"
    f" --set runtime.image.repository={REGISTRY}/compilecache-runtime --set runtime.image.tag={TAG}"
)
VERIFY = f"kubectl run {CHECK} --image=busybox --restart=Never --dry-run=server --labels=compilecache.dev/cache={CHECK}"
CRDS = f"helm show crds {CHART_PATH} | kubectl apply --server-side --force-conflicts -f -"
UPGRADE = (
    f"helm upgrade {RELEASE} {CHART_PATH} --namespace {NAMESPACE} --reset-then-reuse-values --set image.tag={NEXT_TAG}"
)
COMMANDS = [
    PUSH,
    *MIRROR,
    INSTALL,
    f"kubectl --namespace {NAMESPACE} rollout status deployment/{RELEASE} --timeout=3m",
    VERIFY,
    f"make push REGISTRY={REGISTRY} TAG={NEXT_TAG}",
    CRDS,
    UPGRADE,
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


# What `make push` builds by default: what a user needs (issue 33). The runtime, injected into training
# and warm-up pods, once its Dockerfile exists; the CUDA warmers only when asked for (WARMERS=1).
USER_IMAGES = ("operator", "runtime")
WARMER_IMAGES = ("warmer", "warmer-torch")


def dockerfile_names(root: Path = ROOT) -> list[str]:
    return sorted(path.parent.name for path in (root / "images").glob("*/Dockerfile"))


def pushed(lines: list[str]) -> list[str]:
    """The images a dry run of ``make push`` pushes, in order."""
    return [line.split()[-1] for line in lines if line.startswith("docker push ")]


def test_make_push_with_the_warmers_builds_every_dockerfile_from_the_root_and_pushes_what_it_built():
    lines = make_n(*shlex.split(PUSH)[1:], "WARMERS=1")
    names = [name for name in (*USER_IMAGES, *WARMER_IMAGES) if name in dockerfile_names()]
    assert dockerfile_names() == sorted(names), "an image make push does not know"
    tags = [f"{REGISTRY}/compilecache-{name}:{TAG}" for name in names]
    assert lines == [
        *(f"docker build -f images/{name}/Dockerfile -t {tag} ." for name, tag in zip(names, tags, strict=True)),
        *(f"docker push {tag}" for tag in tags),
    ]
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


def tree_with_every_image(tmp_path: Path) -> Path:
    """The Makefile and the chart's Chart.yaml in a tree with a Dockerfile for every image: the runtime's
    too, whichever images this checkout has."""
    (tmp_path / "helm" / "compilecache-operator").mkdir(parents=True)
    (tmp_path / "Makefile").write_bytes((ROOT / "Makefile").read_bytes())
    (tmp_path / "helm" / "compilecache-operator" / "Chart.yaml").write_bytes((CHART / "Chart.yaml").read_bytes())
    for name in (*USER_IMAGES, *WARMER_IMAGES):
        (tmp_path / "images" / name).mkdir(parents=True)
        (tmp_path / "images" / name / "Dockerfile").write_text("FROM scratch\n")
    return tmp_path


def make_n_in(tree: Path, *args: str) -> list[str]:
    return make_n("--no-print-directory", "-C", str(tree), *args)


def test_make_push_builds_only_what_a_user_needs_unless_asked_for_the_warmers(tmp_path: Path):
    here = make_n(*shlex.split(PUSH)[1:])
    expected = [name for name in USER_IMAGES if name in dockerfile_names()]
    assert pushed(here) == [f"{REGISTRY}/compilecache-{name}:{TAG}" for name in expected]
    assert [line for line in here if line.startswith("docker build ")] == [
        f"docker build -f images/{name}/Dockerfile -t {REGISTRY}/compilecache-{name}:{TAG} ." for name in expected
    ]
    # With the runtime's Dockerfile (issue 33 adds it), the runtime too; the warmers still not.
    tree = tree_with_every_image(tmp_path)
    assert pushed(make_n_in(tree, "push", "WARMERS=0")) == pushed(make_n_in(tree, "push"))
    assert pushed(make_n_in(tree, "push")) == [
        f"ghcr.io/compilecache/compilecache-{name}:{TAG}" for name in USER_IMAGES
    ]
    everything = make_n_in(tree, "push", "WARMERS=1")
    assert pushed(everything) == [
        f"ghcr.io/compilecache/compilecache-{name}:{TAG}" for name in (*USER_IMAGES, *WARMER_IMAGES)
    ]
    # One warmer on its own.
    assert make_n_in(tree, "push-warmer-torch") == [
        f"docker build -f images/warmer-torch/Dockerfile -t ghcr.io/compilecache/compilecache-warmer-torch:{TAG} .",
        f"docker push ghcr.io/compilecache/compilecache-warmer-torch:{TAG}",
    ]


def chart_default_image(*keys: str) -> str:
    """An image the chart's default values name (at a ``{repository, tag, digest}`` under ``keys``), as
    the chart's templates render it: the tag defaults to appVersion."""
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in keys:
        values = values[key]
    assert values["digest"] == "", "a default digest pins an image make push did not build"
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return f"{values['repository']}:{values['tag'] or app_version}"


def test_the_charts_default_images_are_the_ones_make_push_pushes_by_default(tmp_path: Path):
    """A default `helm install` pulls what a default `make push` pushes: the images this project
    publishes, under one prefix (the Makefile's REGISTRY) at the chart's appVersion."""
    defaults = {"operator": chart_default_image("image"), "runtime": chart_default_image("runtime", "image")}
    assert pushed(make_n_in(tree_with_every_image(tmp_path), "push")) == list(defaults.values())
    here = pushed(make_n("push"))
    assert here == [defaults[name] for name in USER_IMAGES if name in dockerfile_names()]


def set_values(command: str) -> dict[str, str]:
    args = shlex.split(command)
    return dict(args[i + 1].split("=", 1) for i, arg in enumerate(args) if arg == "--set")


def test_mirrored_or_built_the_images_are_the_ones_the_install_names(tmp_path: Path):
    """The documented mirror copies the chart's default images, and to the very names the documented
    `make push` builds and the documented `helm install` gives the chart."""
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == TAG  # the published tag
    copies = [shlex.split(command)[2:] for command in MIRROR]
    assert [source for source, _ in copies] == [chart_default_image("image"), chart_default_image("runtime", "image")]
    mirrored = [destination for _, destination in copies]
    built = pushed(make_n_in(tree_with_every_image(tmp_path), *shlex.split(PUSH)[1:]))
    assert mirrored == built
    given = set_values(INSTALL)
    assert mirrored == [
        f"{given['image.repository']}:{given['image.tag']}",
        f"{given['runtime.image.repository']}:{given['runtime.image.tag']}",
    ]


def test_make_images_tags_the_charts_app_version_by_default():
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    lines = make_n("images")
    assert lines[0] == f"docker build -f images/operator/Dockerfile -t {chart_default_image('image')} ."
    assert lines[0].endswith(f":{app_version} .")
    assert lines == [line for line in make_n("images", f"TAG={app_version}")]
    assert not [line for line in lines if "push" in line]
    # The same images as the push builds: no warmer unless asked for.
    assert lines == [line for line in make_n("push") if line.startswith("docker build ")]


def helm_args(command: str) -> list[str]:
    """A documented helm command's arguments after the subcommand, without the chart path."""
    args = shlex.split(command)
    assert args[0] == "helm" and CHART_PATH in args, command
    return [arg for arg in args[2:] if arg != CHART_PATH]


@pytest.mark.slow
def test_the_documented_install_renders_the_pushed_image_in_a_restricted_pod(tmp_path: Path):
    args = helm_args(INSTALL)
    done = helm("template", *args, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    deployment: dict[str, Any] = dict(one(objects, "Deployment"))
    assert deployment["metadata"]["name"] == RELEASE  # the name the verify step waits for
    assert deployment["metadata"]["namespace"] == NAMESPACE
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    pushes = pushed(make_n(*shlex.split(PUSH)[1:]))
    [operator] = [image for image in pushes if image.rsplit("/", 1)[-1].startswith("compilecache-operator:")]
    assert container["image"] == operator
    assert podsecurity.violations(deployment) == []
    # The webhook the verify step reaches: by the cache label, also for dry-run requests.
    config = one(objects, "MutatingWebhookConfiguration")
    assert {webhook["sideEffects"] for webhook in config["webhooks"]} == {"None"}


@pytest.mark.slow
def test_the_crd_upgrade_applies_exactly_the_charts_crds(tmp_path: Path):
    """`helm show crds` (what the upgrade pipes to kubectl) is the chart's crds/, whole and unchanged."""
    show, _pipe = CRDS.split(" | ")
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
    args = helm_args(UPGRADE)
    usage = helm("upgrade", "--help", tmp=tmp_path).stdout  # the chart path after --help is ignored
    for flag in (arg.split("=")[0] for arg in args if arg.startswith("--")):
        assert f"{flag} " in usage or f"{flag}=" in usage, flag
    # The upgraded values render: the user's repository kept, the new tag taken.
    done = helm("template", *helm_args(INSTALL), "--set", f"image.tag={NEXT_TAG}", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{REGISTRY}/compilecache-operator:{NEXT_TAG}" in done.stdout


def test_the_verify_pod_gets_the_documented_warning_from_the_webhook():
    """The pod `kubectl run ... --labels=compilecache.dev/cache=compilecache-check` sends, admitted as the
    webhook admits it in a namespace with no such CompileCache: the one warning the doc shows."""
    args = shlex.split(VERIFY)
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
