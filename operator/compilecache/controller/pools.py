"""GPU node pools: explicit ones and those discovered from Node labels, with their GPU counts.

When the cache knows training's pod template (``spec.warmup.podTemplate``), a discovered pool training
cannot land on is left out (:class:`LeftOut`, ``status.leftOutPools``): :func:`placement_problem` reads
the template's nodeSelector, required node affinity and tolerations (``api.Placement``) against the
pool's nodes as the scheduler's NodeAffinity and TaintToleration filters do. Explicit pools are the
cache author's choice and are always kept.
"""

from __future__ import annotations

import hashlib
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.api import model
from compilecache.controller import accelerators, api
from compilecache.controller.api import CacheSpec, Discover, NodeRequirement, Placement, SpecError, Workload

_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_POOL_NAME_MAX = 40  # leaves room for the cache name and a hash in a 63-character Job name
# Why a discovered pool is left out (status.leftOutPools[].reason): training's nodeSelector or required
# node affinity selects none of its nodes; or each node it selects has a taint training does not tolerate.
NOT_SELECTED = "TrainingSelectsOtherNodes"
NOT_TOLERATED = "TrainingTaintNotTolerated"
assert typing.get_args(model.LeftOutPool.model_fields["reason"].annotation) == (NOT_SELECTED, NOT_TOLERATED)
LEFT_OUT_MESSAGE_MAX = 1024  # characters of a left-out pool's message (the CRD's bound)
LEFT_OUT_MAX = 64  # pools status.leftOutPools names (the CRD's bound); discover finds one pool per GPU type
# The taint effects that keep a pod off a node (the scheduler's TaintToleration filter: NoSchedule and
# NoExecute; PreferNoSchedule only scores).
_FILTERING_EFFECTS = ("NoSchedule", "NoExecute")


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


@dataclass(frozen=True)
class LeftOut:
    """A discovered pool training's pod template rules out: not warmed, and why (``status.leftOutPools``)."""

    name: str
    reason: str  # NOT_SELECTED or NOT_TOLERATED
    message: str


@dataclass(frozen=True)
class Resolved:
    """The pools to warm, and the discovered pools left out because training cannot run there."""

    pools: list[Pool]
    left_out: list[LeftOut]


def resolve_pools(spec: CacheSpec, nodes: Sequence[Mapping[str, Any]]) -> list[Pool]:
    """The pools to warm (:func:`resolve`'s ``pools``)."""
    return resolve(spec, nodes).pools


def resolve(spec: CacheSpec, nodes: Sequence[Mapping[str, Any]]) -> Resolved:
    """Resolve the spec's explicit and discovered pools against the cluster's Nodes.

    Explicit pools come first, in spec order; discovered pools follow, sorted by
    label value; a discovered pool named like an explicit one is the explicit one. Pools
    without a workload to compile are left out, and so are the discovered pools training's pod
    template rules out (``left_out``, :func:`placement_problem`). Raises :class:`SpecError` when a
    workload names a pool that is neither declared nor discovered.
    """
    schedulable = [node for node in nodes if not node.get("spec", {}).get("unschedulable")]
    candidates: list[tuple[str, dict[str, str], tuple[Mapping[str, Any], ...], str, int | None, bool]] = [
        (pool.name, dict(pool.node_selector), pool.tolerations, pool.gpu_resource, pool.gpus_per_pod, False)
        for pool in spec.warmup.pools
    ]
    if spec.warmup.discover is not None:
        explicit = {pool.name for pool in spec.warmup.pools}
        discover = spec.warmup.discover
        for name, selector, declared in discover_groups(discover, schedulable):
            if name not in explicit:
                candidates.append((name, selector, discover.tolerations, discover.gpu_resource, declared, True))

    known = {name for name, *_ in candidates}
    for index, workload in enumerate(spec.warmup.workloads):
        for pindex, pool_name in enumerate(workload.pools):
            if pool_name not in known:
                raise SpecError(
                    f"spec.warmup.workloads[{index}].pools[{pindex}]",
                    f"unknown pool {pool_name!r}; pools are: {', '.join(sorted(known)) or 'none'}",
                )

    template = spec.warmup.pod_template
    pools: list[Pool] = []
    left_out: list[LeftOut] = []
    for name, selector, tolerations, gpu_resource, gpus_per_pod, discovered in candidates:
        workloads = tuple(w for w in spec.warmup.workloads if not w.pools or name in w.pools)
        if not workloads:
            continue
        members = [node for node in schedulable if _matches(node, selector)]
        if discovered and template is not None:
            problem = placement_problem(template.placement, members, selector)
            if problem is not None:
                left_out.append(LeftOut(name, problem[0], problem[1][:LEFT_OUT_MESSAGE_MAX]))
                continue
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
    return Resolved(pools, left_out)


def left_out_status(left_out: Sequence[LeftOut]) -> list[dict[str, str]]:
    """``status.leftOutPools``: name, reason and message of each, at most :data:`LEFT_OUT_MAX` (the CRD's bound)."""
    return [{"name": pool.name, "reason": pool.reason, "message": pool.message} for pool in left_out[:LEFT_OUT_MAX]]


