"""GPU node pools: explicit ones and those discovered from Node labels, with their GPU counts."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.controller import accelerators
from compilecache.controller.api import CacheSpec, Discover, SpecError, Workload

_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_POOL_NAME_MAX = 40  # leaves room for the cache name and a hash in a 63-character Job name


@dataclass(frozen=True)
class Pool:
    """A resolved pool: where its warm-up pod runs and how many GPUs it sees."""

    name: str
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    gpu_resource: str
    nodes: int
    gpus_per_node: int
    gpus_per_pod: int
    workloads: tuple[Workload, ...]
    # The GPUs per pod the spec declares (``None``: all of a node's, read from the nodes). A pool
    # with no node can ask an autoscaler for one only with this: the cache key holds the count.
    declared_gpus: int | None = None


def resolve_pools(spec: CacheSpec, nodes: Sequence[Mapping[str, Any]]) -> list[Pool]:
    """Resolve the spec's explicit and discovered pools against the cluster's Nodes.

    Explicit pools come first, in spec order; discovered pools follow, sorted by
    label value; a discovered pool named like an explicit one is the explicit one. Pools
    without a workload to compile are left out. Raises :class:`SpecError` when a
    workload names a pool that is neither declared nor discovered.
    """
    schedulable = [node for node in nodes if not node.get("spec", {}).get("unschedulable")]
    candidates: list[tuple[str, dict[str, str], tuple[Mapping[str, Any], ...], str, int | None]] = [
        (pool.name, dict(pool.node_selector), pool.tolerations, pool.gpu_resource, pool.gpus_per_pod)
        for pool in spec.warmup.pools
    ]
    if spec.warmup.discover is not None:
        explicit = {pool.name for pool in spec.warmup.pools}
        discover = spec.warmup.discover
        for name, selector, declared in discover_groups(discover, schedulable):
            if name not in explicit:
                candidates.append((name, selector, discover.tolerations, discover.gpu_resource, declared))

    known = {name for name, *_ in candidates}
    for index, workload in enumerate(spec.warmup.workloads):
        for pindex, pool_name in enumerate(workload.pools):
            if pool_name not in known:
                raise SpecError(
                    f"spec.warmup.workloads[{index}].pools[{pindex}]",
                    f"unknown pool {pool_name!r}; pools are: {', '.join(sorted(known)) or 'none'}",
                )

    pools: list[Pool] = []
    for name, selector, tolerations, gpu_resource, gpus_per_pod in candidates:
        workloads = tuple(w for w in spec.warmup.workloads if not w.pools or name in w.pools)
        if not workloads:
            continue
        members = [node for node in schedulable if _matches(node, selector)]
        gpus_per_node = min((_allocatable(node, gpu_resource) for node in members), default=0)
        pools.append(
            Pool(
                name=name,
                node_selector=selector,
                tolerations=tolerations,
                gpu_resource=gpu_resource,
                nodes=len(members),
                gpus_per_node=gpus_per_node,
                gpus_per_pod=gpus_per_node if gpus_per_pod is None else gpus_per_pod,
                workloads=workloads,
                declared_gpus=gpus_per_pod,
            )
        )
    return pools


def discover_groups(
    discover: Discover, nodes: Sequence[Mapping[str, Any]]
) -> list[tuple[str, dict[str, str], int | None]]:
    """The pools ``discover`` finds: (pool name, node selector, declared GPUs per pod or ``None``).

    A node that ``nodeSelector`` selects belongs to the group of its ``groupBy`` label's value, or,
    with ``groupBy`` unset, of the first accelerator label it carries (``accelerators.gpu_group``);
    a node without one is no GPU node here. Each of ``gpuTypes`` is a group whether or not a node
    carries its value, with the GPUs per pod it declares. Groups come sorted by value, then label.
    """
    found: dict[tuple[str, str], int | None] = {}
    for node in nodes:
        if not _matches(node, discover.node_selector):
            continue
        labels = node.get("metadata", {}).get("labels") or {}
        if discover.group_by is None:
            group = accelerators.gpu_group(labels)
        else:
            group = (discover.group_by, labels[discover.group_by]) if discover.group_by in labels else None
        if group is not None:
            found[group] = None
    if discover.group_by is not None:  # the CEL rule: gpuTypes only with groupBy
        for gpu_type in discover.gpu_types:
            found[(discover.group_by, gpu_type.value)] = gpu_type.gpus_per_pod
    groups = sorted(found, key=lambda group: (group[1], accelerators.rank(group[0]), group[0]))
    names = pool_names(groups)
    return [(names[group], {**discover.node_selector, group[0]: group[1]}, found[group]) for group in groups]


def pool_names(groups: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Distinct DNS-label pool names for distinct (label, value) groups (see :func:`pool_name`).

    A name comes from the value alone, so the pools of one ``groupBy`` label keep the names they
    always had. Label values are case-sensitive and pool names are not: ``NVIDIA-H100-80GB-HBM3``
    and ``nvidia-h100-80gb-hbm3`` are two groups of nodes. Where plain names collide, the group
    whose value is its name already keeps it (of several labels with that value, the one first in
    the accelerator table), and each other one gets a hash: of its value, or of label and value
    where another label has the same value (GKE's and EKS's labels share ``nvidia-tesla-a100``).
    The names depend on the set of groups only, not on their order.
    """
    plain = {group: pool_name(group[1]) for group in groups}
    taken: dict[str, int] = {}
    labels_of: dict[str, list[str]] = {}
    for (label, value), name in plain.items():
        taken[name] = taken.get(name, 0) + 1
        labels_of.setdefault(value, []).append(label)

    def keeps(label: str, value: str, name: str) -> bool:
        first = min(labels_of[value], key=lambda other: (accelerators.rank(other), other))
        return taken[name] == 1 or (name == value and label == first)

    return {
        (label, value): name
        if keeps(label, value, name)
        else _hashed(name, value if len(labels_of[value]) == 1 else f"{label}={value}")
        for (label, value), name in plain.items()
    }


def pool_name(label_value: str) -> str:
    """A DNS-label pool name for a label value, e.g. ``NVIDIA-H100-80GB-HBM3`` → ``nvidia-h100-80gb-hbm3``.

    Names that had to be shortened get a hash suffix, so two long values never collide.
    """
    name = _NOT_DNS.sub("-", label_value.lower()).strip("-") or "pool"
    if len(name) <= _POOL_NAME_MAX and name == label_value.lower():
        return name
    return _hashed(name, label_value)


def _hashed(name: str, label_value: str) -> str:
    digest = hashlib.sha256(label_value.encode()).hexdigest()[:6]
    if name.endswith(f"-{digest}"):  # already hashed (shortened): the hash of this very value
        return name
    return f"{name[: _POOL_NAME_MAX - 7].rstrip('-')}-{digest}"


def _matches(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _allocatable(node: Mapping[str, Any], resource: str) -> int:
    raw = (node.get("status", {}).get("allocatable") or {}).get(resource, 0)
    try:
        return int(str(raw))
    except ValueError:
        return 0
