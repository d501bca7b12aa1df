"""Small builders of CompileCache objects and Nodes for the operator's tests."""

from __future__ import annotations

import copy
from typing import Any

from compilecache.controller.policy import parse as parse_policy

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
# A policy that refuses nothing: for tests about what the operator makes of any spec the CRD admits.
OPEN_POLICY = parse_policy(
    {
        key: {"allow": ["*"], "deny": []}
        for key in (
            "serviceAccounts",
            "nodeSelectors",
            "tolerations",
            "claims",
            "secrets",
            "csiDrivers",
            "queues",
            "priorityClasses",
        )
    }
    | {"images": {"allow": ["*"], "deny": [], "requirePinned": False}, "serviceAccountTokens": True}
    | dict.fromkeys(("maxGpusPerPod", "maxHosts", "maxPools", "maxGateTimeout"))
)


def cache_spec(**overrides: Any) -> dict[str, Any]:
    """A valid spec on a created PVC with discovered GPU pools; ``overrides`` replace top-level keys."""
    spec: dict[str, Any] = {
        "storage": {"pvc": {"claimName": "jax-cache", "create": {"size": "10Gi"}}},
        "warmup": {
            "image": "registry.example/trainer:1.2",
            "workloads": [
                {"name": "train-step", "entrypoint": "examples.workloads.transformer:targets"},
            ],
            "discover": {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
        },
    }
    spec.update(copy.deepcopy(overrides))
    return spec


def cache(name: str = "llama", namespace: str = "default", uid: str = "uid-1", **spec: Any) -> dict[str, Any]:
    """A CompileCache object as the API server returns it."""
    return {
        "apiVersion": "compilecache.dev/v1alpha1",
        "kind": "CompileCache",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
        "spec": cache_spec(**spec),
    }


def node(name: str, product: str | None, gpus: int = 8, *, gpu_present: bool = True, **labels: str) -> dict[str, Any]:
    """A Node with a GPU product label and ``gpus`` allocatable GPUs (a CPU node with ``product=None``)."""
    node_labels = {"kubernetes.io/hostname": name, **labels}
    allocatable = {"cpu": "32", "memory": "256Gi"}
    if product is not None:
        node_labels[PRODUCT] = product
        allocatable[GPU] = str(gpus)
        if gpu_present:
            node_labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "status": {"allocatable": allocatable},
    }


def cluster() -> list[dict[str, Any]]:
    """5 GPU nodes in 2 products (3 × H100 with 8 GPUs, 2 × A100 with 4) and 1 CPU node."""
    return [
        *(node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", 8) for i in range(3)),
        *(node(f"a100-{i}", "NVIDIA-A100-SXM4-40GB", 4) for i in range(2)),
        node("cpu-0", None),
    ]
