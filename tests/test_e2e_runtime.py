"""Training images without the product, on the local cluster: the runtime injected, not installed.

The local cluster maps images to environments (``compilecache.local.pods.Images``): the examples'
training images are virtual environments with only jax, or only torch (``tests/runtimeenv.py``),
and the runtime image is the tree ``images/runtime/Dockerfile`` installs at ``/opt/runtime``, with
the system's ``cp``. The real operator runs with ``COMPILECACHE_RUNTIME_IMAGE``, so its Job builder
and its webhook add the runtime's init container, mount and ``PYTHONPATH``: the warm-up (exact mode)
and expiry Jobs run ``python3 -m compilecache.cli`` on the training image's own Python, and the
unchanged training script hits every compile and prints the verdict, loaded from the copied tree.
First run: the environments take about a minute (jax) and a few (torch) to install; later runs
reuse them (``.venv-runtime-py3.11``, ``.venv-runtime-py3.11-torch``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chartrender import ROOT
from compilecache.controller import runtime
from compilecache.frameworks.pytorch import demo as torchdemo
from compilecache.local.cluster import LocalCluster, run_operator
from compilecache.local.pods import Image, Images
from runtimeenv import TREE_IN_IMAGE, has_module, image_python, shared_runtime_tree, torch_python
from test_e2e import (
    CC,
    JOBS,
    NAMESPACE_LABELS,
    NS,
    PODS,
    Setup,
    example,
    finished_jobs,
    pods_of,
    rendered_webhooks,
    status_of,
    training_result,
    wait_phase,
    wait_pod,
)
from test_versions import locked, makefile_torch

RUNTIME_IMAGE = "ghcr.io/compilecache/compilecache-runtime:0.1.0"  # the chart's default repository
JAX_TRAINER = "registry.example.com/ml/llama-trainer:1.2.0"  # examples/cache-pvc.yaml, training-job.yaml
TORCH_TRAINER = "registry.example.com/ml/torch-trainer:1.0.0"  # examples/cache-pytorch.yaml, training-pytorch.yaml
PYTHON = "3.11"  # torch's CPU build is on local disk for this one
FINISHED = ("Succeeded", "Failed")
RUNTIME_MOUNT = {"name": runtime.VOLUME, "mountPath": runtime.MOUNT_PATH, "readOnly": True}


def here(workdir: Path) -> Image:
    return Image(workdir=workdir, env={"PATH": "/bin"})


# --- the mapping of images ------------------------------------------------------------------------------


def test_an_image_is_found_by_its_name_then_its_longest_prefix_else_the_default() -> None:
    default, exact, team, registry = (here(Path(f"/{n}")) for n in ("default", "exact", "team", "registry"))
    images = Images(default, {"r.example/ml/trainer:1": exact, "r.example/ml/*": team, "r.example/*": registry})
    assert images.of("r.example/ml/trainer:1") is exact
    assert images.of("r.example/ml/trainer:2") is team
    assert images.of("r.example/other:1") is registry
    assert images.of("elsewhere/ml/trainer:1") is default
    # Without "*" a key is a name, never a prefix.
    assert Images(default, {"r.example/ml": exact}).of("r.example/ml/trainer:1") is default


names = st.text(st.sampled_from("ab/:."), min_size=1, max_size=8)


@given(reference=names, keys=st.lists(names, max_size=6))
def test_a_name_given_exactly_wins_and_a_prefix_key_matches_only_what_it_starts(
    reference: str, keys: list[str]
) -> None:
    default = here(Path("/default"))
    named = {key + "*": here(Path("/" + key)) for key in keys}
    found = Images(default, named).of(reference)
    starts = [key for key in keys if reference.startswith(key)]
    assert found is (named[max(starts, key=len) + "*"] if starts else default)
    exact = here(Path("/exact"))
    assert Images(default, {**named, reference: exact}).of(reference) is exact


# --- the environments -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the runtime image holds at /opt/runtime (the Dockerfile's own install lines)."""
    return shared_runtime_tree(tmp_path_factory)


@pytest.fixture(scope="module")
def jax_bin() -> Path:
    """A JAX training image's Python: jax alone, no compilecache."""
    bin_dir = image_python(PYTHON, locked()["jax"])
    assert has_module(bin_dir, "jax") and not has_module(bin_dir, "compilecache"), bin_dir
    return bin_dir


