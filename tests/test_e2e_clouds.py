"""Discovery without GPU Feature Discovery: examples/cache-pvc.yaml warms nodes labelled only GKE's or EKS's way.

A local cluster whose GPU nodes carry only what GKE sets (``cloud.google.com/gke-accelerator``) on
one pool and only Cluster Autoscaler's AWS label (``k8s.amazonaws.com/accelerator``) on the other
(``NodePool.labelling``), none of NVIDIA's ``nvidia.com/gpu.*``; the real operator; the PVC example
as shipped (no nodeSelector, no groupBy), sized down. Both pools are found by their cloud's label
and warmed by the real ``compilecache warm``, each on its own node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from compilecache.local.cluster import LocalCluster, run_operator
from compilecache.local.nodes import NodePool
from test_e2e import CC, NS, Setup, example, finished_jobs, pods_of, wait_phase

pytestmark = [pytest.mark.slow, pytest.mark.emulator, pytest.mark.jax]

ROOT = Path(__file__).resolve().parent.parent
POOLS = (
    NodePool("gke-h100", "NVIDIA-H100-80GB-HBM3", count=1, gpus=8, accelerator="nvidia-h100-80gb", labelling="gke"),
    NodePool("eks-a100", "NVIDIA-A100-SXM4-40GB", count=1, gpus=4, accelerator="nvidia-tesla-a100", labelling="eks"),
    NodePool("cpu", "", count=1, gpus=0),
)


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("clouds")
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(root, pools=POOLS, workdir=ROOT))
        operator = stack.enter_context(run_operator(cluster, resync_seconds=0.5))
        yield Setup(cluster, operator, None)
        output = operator.output()
    assert "Traceback" not in output, output[-5000:]


def test_the_pvc_example_finds_and_warms_gke_and_eks_nodes_by_their_own_labels(clouds: Setup) -> None:
    client = clouds.cluster.client
    for node in client.list("v1/nodes"):  # what the test is about: no GPU Feature Discovery label anywhere
        assert not [key for key in node["metadata"]["labels"] if key.startswith("nvidia.com/")], node["metadata"]
    cache = example("cache-pvc.yaml")
    assert "nodeSelector" not in cache["spec"]["warmup"]["discover"]
    assert "groupBy" not in cache["spec"]["warmup"]["discover"]
    client.create(CC, cache, NS)
    name = cache["metadata"]["name"]
    status = wait_phase(clouds, name, ("Ready", "Failed", "Degraded"), timeout=300)
    assert status["phase"] == "Ready", status
    pools = {pool["name"]: pool for pool in status["pools"]}
    assert {pool: entry["state"] for pool, entry in pools.items()} == {
        "nvidia-h100-80gb": "Succeeded",
        "nvidia-tesla-a100": "Succeeded",
    }
    assert all(entry["verifyHits"] == entry["verifyRequests"] > 0 for entry in pools.values()), pools
    # Each warm-up ran where its cloud's label put it, with all of that node's GPUs.
    where = {
        "nvidia-h100-80gb": ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, "gke-h100-0", "8"),
        "nvidia-tesla-a100": ({"k8s.amazonaws.com/accelerator": "nvidia-tesla-a100"}, "eks-a100-0", "4"),
    }
    for pool, (selector, node, gpus) in where.items():
        [job] = finished_jobs(clouds, f"compilecache.dev/pool={pool}")
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["nodeSelector"] == selector, pod_spec["nodeSelector"]
        [container] = pod_spec["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] in (gpus, int(gpus)), container["resources"]
        assert {pod["spec"]["nodeName"] for pod in pods_of(clouds, job["metadata"]["name"])} == {node}
