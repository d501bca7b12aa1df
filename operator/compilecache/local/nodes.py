"""Simulated GPU nodes for the local cluster, from a small config (pure functions, no I/O).

A config lists pools; each becomes ``count`` Nodes; a GPU pool's (``gpus`` > 0) carry the labels GPU operators put on
real ones (``nvidia.com/gpu.present``, ``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``,
and on GKE ``cloud.google.com/gke-accelerator``), the ``nvidia.com/gpu`` allocatable count
and the usual ``nvidia.com/gpu`` NoSchedule taint. Nothing runs on a GPU: the Job runner
runs every container as a local CPU process; the nodes exist so that the operator's pool
discovery and the scheduler's nodeSelector/toleration checks see a realistic cluster.

    pools:
      - {name: h100, product: NVIDIA-H100-80GB-HBM3, count: 2, gpus: 8, accelerator: nvidia-h100-80gb}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class NodePool:
    """One kind of simulated GPU node."""

    name: str
    product: str
    count: int = 1
    gpus: int = 8
    accelerator: str | None = None  # GKE's cloud.google.com/gke-accelerator value
    labels: Mapping[str, str] = field(default_factory=dict)


# Two GPU pools, labelled so that both examples/cache-pvc.yaml (discovery) and
# examples/cache-gcs.yaml (explicit GKE pools) find nodes, and an untainted CPU node for
# what needs no GPU (the expiry Job), as real clusters have.
DEFAULT_POOLS: tuple[NodePool, ...] = (
    NodePool("h100", "NVIDIA-H100-80GB-HBM3", count=2, gpus=8, accelerator="nvidia-h100-80gb"),
    NodePool("a100", "NVIDIA-A100-SXM4-40GB", count=1, gpus=8, accelerator="nvidia-tesla-a100"),
    NodePool("cpu", "", count=1, gpus=0),
)


def pools_from_config(config: Mapping[str, Any]) -> tuple[NodePool, ...]:
    """Parse ``{"pools": [...]}``; raise ``ValueError`` naming the bad entry.

    A CPU node (``gpus: 0``) is added when none is listed: Jobs without GPUs (expiry) run there.
    """
    pools = []
    for index, entry in enumerate(config.get("pools") or []):
        try:
            pools.append(
                NodePool(
                    name=str(entry["name"]),
                    product=str(entry.get("product", "")),
                    count=int(entry.get("count", 1)),
                    gpus=int(entry.get("gpus", 8)),
                    accelerator=entry.get("accelerator"),
                    labels={str(k): str(v) for k, v in (entry.get("labels") or {}).items()},
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"pools[{index}]: {exc!r}") from None
    if not any(pool.gpus == 0 for pool in pools):
        pools.append(NodePool("cpu", "", count=1, gpus=0))
    return tuple(pools)


def nodes(pools: Sequence[NodePool]) -> list[dict[str, Any]]:
    """The Node objects (with status) of ``pools``."""
    result = []
    for pool in pools:
        for index in range(pool.count):
            name = f"{pool.name}-{index}"
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
            resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
            if pool.gpus > 0:
                labels |= {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": pool.product,
                    "nvidia.com/gpu.count": str(pool.gpus),
                }
                if pool.accelerator:
                    labels["cloud.google.com/gke-accelerator"] = pool.accelerator
                resources[GPU_RESOURCE] = str(pool.gpus)
            labels |= pool.labels
            result.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"taints": [dict(GPU_TAINT)]} if pool.gpus > 0 else {},
                    "status": {
                        "capacity": dict(resources),
                        "allocatable": dict(resources),
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    },
                }
            )
    return result


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether a pod's tolerations tolerate a taint (the scheduler's TaintToleration rules)."""
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists":
            if toleration.get("key") in (None, "", taint.get("key")):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def fits(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the pod may go to the node: nodeSelector and NoSchedule/NoExecute taints (no resource accounting)."""
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(key) != value for key, value in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    return all(tolerates(pod_spec.get("tolerations") or [], taint) for taint in taints)
