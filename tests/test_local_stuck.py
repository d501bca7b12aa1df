"""On the local cluster, with the real operator: a warm-up pod that cannot start says why in `kubectl get cc`.

The local kubelet cannot pull an image named with ``nonexistent`` (``local/pods.py``), and its
scheduler leaves a pod that tolerates no GPU taint Pending, ``Unschedulable`` (``local/nodes.py``).
The operator must show either within one pass: in the pool, the ``Reason`` printer column (its
JSONPath evaluated on the status), the ``Progressing`` condition and a Warning Event
(what ``kubectl describe cc`` lists).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from compilecache.controller import podstate
from compilecache.local import pods as localpods
from compilecache.local.cluster import LocalCluster, Operator, run_operator
from test_examples import EXAMPLE_POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
CC = "compilecache.dev/v1alpha1/compilecaches"
# Two passes: the pod's status, then the pass that reads it (the operator resyncs every 0.5 s).
WITHIN = 20.0


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Operator]]:
    root = tmp_path_factory.mktemp("stuck")
    with (
        LocalCluster(root, workdir=ROOT, namespaces={NS: {"compilecache.dev/injection": "enabled"}}) as cluster,
        run_operator(cluster, resync_seconds=0.5, policy=EXAMPLE_POLICIES["cache-gcs.yaml"]) as operator,
    ):
        yield cluster, operator


def cache(name: str, *, image: str | None = None, tolerations: bool = True) -> dict[str, Any]:
    """The PVC example on its one H100 pool, under another name and claim."""
    obj: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "cache-pvc.yaml").read_text())
    obj["metadata"]["name"] = name
    spec = obj["spec"]
    spec["storage"]["pvc"]["claimName"] = f"{name}-cache"
    discover = spec["warmup"].pop("discover")
    pool: dict[str, Any] = {"name": "h100", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    if tolerations:
        pool["tolerations"] = discover["tolerations"]
    spec["warmup"]["pools"] = [pool]
    if image is not None:
        spec["warmup"]["image"] = image
    return obj


def column(name: str, status: dict[str, Any]) -> Any:
    crd = yaml.safe_load((ROOT / "crds" / "compilecache.yaml").read_text())
    [version] = crd["spec"]["versions"]
    [path] = [c["jsonPath"] for c in version["additionalPrinterColumns"] if c["name"] == name]
    value: Any = {"status": status}
    for part in path.lstrip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def wait_reason(cluster: LocalCluster, operator: Operator, name: str, reasons: set[str]) -> dict[str, Any]:
    """The cache's status once its pool's reason is one of ``reasons``; fail with the status and the log tail."""
    deadline = time.monotonic() + WITHIN
    while True:
        status = (cluster.client.get(CC, name, NS) or {}).get("status") or {}
        if {pool.get("reason") for pool in status.get("pools") or []} & reasons:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: no pool with {reasons} in {WITHIN}s: {status}\n{operator.output()[-3000:]}")
        time.sleep(0.1)


def warnings_of(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    events = cluster.client.list("v1/events", NS)
    return [e for e in events if e.get("type") == "Warning" and (e.get("involvedObject") or {}).get("name") == name]


def test_an_image_that_cannot_be_pulled_shows_in_get_and_describe(local: tuple[LocalCluster, Operator]) -> None:
    cluster, operator = local
    image = f"registry.example.com/ml/{localpods.UNPULLABLE_MARKER}-trainer:1.2.0"
    cluster.client.create(CC, cache("no-image", image=image), NS)
    pulls = {podstate.ERR_IMAGE_PULL, podstate.IMAGE_PULL_BACKOFF}
    status = wait_reason(cluster, operator, "no-image", pulls)
    [pool] = status["pools"]
    assert pool["state"] == "Pending" and image in pool["message"], pool  # not "Running"
    assert status["phase"] == "Warming" and column("Reason", status) in pulls
    assert "h100 (" in column("Message", status)
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["status"] == "False" and progressing["reason"] in pulls and image in progressing["message"]
    found = cluster.client.wait_for(lambda: [e for e in warnings_of(cluster, "no-image") if e["reason"] in pulls])
    assert image in found[0]["message"]


def test_a_pod_that_fits_no_node_shows_the_schedulers_reason(local: tuple[LocalCluster, Operator]) -> None:
    cluster, operator = local
    cluster.client.create(CC, cache("no-node", tolerations=False), NS)  # the GPU nodes' taint is not tolerated
    status = wait_reason(cluster, operator, "no-node", {podstate.WAITING_FOR_CAPACITY})
    [pool] = status["pools"]
    assert pool["state"] == "Pending" and "nodes are available" in pool["message"], pool
    assert "taint" in pool["message"] and pool["message"].startswith("waiting for a node: "), pool
    assert column("Reason", status) == podstate.WAITING_FOR_CAPACITY
    cluster.client.wait_for(
        lambda: [e for e in warnings_of(cluster, "no-node") if e["reason"] == podstate.WAITING_FOR_CAPACITY]
    )


def test_a_container_over_its_memory_limit_is_oom_killed(local: tuple[LocalCluster, Operator]) -> None:
    """The local kubelet kills a container whose processes hold more than ``limits.memory``, as a cgroup does."""
    cluster, _ = local
    # 200 MiB touched (bytearray zero-fills: resident), then a wait that only the kill ends.
    code = "import time; b = bytearray(200 * 2**20); time.sleep(60)"
    container = {
        "name": "main",
        "image": "ignored:1",
        "command": ["python", "-c", code],
        "resources": {"limits": {"memory": "64Mi"}},
    }
    pod_spec = {"restartPolicy": "Never", "containers": [container]}
    job = {"metadata": {"name": "greedy"}, "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}}}
    cluster.client.create("batch/v1/jobs", job, NS)

    def killed() -> dict[str, Any] | None:
        for pod in cluster.client.list("v1/pods", NS, label_selector="job-name=greedy"):
            for state in (pod.get("status") or {}).get("containerStatuses") or []:
                terminated = (state.get("state") or {}).get("terminated")
                if terminated:
                    return dict(terminated)
        return None

    terminated = cluster.client.wait_for(killed, timeout=30)
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137), terminated
