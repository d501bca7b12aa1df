"""The node labels that say a node has accelerators, and which GPU type: one table, in priority order.

``pools.discover_groups`` groups discovered nodes by the first of these labels a node carries when
``warmup.discover.groupBy`` is unset; docs/how-it-works.md shows the same table (tests/test_docs.py
checks that it lists every label here). Each entry says who sets the label and an example value,
as their own documentation shows it:

- GKE sets ``cloud.google.com/gke-accelerator`` on the nodes of a GPU node pool to the pool's
  accelerator type (``nvidia-h100-80gb``, ``nvidia-l4``), as GKE's GPU docs select it; written from
  what those docs show, the page itself was not at hand when this table was checked.
- ``k8s.amazonaws.com/accelerator`` is the GPU label of Cluster Autoscaler's AWS provider
  (cluster-autoscaler/cloudprovider/aws ``GPULabel``, its values ``nvidia-tesla-a100``,
  ``nvidia-a10g``, ...): EKS node groups that scale from zero carry it so that the autoscaler
  knows their GPUs.
- EKS Auto Mode sets ``eks.amazonaws.com/instance-gpu-name`` (EKS user guide, Auto Mode's
  well-known labels: ``t4``), Karpenter on AWS ``karpenter.k8s.aws/instance-gpu-name`` (Karpenter's
  AWS well-known labels: ``t4``, ``a100``), Karpenter on Azure (AKS node auto-provisioning)
  ``karpenter.azure.com/sku-gpu-name`` (karpenter-provider-azure's labels: ``A100``, ``T4``).
- AKS sets ``kubernetes.azure.com/accelerator`` on GPU node pools (AKS docs, "Use labels": value
  ``nvidia``). That value names the vendor, not the GPU type, so a node with it is grouped by
  ``node.kubernetes.io/instance-type`` instead (the VM size, e.g. ``Standard_ND96isr_H100_v5``,
  which fixes the GPU type and count; AKS sets it on every node, same docs).
- The AMD GPU operator's node labeller sets ``amd.com/gpu.product-name`` (ROCm docs:
  ``AMD_Instinct_MI300X_OAM``).
- NVIDIA GPU Feature Discovery (the GPU operator's) sets ``nvidia.com/gpu.product``
  (``NVIDIA-H100-80GB-HBM3``).

Why this order: a cloud's labels are on a node from the moment it is created, while the GPU
operators' come from DaemonSets that label it a little later. Grouped by a cloud label, a new
node is in its final pool from the start: grouped by the first label present, a node with both a
GKE and a GFD label would otherwise move pools (and the pool its warm-up Job) when GFD labels it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

INSTANCE_TYPE = "node.kubernetes.io/instance-type"  # a well-known label every cloud node carries


@dataclass(frozen=True)
class AcceleratorLabel:
    """A node label that marks accelerator nodes: who sets it, an example value, what tells types apart."""

    key: str
    set_by: str
    example: str
    # The label whose value is the GPU type when ``key``'s is not (AKS: the vendor only).
    group_by: str | None = None

    @property
    def group_key(self) -> str:
        """The label whose value names a node's group."""
        return self.group_by or self.key


ACCELERATOR_LABELS: tuple[AcceleratorLabel, ...] = (
    AcceleratorLabel("cloud.google.com/gke-accelerator", "GKE", "nvidia-h100-80gb"),
    AcceleratorLabel(
        "k8s.amazonaws.com/accelerator",
        "EKS node groups for Cluster Autoscaler (its AWS GPU label)",
        "nvidia-tesla-a100",
    ),
    AcceleratorLabel("eks.amazonaws.com/instance-gpu-name", "EKS Auto Mode", "t4"),
    AcceleratorLabel("karpenter.k8s.aws/instance-gpu-name", "Karpenter on AWS", "a100"),
    AcceleratorLabel("karpenter.azure.com/sku-gpu-name", "Karpenter on Azure (AKS node auto-provisioning)", "A100"),
    AcceleratorLabel("kubernetes.azure.com/accelerator", "AKS", "nvidia", group_by=INSTANCE_TYPE),
    AcceleratorLabel("amd.com/gpu.product-name", "AMD GPU operator (node labeller)", "AMD_Instinct_MI300X_OAM"),
    AcceleratorLabel("nvidia.com/gpu.product", "NVIDIA GPU Feature Discovery", "NVIDIA-H100-80GB-HBM3"),
)


def gpu_group(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """The (label, value) that names a node's GPU type: the first table entry the node carries.

    ``None``: the node carries none, so it is no accelerator node for discovery. An entry that
    groups by another label (AKS) applies only when the node carries that one too.
    """
    for entry in ACCELERATOR_LABELS:
        if entry.key in labels and entry.group_key in labels:
            return entry.group_key, labels[entry.group_key]
    return None


def rank(label: str) -> int:
    """Where ``label`` stands in the table's priority (group labels; any other label after them all)."""
    for index, entry in enumerate(ACCELERATOR_LABELS):
        if entry.group_key == label:
            return index
    return len(ACCELERATOR_LABELS)