def runtime_image(tree: Path) -> Image:
    """The runtime image: its /opt/runtime, and the system's cp (busybox's in the real one)."""
    return Image.of_path(ROOT, files={TREE_IN_IMAGE: tree})


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.timeout(900)
def test_a_pod_runs_each_container_in_its_images_environment(jax_bin: Path, tree: Path, tmp_path: Path) -> None:
    """The kubelet's part, without the operator: the runtime's init container (as the operator builds it)
    fills the emptyDir, the training image's own Python imports the product only from the read-only
    mount, and a container on an unmapped image runs in this environment."""
    show = "import sys; print(sys.prefix); import compilecache; print(compilecache.__file__)"
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "with", "image": JAX_TRAINER, "command": ["python3", "-c", show]},
            {"name": "without", "image": JAX_TRAINER, "command": ["python3", "-c", show]},
            {"name": "unmapped", "image": "registry.example.com/other:1", "command": ["python3", "-c", show]},
        ],
    }
    skipped = runtime.inject(spec, spec["containers"][:1], runtime.Runtime(RUNTIME_IMAGE), {})
    assert not skipped
    images = {JAX_TRAINER: Image.of_path(ROOT, jax_bin), RUNTIME_IMAGE: runtime_image(tree)}
    with LocalCluster(tmp_path / "cluster", workdir=ROOT, images=images) as cluster:
        cluster.client.create(PODS, {"metadata": {"name": "p"}, "spec": spec}, NS)
        pod = cluster.client.wait_for(
            lambda: (
                (got := cluster.client.get(PODS, "p", NS)) and got.get("status", {}).get("phase") in FINISHED and got
            ),
            timeout=120,
        )
        logs = {name: cluster.logs(NS, "p", name) for name in ("with", "without", "unmapped")}
    [init] = pod["status"]["initContainerStatuses"]
    assert init["name"] == runtime.VOLUME and init["state"]["terminated"]["exitCode"] == 0, init
    codes = {s["name"]: s["state"]["terminated"]["exitCode"] for s in pod["status"]["containerStatuses"]}
    assert codes == {"with": 0, "without": 1, "unmapped": 0}, (codes, logs)
    venv = str(jax_bin.parent)
    prefix, found = logs["with"].split()
    assert prefix == venv, logs["with"]
    # The package came from the pod's read-only copy of the emptyDir the init container filled.
    assert found.startswith(str(tmp_path / "cluster" / "pods" / NS / "p" / "ro")), found
    assert venv in logs["without"].splitlines() and "No module named 'compilecache'" in logs["without"], logs
    assert logs["unmapped"].split()[0] == sys.prefix, logs["unmapped"]


# --- the loop: examples as shipped, on images without the product ---------------------------------------


