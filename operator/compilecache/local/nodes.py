"""Simulated GPU nodes for the local cluster, from a small config, and the scheduler's filters (pure, no I/O).

A config lists pools; each becomes ``count`` Nodes named ``<pool>-0`` .. ``<pool>-<count-1>``, each with its
own ``kubernetes.io/hostname``; a GPU pool's (``gpus`` > 0) carry the labels GPU operators put on
real ones (``nvidia.com/gpu.present``, ``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``,
and on GKE ``cloud.google.com/gke-accelerator``), the ``nvidia.com/gpu`` allocatable count
and the usual ``nvidia.com/gpu`` NoSchedule taint. ``labelling`` labels a pool's nodes the way
one cloud or GPU operator alone would instead (``LABELLINGS``: ``gke``, ``eks``, ``karpenter``,
``aks``, ``amd``, ``gfd``; the default ``gfd+gke`` is the GKE node with GPU Feature Discovery
above), so that discovery is tried against what each one really sets. Nothing runs on a GPU: the Job runner
runs every container as a local CPU process; the nodes exist so that the operator's pool
discovery and the scheduler's checks see a realistic cluster.

    pools:
      - {name: h100, product: NVIDIA-H100-80GB-HBM3, count: 2, gpus: 8, accelerator: nvidia-h100-80gb}
      - {name: a100, product: NVIDIA-A100-SXM4-40GB, gpus: 8, accelerator: nvidia-tesla-a100, labelling: eks}

A pool may scale (``autoscaler.py``, the local Cluster Autoscaler): ``count`` nodes at start (0 is
allowed), up to ``max`` (default ``count``: a fixed pool), each new node ``scaleUpSeconds`` after the
Pending pod that asked for it (default 1); ``refuse: "<reason>"`` makes the autoscaler refuse the pool
with that reason (``NotTriggerScaleUp``); ``reclaimAfterSeconds: S`` reclaims, once, the first of its
nodes to run a pod, S seconds after that pod started (a spot reclaim: ``LocalCluster.reclaim``).

    pools:
      - {name: h100, product: NVIDIA-H100-80GB-HBM3, count: 0, max: 2, scaleUpSeconds: 2, reclaimAfterSeconds: 5}

``compilecache demo --nodes FILE`` reads such a file; ``LocalCluster(pools=...)`` takes the parsed pools
(``pools_from_config``). A multi-host warm-up of ``hosts: N`` places one pod per node (required pod
anti-affinity on ``kubernetes.io/hostname``), so it needs a pool with ``count >= N``; with fewer nodes
the pods beyond ``count`` stay Pending (``Unschedulable``). The default pools give ``h100`` 2 nodes.

The scheduler's filters, in the real scheduler's order (the first that fails names the node's reason):
taints (NoSchedule/NoExecute against tolerations), ``nodeSelector``, and required pod anti-affinity
(``affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution``, any ``topologyKey`` a
node label carries, both ways: the new pod's terms and the placed pods' terms). There is no resource
accounting, no node affinity, no pod affinity, no topology spread and no preemption.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from compilecache.local.admission import selector_matches

T = TypeVar("T")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class NodePool:
    """One kind of simulated GPU node."""

    name: str
    product: str
    count: int = 1
    gpus: int = 8
    accelerator: str | None = None  # the cloud's name for the GPU type (GKE's gke-accelerator value; AKS: VM size)
    labels: Mapping[str, str] = field(default_factory=dict)
    max_count: int | None = None  # ``max``: the autoscaler grows the pool up to it; None: a fixed pool
    scale_up_seconds: float = 1.0  # from the autoscaler's decision to the Node
    refuse: str | None = None  # the autoscaler refuses to grow the pool, with this reason
    reclaim_after_seconds: float | None = None  # reclaim the first node that runs a pod, once, this long after
    labelling: str = "gfd+gke"  # whose labels the nodes carry (LABELLINGS)

    def __post_init__(self) -> None:
        if self.labelling not in LABELLINGS:
            raise ValueError(f"labelling {self.labelling!r} is none of {', '.join(LABELLINGS)}")

    @property
    def limit(self) -> int:
        """The most nodes the pool may have."""
        return self.count if self.max_count is None else self.max_count

    @property
    def autoscaled(self) -> bool:
        """Whether the autoscaler manages the pool (it declares ``max`` or ``refuse``)."""
        return self.max_count is not None or self.refuse is not None


MAX_SCALE_UP_SECONDS = 3600.0  # bounds on the config's numbers: a typo must not hang a test or the demo
MAX_NODES_PER_POOL = 64
MAX_REASON = 256  # characters of a ``refuse`` reason (it ends up in an Event's message)


# Each cloud's and GPU operator's own labels, written here from their documentation, not taken from
# the operator's table (controller/accelerators.py): the local cluster plays the clouds, and a label
# copied from the code under test would agree with it even where it was wrong.
LABELLINGS = ("gfd+gke", "gfd", "gke", "eks", "karpenter", "aks", "amd")


def gpu_labels(pool: NodePool) -> dict[str, str]:
    """The labels a GPU node of ``pool`` carries, as its ``labelling``'s cloud or GPU operator sets them."""
    kind = pool.accelerator or pool.product  # the cloud's name for the type, or the product's
    gfd = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": pool.product,
        "nvidia.com/gpu.count": str(pool.gpus),
    }
    by_labelling = {
        "gfd+gke": {**gfd, **({"cloud.google.com/gke-accelerator": pool.accelerator} if pool.accelerator else {})},
        "gfd": gfd,
        "gke": {"cloud.google.com/gke-accelerator": kind, "cloud.google.com/gke-nodepool": pool.name},
        # Cluster Autoscaler's AWS GPU label, on a node group made for it.
        "eks": {"k8s.amazonaws.com/accelerator": kind, "eks.amazonaws.com/nodegroup": pool.name},
        "karpenter": {"karpenter.k8s.aws/instance-gpu-name": kind, "karpenter.sh/nodepool": pool.name},
        # AKS names the vendor only; the VM size (the well-known instance-type label) names the GPUs.
        "aks": {
            "kubernetes.azure.com/accelerator": "nvidia",
            "kubernetes.azure.com/agentpool": pool.name,
            "node.kubernetes.io/instance-type": kind,
        },
        "amd": {"amd.com/gpu.product-name": kind, "amd.com/gpu.count": str(pool.gpus)},
    }
    return by_labelling[pool.labelling]


