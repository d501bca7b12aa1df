"""Discovery by GPU type on every cloud: the accelerator labels, groupBy's default, declared gpuTypes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compilecache.controller import accelerators
from compilecache.controller.api import SpecError, parse_spec
from compilecache.controller.pools import discover_groups, resolve_pools
from specs import cache_spec

GKE = "cloud.google.com/gke-accelerator"
EKS = "k8s.amazonaws.com/accelerator"
KARPENTER = "karpenter.k8s.aws/instance-gpu-name"
AKS = "kubernetes.azure.com/accelerator"
AMD = "amd.com/gpu.product-name"
GFD = "nvidia.com/gpu.product"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"

# How each one labels an 8-GPU node (what a node of theirs carries besides the usual labels).
CLOUDS: dict[str, dict[str, str]] = {
    "gke": {GKE: "nvidia-h100-80gb", INSTANCE_TYPE: "a3-highgpu-8g"},
    "eks": {EKS: "nvidia-tesla-a100", INSTANCE_TYPE: "p4d.24xlarge"},
    "karpenter": {KARPENTER: "a100", INSTANCE_TYPE: "p4d.24xlarge", "karpenter.sh/nodepool": "gpu"},
    "aks": {AKS: "nvidia", INSTANCE_TYPE: "Standard_ND96isr_H100_v5", "kubernetes.azure.com/agentpool": "gpu"},
    "amd": {AMD: "AMD_Instinct_MI300X_OAM", INSTANCE_TYPE: "ND96isr_MI300X_v5"},
    "gfd": {GFD: "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"},
}
# The pool each finds (name, selector): the cloud's own value names it; AKS's names the VM size.
FOUND: dict[str, tuple[str, dict[str, str]]] = {
    "gke": ("nvidia-h100-80gb", {GKE: "nvidia-h100-80gb"}),
    "eks": ("nvidia-tesla-a100", {EKS: "nvidia-tesla-a100"}),
    "karpenter": ("a100", {KARPENTER: "a100"}),
    "aks": ("standard-nd96isr-h100-v5-", {INSTANCE_TYPE: "Standard_ND96isr_H100_v5"}),
    "amd": ("amd-instinct-mi300x-oam-", {AMD: "AMD_Instinct_MI300X_OAM"}),
    "gfd": ("nvidia-h100-80gb-hbm3", {GFD: "NVIDIA-H100-80GB-HBM3"}),
}


def gpu_node(name: str, labels: dict[str, str], gpus: int = 8, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", resource: str(gpus)}},
    }


def cpu_node(name: str = "cpu-0") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, INSTANCE_TYPE: "n2-standard-8"}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }


def spec_with(discover: dict[str, Any]) -> dict[str, Any]:
    return cache_spec(warmup=cache_spec()["warmup"] | {"discover": discover})


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_nodes_labelled_only_the_clouds_way_are_found_with_no_selector_and_no_group_by(cloud: str) -> None:
    resource = "amd.com/gpu" if cloud == "amd" else "nvidia.com/gpu"  # AMD's device plugin counts amd.com/gpu
    nodes = [gpu_node(f"{cloud}-{i}", CLOUDS[cloud], 8, resource) for i in range(2)] + [cpu_node()]
    [pool] = resolve_pools(parse_spec(spec_with({"gpuResource": resource})), nodes)
    name, selector = FOUND[cloud]
    assert pool.name == name or (name.endswith("-") and re.fullmatch(re.escape(name) + "[0-9a-f]{6}", pool.name))
    assert (pool.node_selector, pool.nodes, pool.gpus_per_node, pool.gpus_per_pod) == (selector, 2, 8, 8)
    assert pool.declared_gpus is None and pool.gpu_resource == resource


def test_a_cluster_of_every_cloud_gives_one_pool_each() -> None:
    nodes = [gpu_node(f"{cloud}-{i}", labels) for cloud, labels in CLOUDS.items() for i in range(2)] + [cpu_node()]
    pools = resolve_pools(parse_spec(spec_with({})), nodes)
    assert sorted(dict(p.node_selector).popitem() for p in pools) == sorted(
        next(iter(selector.items())) for _, selector in FOUND.values()
    )
    assert all(p.nodes == 2 for p in pools)
    assert len({p.name for p in pools}) == len(CLOUDS)


@pytest.mark.parametrize(
    ("labels", "group"),
    [
        # A GKE node with the GPU operator's labels too: GKE's, there from the node's creation.
        ({**CLOUDS["gfd"], **CLOUDS["gke"]}, (GKE, "nvidia-h100-80gb")),
        ({**CLOUDS["gfd"], **CLOUDS["eks"], **CLOUDS["karpenter"]}, (EKS, "nvidia-tesla-a100")),
        ({**CLOUDS["gfd"], **CLOUDS["karpenter"]}, (KARPENTER, "a100")),
        ({**CLOUDS["gfd"], **CLOUDS["aks"]}, (INSTANCE_TYPE, "Standard_ND96isr_H100_v5")),
        # AKS's label alone, without the VM size, names no GPU type: the next label does.
        ({**CLOUDS["gfd"], AKS: "nvidia"}, (GFD, "NVIDIA-H100-80GB-HBM3")),
        ({AKS: "nvidia"}, None),
        ({**CLOUDS["gfd"], **CLOUDS["amd"]}, (AMD, "AMD_Instinct_MI300X_OAM")),
        ({INSTANCE_TYPE: "p4d.24xlarge", "nvidia.com/gpu.present": "true"}, None),
    ],
)
def test_the_first_label_of_the_table_a_node_carries_is_its_group(labels, group) -> None:
    assert accelerators.gpu_group(labels) == group
    groups = discover_groups(parse_spec(spec_with({})).warmup.discover, [gpu_node("n", labels)])
    assert [selector for _, selector, _ in groups] == ([] if group is None else [dict([group])])


def test_a_gke_node_keeps_its_pool_when_gpu_feature_discovery_labels_it_later() -> None:
    discover = parse_spec(spec_with({})).warmup.discover
    created = discover_groups(discover, [gpu_node("n", CLOUDS["gke"])])
    labelled = discover_groups(discover, [gpu_node("n", {**CLOUDS["gke"], **CLOUDS["gfd"]})])
    assert created == labelled == [("nvidia-h100-80gb", {GKE: "nvidia-h100-80gb"}, None)]


def test_an_explicit_group_by_groups_as_before_whatever_else_the_nodes_carry() -> None:
    nodes = [
        gpu_node("h-0", {**CLOUDS["gke"], **CLOUDS["gfd"]}),
        gpu_node("a-0", {GKE: "nvidia-tesla-a100", GFD: "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.present": "true"}),
        gpu_node("k-0", CLOUDS["karpenter"]),  # no GFD label: not a node of this discovery
    ]
    spec = spec_with({"nodeSelector": {"nvidia.com/gpu.present": "true"}, "groupBy": GFD})
    pools = resolve_pools(parse_spec(spec), nodes)
    assert [(p.name, dict(p.node_selector), p.nodes) for p in pools] == [
        ("nvidia-a100-sxm4-40gb", {"nvidia.com/gpu.present": "true", GFD: "NVIDIA-A100-SXM4-40GB"}, 1),
        ("nvidia-h100-80gb-hbm3", {"nvidia.com/gpu.present": "true", GFD: "NVIDIA-H100-80GB-HBM3"}, 1),
    ]


def test_declared_gpu_types_are_pools_before_any_node_exists() -> None:
    spec = spec_with(
        {
            "nodeSelector": {"cloud.google.com/gke-nodepool": "train"},
            "groupBy": GKE,
            "gpuTypes": [{"value": "nvidia-h100-80gb", "gpusPerPod": 8}, {"value": "nvidia-l4", "gpusPerPod": 1}],
        }
    )
    pools = resolve_pools(parse_spec(spec), [cpu_node()])
    assert [(p.name, dict(p.node_selector), p.nodes, p.gpus_per_pod, p.declared_gpus) for p in pools] == [
        ("nvidia-h100-80gb", {"cloud.google.com/gke-nodepool": "train", GKE: "nvidia-h100-80gb"}, 0, 8, 8),
        ("nvidia-l4", {"cloud.google.com/gke-nodepool": "train", GKE: "nvidia-l4"}, 0, 1, 1),
    ]


def test_a_declared_type_whose_nodes_came_is_their_pool_with_the_declared_gpus() -> None:
    spec = spec_with({"groupBy": GKE, "gpuTypes": [{"value": "nvidia-h100-80gb", "gpusPerPod": 4}]})
    nodes = [gpu_node("h-0", CLOUDS["gke"]), gpu_node("l-0", {GKE: "nvidia-l4"}, 2)]
    pools = resolve_pools(parse_spec(spec), nodes)
    assert [(p.name, p.nodes, p.gpus_per_node, p.gpus_per_pod, p.declared_gpus) for p in pools] == [
        ("nvidia-h100-80gb", 1, 8, 4, 4),
        ("nvidia-l4", 1, 2, 2, None),
    ]


def test_an_explicit_pool_of_the_same_name_wins_over_a_declared_type() -> None:
    warmup = cache_spec()["warmup"] | {
        "pools": [{"name": "nvidia-l4", "nodeSelector": {GKE: "nvidia-l4"}, "gpusPerPod": 2}],
        "discover": {"groupBy": GKE, "gpuTypes": [{"value": "nvidia-l4", "gpusPerPod": 1}]},
    }
    [pool] = resolve_pools(parse_spec(cache_spec(warmup=warmup)), [])
    assert (pool.name, pool.gpus_per_pod, dict(pool.node_selector)) == ("nvidia-l4", 2, {GKE: "nvidia-l4"})


def test_gpu_types_need_group_by() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec_with({"gpuTypes": [{"value": "nvidia-l4", "gpusPerPod": 1}]}))
    assert info.value.field == "spec.warmup.discover.gpuTypes"
    assert "groupBy" in info.value.message


def test_one_value_under_two_labels_is_two_pools_and_the_first_label_keeps_the_plain_name() -> None:
    # GKE and Cluster Autoscaler's AWS label share values (nvidia-tesla-a100) in a federated fleet.
    nodes = [
        gpu_node("g-0", {GKE: "nvidia-tesla-a100"}),
        gpu_node("e-0", {EKS: "nvidia-tesla-a100"}, 4),
        gpu_node("k-0", {KARPENTER: "NVIDIA-Tesla-A100"}),
    ]
    pools = resolve_pools(parse_spec(spec_with({})), nodes)
    by_label = {next(iter(p.node_selector)): p for p in pools}
    assert by_label[GKE].name == "nvidia-tesla-a100"
    assert re.fullmatch(r"nvidia-tesla-a100-[0-9a-f]{6}", by_label[EKS].name)
    assert re.fullmatch(r"nvidia-tesla-a100-[0-9a-f]{6}", by_label[KARPENTER].name)
    assert len({p.name for p in pools}) == 3
    assert (by_label[EKS].nodes, by_label[EKS].gpus_per_node) == (1, 4)
    assert [p.name for p in resolve_pools(parse_spec(spec_with({})), nodes[::-1])] == [p.name for p in pools]


def test_every_label_of_the_table_is_documented_with_who_sets_it_and_an_example() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "how-it-works.md").read_text()
    for entry in accelerators.ACCELERATOR_LABELS:
        row = f"| `{entry.key}` | {entry.set_by} | `{entry.example}` |"
        assert row in page, f"docs/how-it-works.md lacks the row {row}"


# --- any nodes: each GPU node in its one pool, names distinct and stable ------------------

_VALUES = st.sampled_from(
    ["nvidia-h100-80gb", "NVIDIA-H100-80GB", "nvidia_h100_80gb", "a100", "A100", "x", "X", "a" * 63, "A" * 63, "nvidia"]
)
_LABELS = [entry.key for entry in accelerators.ACCELERATOR_LABELS] + [INSTANCE_TYPE, "example.com/other"]


@st.composite
def node_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    nodes = []
    for index in range(draw(st.integers(0, 12))):
        labels = draw(st.dictionaries(st.sampled_from(_LABELS), _VALUES, max_size=4))
        nodes.append(gpu_node(f"n-{index}", labels, draw(st.integers(0, 8))))
    return nodes


@given(nodes=node_sets(), order=st.randoms(use_true_random=False))
def test_any_nodes_each_gpu_node_lands_in_the_one_pool_of_its_group(nodes, order) -> None:
    spec = parse_spec(spec_with({}))
    pools = resolve_pools(spec, nodes)
    names = [p.name for p in pools]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", name) for name in names), names
    for node in nodes:
        labels = node["metadata"]["labels"]
        group = accelerators.gpu_group(labels)
        own = [p for p in pools if dict(p.node_selector) == ({} if group is None else dict([group]))]
        # A GPU node: exactly one pool is its group's, and the node is among that pool's nodes.
        assert len(own) == (0 if group is None else 1)
        assert all(all(labels.get(k) == v for k, v in p.node_selector.items()) for p in own)
    groups = {accelerators.gpu_group(n["metadata"]["labels"]) for n in nodes} - {None}
    assert len(pools) == len(groups)
    shuffled = list(nodes)
    order.shuffle(shuffled)
    assert [(p.name, dict(p.node_selector), p.nodes) for p in resolve_pools(spec, shuffled)] == [
        (p.name, dict(p.node_selector), p.nodes) for p in pools
    ]