def _loop(
    root: Path,
    webhooks: list[dict[str, Any]],
    images: dict[str, Image],
    cache: dict[str, Any],
    training: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """The cache and the training Job applied together under an operator with the runtime image; what they left."""
    name, job = cache["metadata"]["name"], training["metadata"]["name"]
    env = {runtime.IMAGE_ENV: RUNTIME_IMAGE}
    with (
        LocalCluster(root, workdir=ROOT, images=images, namespaces={NS: NAMESPACE_LABELS}) as cluster,
        run_operator(cluster, webhooks=webhooks, resync_seconds=0.5, env=env) as operator,
    ):
        setup = Setup(cluster, operator, None)
        cluster.client.create(CC, cache, NS)
        cluster.client.create(JOBS, training, NS)
        status = wait_phase(setup, name, ("Ready", "Failed", "Degraded"), timeout=600)
        assert status["phase"] == "Ready", f"{status}\n{operator.output()[-3000:]}"
        pod = wait_pod(setup, job, lambda p: (p.get("status") or {}).get("phase") in FINISHED, timeout=400)
        [warmup] = finished_jobs(setup, f"compilecache.dev/cache={name}")
        [expiry] = finished_jobs(setup, f"compilecache.dev/expiry-of={name}")
        [warm_pod] = pods_of(setup, warmup["metadata"]["name"])
        [expiry_pod] = pods_of(setup, expiry["metadata"]["name"])
        yield {
            "setup": setup,
            "status": status,
            "pods": {"warm": warm_pod, "expiry": expiry_pod, "train": pod},
            "log": cluster.logs(NS, pod["metadata"]["name"], "train"),
            "warm_log": "".join(
                cluster.logs(NS, warm_pod["metadata"]["name"], c["name"])
                for c in [*warm_pod["spec"].get("initContainers", []), *warm_pod["spec"]["containers"]]
            ),
            "consumers": cluster.client.wait_for(
                lambda: (status_of(setup, name).get("consumers") or {}).get("requests") and status_of(setup, name),
                timeout=60,
            )["consumers"],
        }
        output = operator.output()
    assert "Traceback" not in output, output[-5000:]


def assert_runtime_injected(pods: dict[str, dict[str, Any]], trainer: str) -> None:
    """Every pod of the loop ran on the training image, after the runtime's init container, with it mounted."""
    for role, pod in pods.items():
        spec = pod["spec"]
        first = spec["initContainers"][0]
        assert (first["name"], first["image"]) == (runtime.VOLUME, RUNTIME_IMAGE), (role, first)
        assert {"name": runtime.VOLUME, "emptyDir": {}} in spec["volumes"], (role, spec["volumes"])
        statuses = pod["status"]["initContainerStatuses"]
        assert [s["state"]["terminated"]["exitCode"] for s in statuses] == [0] * len(statuses), (role, statuses)
        for container in [*spec["initContainers"][1:], *spec["containers"]]:
            assert container["image"] == trainer, (role, container["image"])
            assert RUNTIME_MOUNT in container["volumeMounts"], (role, container["volumeMounts"])
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["PYTHONPATH"].split(":")[0] == runtime.MOUNT_PATH, (role, env)
        assert pod["status"]["phase"] == "Succeeded", (role, pod["status"])
    for role in ("warm", "expiry"):
        command = pods[role]["spec"]["containers"][0]["command"]
        assert command[:4] == ["python3", "-m", "compilecache.cli", role if role == "warm" else "expire"], command


@pytest.fixture(scope="module")
def jax_loop(tmp_path_factory: pytest.TempPathFactory, jax_bin: Path, tree: Path) -> Iterator[dict[str, Any]]:
    """examples/cache-pvc.yaml and training-job.yaml (sized down, one pool) on a jax-only training image."""
    cache, training = example("cache-pvc.yaml"), example("training-job.yaml")
    assert cache["spec"]["warmup"]["image"] == JAX_TRAINER
    assert training["spec"]["template"]["spec"]["containers"][0]["image"] == JAX_TRAINER
    # One pool of the two the example discovers (the runtime is the same on both), and training on it.
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    tolerations = cache["spec"]["warmup"].pop("discover")["tolerations"]
    cache["spec"]["warmup"]["pools"] = [{"name": "h100", "nodeSelector": h100, "tolerations": tolerations}]
    training["spec"]["template"]["spec"]["nodeSelector"] = h100
    images = {JAX_TRAINER: Image.of_path(ROOT, jax_bin), RUNTIME_IMAGE: runtime_image(tree)}
    webhooks = rendered_webhooks(tmp_path_factory.mktemp("chart"))
    yield from _loop(tmp_path_factory.mktemp("local-cluster"), webhooks, images, cache, training)


@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.jax
@pytest.mark.timeout(1200)
def test_a_jax_image_without_the_product_is_warmed_in_exact_mode_and_trains_hitting_every_compile(
    jax_loop: dict[str, Any],
) -> None:
    status = jax_loop["status"]
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert pool["state"] == "Succeeded" and pool["entries"] >= 1, pool
    assert pool["verifyHits"] == pool["verifyRequests"] > 0, pool
    # The exact mode: the unchanged script stopped after its 2nd step (it writes no checkpoint: no resumed run),
    # verified in a fresh process.
    assert "after 2 calls of _train_step (--steps)" in jax_loop["warm_log"], jax_loop["warm_log"][-3000:]
    assert_runtime_injected(jax_loop["pods"], JAX_TRAINER)
    result = training_result(jax_loop["log"])  # and the verdict line, from the runtime's jax_plugins entry point
    assert result["requests"] > 0 and result["hits"] == result["requests"], result
    consumers = jax_loop["consumers"]
    assert (consumers["hits"], consumers["requests"]) == (result["hits"], result["requests"]), consumers


@pytest.fixture(scope="module")
def torch_loop(tmp_path_factory: pytest.TempPathFactory, tree: Path) -> Iterator[dict[str, Any]]:
    """examples/cache-pytorch.yaml and training-pytorch.yaml (as the PyTorch demo sizes them) on a torch-only image."""
    bin_dir = torch_python(PYTHON, makefile_torch())
    assert has_module(bin_dir, "torch") and not has_module(bin_dir, "compilecache"), bin_dir
    cache, training = torchdemo.sized_examples(ROOT, 32)
    assert cache["spec"]["warmup"]["image"] == TORCH_TRAINER
    assert training["spec"]["template"]["spec"]["containers"][0]["image"] == TORCH_TRAINER
    images = {TORCH_TRAINER: Image.of_path(ROOT, bin_dir), RUNTIME_IMAGE: runtime_image(tree)}
    webhooks = rendered_webhooks(tmp_path_factory.mktemp("chart"))
    yield from _loop(tmp_path_factory.mktemp("local-cluster"), webhooks, images, cache, training)


@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.timeout(1500)
def test_a_torch_image_without_the_product_is_warmed_and_trains_hitting_every_graph(
    torch_loop: dict[str, Any],
) -> None:
    status = torch_loop["status"]
    assert status["phase"] == "Ready", status
    [pool] = status["pools"]
    assert pool["state"] == "Succeeded" and pool["entries"] >= 1, pool
    assert_runtime_injected(torch_loop["pods"], TORCH_TRAINER)
    log = torch_loop["log"]
    result = torchdemo.train_result(log)
    assert result["fxgraph_hits"] > 0 and result["fxgraph_misses"] == 0, result
    assert result["autograd_hits"] > 0 and result["autograd_misses"] == 0, result
    # The verdict, from the runtime's torch.backends entry point: no compilecache in the image.
    verdict = re.search(r"^compilecache: (\d+)/(\d+) graphs hit", log, re.MULTILINE)
    assert verdict and verdict[1] == verdict[2] != "0", log[-2000:]
    consumers = torch_loop["consumers"]
    assert consumers["hits"] == consumers["requests"] == int(verdict[2]), consumers