def gpu_resource(pool: NodePool) -> str:
    """The extended resource that counts the pool's GPUs: AMD's device plugin advertises ``amd.com/gpu``."""
    return "amd.com/gpu" if pool.labelling == "amd" else GPU_RESOURCE


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
                    max_count=_optional(entry, "max", int),
                    scale_up_seconds=float(entry.get("scaleUpSeconds", 1.0)),
                    refuse=_optional(entry, "refuse", str),
                    reclaim_after_seconds=_optional(entry, "reclaimAfterSeconds", float),
                    labelling=str(entry.get("labelling", "gfd+gke")),
                )
            )
            _check(pools[-1])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"pools[{index}]: {exc!r}") from None
    if not any(pool.gpus == 0 for pool in pools):
        pools.append(NodePool("cpu", "", count=1, gpus=0))
    return tuple(pools)


def _optional(entry: Mapping[str, Any], key: str, kind: Callable[[Any], T]) -> T | None:
    return None if entry.get(key) is None else kind(entry[key])


def _check(pool: NodePool) -> None:
    """Refuse a pool whose numbers make no sense or exceed the bounds (``ValueError``)."""
    if not 0 <= pool.count <= pool.limit <= MAX_NODES_PER_POOL:
        raise ValueError(f"need 0 <= count <= max <= {MAX_NODES_PER_POOL}, got count {pool.count}, max {pool.limit}")
    if not 0 <= pool.scale_up_seconds <= MAX_SCALE_UP_SECONDS:
        raise ValueError(f"scaleUpSeconds must be within 0..{MAX_SCALE_UP_SECONDS:g}")
    if pool.reclaim_after_seconds is not None and not 0 <= pool.reclaim_after_seconds <= MAX_SCALE_UP_SECONDS:
        raise ValueError(f"reclaimAfterSeconds must be within 0..{MAX_SCALE_UP_SECONDS:g}")
    if pool.refuse is not None and not 0 < len(pool.refuse) <= MAX_REASON:
        raise ValueError(f"refuse must be a reason of 1..{MAX_REASON} characters")