def placement_problem(
    placement: Placement, members: Sequence[Mapping[str, Any]], selector: Mapping[str, str]
) -> tuple[str, str] | None:
    """Why training (its ``placement``) cannot run on a pool, as (reason, message); ``None`` when it can.

    It can when one of the pool's ``members`` passes the scheduler's filters that read the node alone:
    NodeAffinity (nodeSelector and required node affinity, :func:`selects`) and TaintToleration
    (:func:`untolerated`). A pool with no node yet (a ``gpuTypes`` one) is judged by its ``selector``
    alone: a requirement on a label the selector does not fix may hold on the node an autoscaler brings,
    so only those on its labels count, and no taint is known. The message names the first member's
    problem. Work: members × the placement's requirements (bounded by ``api._placement``).
    """
    if not members:
        if selects(placement, selector, None, known=frozenset(selector)):
            return None
        return NOT_SELECTED, "training's " + _mismatch(placement, selector, None, frozenset(selector)) + (
            " (the pool has no node yet: judged by its selector's labels)"
        )
    first: tuple[str, str] | None = None
    for node in members:
        meta = node.get("metadata") or {}
        labels, name = meta.get("labels") or {}, str(meta.get("name") or "")
        if not selects(placement, labels, name):
            problem = NOT_SELECTED, f"node {name}: training's {_mismatch(placement, labels, name, None)}"
        elif (taint := untolerated(placement, node)) is not None:
            shown = f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}"
            problem = NOT_TOLERATED, f"node {name} has taint {shown}, which training's tolerations do not tolerate"
        else:
            return None
        first = first or problem
    return first


def selects(
    placement: Placement, labels: Mapping[str, str], name: str | None, known: frozenset[str] | None = None
) -> bool:
    """Whether a node with ``labels`` (and ``name``) passes training's nodeSelector and required node
    affinity: every nodeSelector entry, and one term whose requirements all hold (terms ORed; a term
    without requirements matches no node), as the scheduler's ``nodeaffinity.GetRequiredNodeAffinity(pod).
    Match(node)`` (component-helpers scheduling/corev1/nodeaffinity). With ``known``, only requirements on
    those labels count (the node's name is unknown): the others are taken to hold."""
    for key, value in placement.node_selector.items():
        if (known is None or key in known) and labels.get(key) != value:
            return False
    if placement.node_terms is None:
        return True
    return any(term and all(_holds(req, labels, name, known) for req in term) for term in placement.node_terms)


def _holds(req: NodeRequirement, labels: Mapping[str, str], name: str | None, known: frozenset[str] | None) -> bool:
    """One requirement, as apimachinery's ``labels.Requirement.Matches`` (``fields`` for the node's name)."""
    if req.node_name:
        return name is None or (name in req.values) == (req.operator == "In")
    if known is not None and req.key not in known:
        return True
    value = labels.get(req.key)
    if req.operator == "In":
        return value is not None and value in req.values
    if req.operator == "NotIn":
        return value is None or value not in req.values
    if req.operator == "Exists":
        return value is not None
    if req.operator == "DoesNotExist":
        return value is None
    number = api.parse_int64(value) if value is not None else None  # Gt, Lt: a label that is no integer fails
    if number is None or req.bound is None:
        return False
    return number > req.bound if req.operator == "Gt" else number < req.bound


def _mismatch(placement: Placement, labels: Mapping[str, str], name: str | None, known: frozenset[str] | None) -> str:
    """What of training's placement a node (or a node-less pool's selector) fails: for the message."""

    def has(key: str) -> str:
        return f"{key}={labels[key]}" if key in labels else f"no {key} label"

    for key, value in placement.node_selector.items():
        if (known is None or key in known) and labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match ({has(key)})"
    failed: list[str] = []
    for index, term in enumerate(placement.node_terms or ()):
        req = next((req for req in term if not _holds(req, labels, name, known)), None)
        if req is None:
            failed.append(f"term {index} has no requirement, which matches no node")
        else:
            found = f"node name {name}" if req.node_name else has(req.key)
            failed.append(f"term {index} needs {req.describe()} ({found})")
        if len(failed) == 3:
            break
    terms = len(placement.node_terms or ())
    more = f"; and {terms - len(failed)} more terms" if terms > len(failed) else ""
    return f"required node affinity matches no node: {'; '.join(failed)}{more}"


def untolerated(placement: Placement, node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The node's first NoSchedule or NoExecute taint training's tolerations do not tolerate, or ``None``.

    A training pod that requests an extended resource (``nvidia.com/gpu``) also tolerates that key's
    NoSchedule taints: Kubernetes' ExtendedResourceToleration admission plugin adds the toleration (GKE
    enables it; plugin/pkg/admission/extendedresourcetoleration). Where it is off, such a pod lands on
    no node with that taint at all, so taking the toleration keeps a pool rather than wrongly leaving one out.
    """
    taints = (node.get("spec") or {}).get("taints") or []
    for taint in taints:
        if not isinstance(taint, Mapping) or taint.get("effect") not in _FILTERING_EFFECTS:
            continue
        if taint.get("effect") == "NoSchedule" and taint.get("key") in placement.extended_resources:
            continue
        if not any(tolerates(toleration, taint) for toleration in placement.tolerations):
            return taint
    return None


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates a taint: core/v1 ``Toleration.ToleratesTaint`` (an empty effect or
    key matches any; ``Exists`` any value, ``Equal`` (the default) the same value; another operator none)."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if (effect and effect != taint.get("effect")) or (key and key != taint.get("key")):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


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
