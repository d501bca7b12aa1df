"""Pool resolution against Nodes: discovery, explicit pools, GPU counts, references."""

import pytest

from compilecache.controller.api import SpecError, parse_spec
from compilecache.controller.pools import pool_name, resolve_pools
from specs import GPU, PRODUCT, cache_spec, cluster, node


def test_discovery_groups_by_product_and_counts_gpus():
    pools = resolve_pools(parse_spec(cache_spec()), cluster())
    assert [(p.name, p.nodes, p.gpus_per_node, p.gpus_per_pod) for p in pools] == [
        ("nvidia-a100-sxm4-40gb", 2, 4, 4),
        ("nvidia-h100-80gb-hbm3", 3, 8, 8),
    ]
    h100 = pools[1]
    assert h100.node_selector == {"nvidia.com/gpu.present": "true", PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    assert h100.gpu_resource == GPU


def test_cordoned_nodes_do_not_count():
    nodes = cluster()
    nodes[0]["spec"] = {"unschedulable": True}
    pools = resolve_pools(parse_spec(cache_spec()), nodes)
    assert {p.name: p.nodes for p in pools}["nvidia-h100-80gb-hbm3"] == 2


def test_explicit_pool_without_nodes_is_kept_with_zero_nodes():
    warmup = cache_spec()["warmup"]
    del warmup["discover"]
    warmup["pools"] = [{"name": "b200", "nodeSelector": {PRODUCT: "NVIDIA-B200"}}]
    pools = resolve_pools(parse_spec(cache_spec(warmup=warmup)), cluster())
    assert [(p.name, p.nodes, p.gpus_per_pod) for p in pools] == [("b200", 0, 0)]


def test_explicit_gpus_per_pod_wins_and_explicit_name_shadows_discovered():
    warmup = cache_spec()["warmup"] | {
        "pools": [
            {"name": "nvidia-h100-80gb-hbm3", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}, "gpusPerPod": 4},
        ]
    }
    pools = resolve_pools(parse_spec(cache_spec(warmup=warmup)), cluster())
    assert [(p.name, p.gpus_per_pod, p.node_selector) for p in pools] == [
        ("nvidia-h100-80gb-hbm3", 4, {PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
        ("nvidia-a100-sxm4-40gb", 4, {"nvidia.com/gpu.present": "true", PRODUCT: "NVIDIA-A100-SXM4-40GB"}),
    ]


def test_workload_pools_restrict_and_unknown_reference_fails():
    warmup = cache_spec()["warmup"]
    warmup["workloads"][0]["pools"] = ["nvidia-h100-80gb-hbm3"]
    pools = resolve_pools(parse_spec(cache_spec(warmup=warmup)), cluster())
    assert [p.name for p in pools] == ["nvidia-h100-80gb-hbm3"]

    warmup["workloads"][0]["pools"] = ["tpu-v5"]
    with pytest.raises(SpecError) as info:
        resolve_pools(parse_spec(cache_spec(warmup=warmup)), cluster())
    assert info.value.field == "spec.warmup.workloads[0].pools[0]"
    assert "tpu-v5" in info.value.message


def test_nodes_without_the_group_label_are_not_a_pool():
    nodes = [node("odd", None, gpu_present=False, **{"nvidia.com/gpu.present": "true"})]
    assert resolve_pools(parse_spec(cache_spec()), nodes) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [("NVIDIA-H100-80GB-HBM3", "nvidia-h100-80gb-hbm3"), ("Tesla T4", None), ("x" * 80, None)],
)
def test_pool_names_are_dns_labels(value, expected):
    name = pool_name(value)
    assert len(name) <= 40 and name == name.lower() and " " not in name
    if expected:
        assert name == expected
    else:
        assert name != pool_name(value + "y")  # shortened names stay distinct


def test_label_values_differing_only_in_case_are_two_pools_with_two_names():
    nodes = [node("upper", "NVIDIA-H100-80GB-HBM3"), node("lower", "nvidia-h100-80gb-hbm3", 4)]
    pools = resolve_pools(parse_spec(cache_spec()), nodes)
    assert len(pools) == 2
    names = [p.name for p in pools]
    assert len(set(names)) == 2
    by_value = {p.node_selector[PRODUCT]: p for p in pools}
    # The value that is a pool name already keeps it; the other one is told apart by a hash.
    assert by_value["nvidia-h100-80gb-hbm3"].name == "nvidia-h100-80gb-hbm3"
    assert by_value["NVIDIA-H100-80GB-HBM3"].name.startswith("nvidia-h100-80gb-hbm3-")
    assert {p.name: (p.nodes, p.gpus_per_node) for p in pools}[by_value["nvidia-h100-80gb-hbm3"].name] == (1, 4)
    # Deterministic: the same nodes in another order give the same names.
    assert [p.name for p in resolve_pools(parse_spec(cache_spec()), nodes[::-1])] == names
    # And one Job each: the names differ, and so do the Job names.
    from compilecache.controller import jobs

    cache = {"metadata": {"name": "llama", "namespace": "default", "uid": "u"}, "spec": cache_spec()}
    job_names = {jobs.warmup_job(cache, parse_spec(cache_spec()), pool)["metadata"]["name"] for pool in pools}
    assert len(job_names) == 2


# The names the single-label pool_names gave before labels took part (8495882): the names of
# existing caches' pools, and so their Job names, must not change.
_NAMES_BEFORE = [
    {"NVIDIA-H100-80GB-HBM3": "nvidia-h100-80gb-hbm3-10b892", "nvidia-h100-80gb-hbm3": "nvidia-h100-80gb-hbm3"},
    {"Tesla.T4": "tesla-t4-ca6ba6", "Tesla_T4": "tesla-t4-556388", "tesla-t4": "tesla-t4"},
    {
        "A" * 80: "a" * 33 + "-d9b1f3",
        "a" * 80: "a" * 33 + "-0f45e8",
        "a" * 79 + "B": "a" * 33 + "-4e7691",
    },
    {"x": "x", "X": "x-4b68ab", "-x-": "x-c6cf95", "x_": "x-3e16f5"},
]


@pytest.mark.parametrize("before", _NAMES_BEFORE)
def test_pool_names_of_one_label_are_distinct_dns_labels_and_unchanged(before):
    import re

    from compilecache.controller.pools import pool_names

    groups = [(PRODUCT, value) for value in before]
    names = pool_names(groups)
    assert len(set(names.values())) == len(groups)
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", name) for name in names.values()), names
    assert pool_names(list(reversed(groups))) == names
    assert {value: names[(PRODUCT, value)] for value in before} == before