def nodes(pools: Sequence[NodePool]) -> list[dict[str, Any]]:
    """The Node objects (with status) of ``pools``."""
    result = []
    for pool in pools:
        for index in range(pool.count):
            name = f"{pool.name}-{index}"
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
            resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
            if pool.gpus > 0:
                labels |= gpu_labels(pool)
                resources[gpu_resource(pool)] = str(pool.gpus)
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


def node(pool: NodePool, index: int) -> dict[str, Any]:
    """The pool's Node ``<pool>-<index>``, as :func:`nodes` builds it (one way to build a node)."""
    return nodes([replace(pool, count=index + 1)])[-1]


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


def _node_rejection(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why the node's NoSchedule/NoExecute taints or the pod's nodeSelector keep the pod off it, or ``None``."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    for taint in taints:
        if not tolerates(pod_spec.get("tolerations") or [], taint):
            return f"had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(key) != value for key, value in (pod_spec.get("nodeSelector") or {}).items()):
        return "didn't match Pod's node affinity/selector"
    return None


def anti_affinity_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's required pod anti-affinity terms."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_selects(term: Mapping[str, Any], owner: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether ``owner``'s affinity term selects the pod ``other`` (its namespaces and labelSelector)."""
    namespace = (other.get("metadata") or {}).get("namespace")
    namespaces = term.get("namespaces") or []
    if term.get("namespaceSelector") == {}:  # {} selects every namespace; other selectors are not supported
        pass
    elif namespaces:
        if namespace not in namespaces:
            return False
    elif namespace != (owner.get("metadata") or {}).get("namespace"):  # default: the owner's own namespace
        return False
    selector = term.get("labelSelector")
    if selector is None:  # a term without a labelSelector selects no pod (unlike an empty one)
        return False
    labels = (other.get("metadata") or {}).get("labels") or {}
    return selector == {} or selector_matches(selector, labels)


def anti_affinity_allows(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    placed: Sequence[Mapping[str, Any]],
    nodes_by_name: Mapping[str, Mapping[str, Any]],
) -> bool:
    """Whether required pod anti-affinity lets ``pod`` go to ``node``, given the ``placed`` (bound, live) pods.

    A term forbids the nodes that share its ``topologyKey`` label value with a node running a pod it
    selects; a node without that label is not constrained by the term (the scheduler's InterPodAffinity).
    The placed pods' own terms count too: a pod may not join a domain whose pod repels it.
    """
    labels = node["metadata"].get("labels") or {}

    def same_domain(other: Mapping[str, Any], key: str) -> bool:
        other_node = nodes_by_name.get((other.get("spec") or {}).get("nodeName") or "")
        if other_node is None or key not in labels:
            return False
        return (other_node["metadata"].get("labels") or {}).get(key) == labels[key]

    for other in placed:
        for term in anti_affinity_terms(pod):
            if _term_selects(term, pod, other) and same_domain(other, str(term.get("topologyKey"))):
                return False
        for term in anti_affinity_terms(other):
            if _term_selects(term, other, pod) and same_domain(other, str(term.get("topologyKey"))):
                return False
    return True


def rejection(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    placed: Sequence[Mapping[str, Any]],
    nodes_by_name: Mapping[str, Mapping[str, Any]],
) -> str | None:
    """Why the scheduler filters ``node`` out for ``pod`` (its message fragment), or ``None`` when it fits."""
    reason = _node_rejection(pod.get("spec") or {}, node)
    if reason is None and not anti_affinity_allows(pod, node, placed, nodes_by_name):
        reason = "didn't match pod anti-affinity rules"
    return reason


def is_placed(pod: Mapping[str, Any]) -> bool:
    """Whether the pod occupies its node for the scheduler: bound and not finished."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def unschedulable_message(reasons: Sequence[str | None]) -> str:
    """The scheduler's FitError message: ``0/N nodes are available: <count> node(s) <reason>, ...``."""
    counts: dict[str, int] = {}
    for reason in reasons:
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    detail = ", ".join(f"{count} node(s) {reason}" for reason, count in sorted(counts.items()))
    return f"0/{len(reasons)} nodes are available" + (f": {detail}." if detail else "")
