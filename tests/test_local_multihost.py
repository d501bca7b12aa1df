"""The local cluster's multi-host decisions, without running it: Indexed Jobs, anti-affinity, the cluster DNS.

What these pure functions decide is run end to end in ``test_local_indexed_jobs.py``.
"""

from __future__ import annotations

import copy
import datetime
import random
import socket
from typing import Any

import pytest

from compilecache.local import dns, jobrunner, nodes, pods, validation

NOW = datetime.datetime(2026, 11, 22, 10, 0, 0, tzinfo=datetime.UTC)
LABEL = "compilecache.dev/warmup-job"
INDEX = "batch.kubernetes.io/job-completion-index"


def indexed_job(name: str = "warm", hosts: int = 2, namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    """An Indexed Job of the contract's shape: init container on port 8476, main container on 8480."""
    env = [{"name": "JAX_COORDINATOR_ADDRESS", "value": f"{name}-0.{name}:8476"}]
    main_env = [{"name": "JAX_COORDINATOR_ADDRESS", "value": f"{name}-0.{name}:8480"}]
    template = {
        "metadata": {"labels": {LABEL: name}},
        "spec": {
            "subdomain": name,
            "initContainers": [{"name": "fetch", "env": env}],
            "containers": [{"name": "warm", "env": main_env}],
        },
    }
    body = {"completionMode": "Indexed", "completions": hosts, "parallelism": hosts, "backoffLimit": 0}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {**body, "template": template, **spec},
        "status": {},
    }


def headless(name: str = "warm", namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    selector = {LABEL: name}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": "None", "selector": selector, **spec},
    }


def pod_of(index: int, phase: str | None, name: str | None = None) -> dict[str, Any]:
    meta = {"name": name or f"warm-{index}-abcde", "annotations": {INDEX: str(index)}}
    return {"metadata": meta, "status": {"phase": phase} if phase else {}}


# --- the Job controller: Indexed Jobs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("indexes", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 1], "0,1"),
        ([0, 1, 2], "0-2"),
        ([1, 3, 4, 5, 7], "1,3-5,7"),
        ([7, 2, 3, 4, 6], "2-4,6,7"),
    ],
)
def test_completed_indexes_are_written_as_the_job_controller_writes_them(indexes: list[int], text: str) -> None:
    assert jobrunner.format_indexes(indexes) == text


def test_an_indexed_job_starts_every_index_up_to_its_parallelism() -> None:
    assert jobrunner.job_verdict(indexed_job(hosts=3), [], NOW)["create"] == [0, 1, 2]
    assert jobrunner.job_verdict(indexed_job(hosts=3, parallelism=2), [], NOW)["create"] == [0, 1]
    running = [pod_of(0, "Running"), pod_of(2, "Pending")]
    assert jobrunner.job_verdict(indexed_job(hosts=3), running, NOW)["create"] == [1]
    assert jobrunner.job_verdict(indexed_job(hosts=3, suspend=True), [], NOW)["create"] == []
    # An ordinary Job is as before: one pod at a time, no index.
    assert jobrunner.job_verdict({"metadata": {"name": "j"}, "spec": {"completions": 3}}, [], NOW)["create"] == [None]


def test_an_indexed_job_completes_when_every_index_succeeded_once() -> None:
    half = jobrunner.job_verdict(indexed_job(), [pod_of(0, "Succeeded"), pod_of(0, "Succeeded", "dup")], NOW)
    assert half["status"]["succeeded"] == 1 and half["status"]["completedIndexes"] == "0"
    assert "conditions" not in half["status"] and half["create"] == [1]
    done = jobrunner.job_verdict(indexed_job(), [pod_of(0, "Succeeded"), pod_of(1, "Succeeded")], NOW)
    assert [c["type"] for c in done["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert (done["status"]["succeeded"], done["status"]["completedIndexes"]) == (2, "0,1")


def test_one_failed_pod_fails_a_multihost_job_and_kills_its_peers() -> None:
    pods_now = [pod_of(0, "Running", "warm-0-x"), pod_of(1, "Failed", "warm-1-y"), pod_of(2, None, "warm-2-z")]
    verdict = jobrunner.job_verdict(indexed_job(hosts=3), pods_now, NOW)
    assert verdict["status"]["conditions"][-1]["reason"] == "BackoffLimitExceeded"
    assert verdict["kill"] == ["warm-0-x", "warm-2-z"] and verdict["create"] == []
    # With retries left, the failed index gets a new pod.
    retry = jobrunner.job_verdict(indexed_job(hosts=3, backoffLimit=1), pods_now, NOW)
    assert retry["create"] == [1] and retry["kill"] == []


def test_indexed_pods_are_made_as_the_job_controller_makes_them() -> None:
    job = indexed_job()
    job["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "JOB_COMPLETION_INDEX", "value": "own"})
    before = copy.deepcopy(job)
    pod = jobrunner.pod_for(job, 1)
    assert job == before  # the template is not changed
    meta = pod["metadata"]
    assert meta["generateName"] == "warm-1-"
    assert meta["annotations"] == {INDEX: "1"}
    assert meta["labels"] == {
        LABEL: "warm",
        INDEX: "1",
        "job-name": "warm",
        "batch.kubernetes.io/job-name": "warm",
        "controller-uid": "uid-warm",
        "batch.kubernetes.io/controller-uid": "uid-warm",
    }
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("warm-1", "warm")
    [init], [main] = pod["spec"]["initContainers"], pod["spec"]["containers"]
    from_label = {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX}']"}}
    assert init["env"][-1] == {"name": "JOB_COMPLETION_INDEX", "valueFrom": from_label}
    assert [e for e in main["env"] if e["name"] == "JOB_COMPLETION_INDEX"] == [
        {"name": "JOB_COMPLETION_INDEX", "value": "own"}
    ]
    # A long name is cut so that the generated name fits (podGenerateNameWithIndex).
    long = jobrunner.pod_for(indexed_job("w" * 60), 12)["metadata"]["generateName"]
    assert long == "w" * 54 + "-12-" and len(long) == 58


def test_the_downward_api_serves_the_index_label() -> None:
    pod = {"metadata": {"name": "p", "uid": "u", "labels": {INDEX: "3"}, "annotations": {"a": "b"}}, "spec": {}}
    assert pods.downward_field(pod, f"metadata.labels['{INDEX}']") == "3"
    assert pods.downward_field(pod, "metadata.annotations['a']") == "b"
    assert pods.downward_field(pod, "metadata.labels['missing']") == ""
    assert pods.downward_field(pod, "metadata.uid") == "u"
    assert pods.downward_field(pod, "status.podIP") == "127.0.0.1"
    assert pods.downward_field(pod, "spec.serviceAccountName") == "default"
    assert pods.downward_field(pod, "status.podIPs") is None


# --- the scheduler: required pod anti-affinity ------------------------------------------------------


def anti(
    name: str, namespace: str = "ns", node: str | None = None, key: str = "kubernetes.io/hostname"
) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {LABEL: name}}, "topologyKey": key}
    spec: dict[str, Any] = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"namespace": namespace, "labels": {LABEL: name}}, "spec": spec, "status": {}}


CPU_NODES = nodes.nodes([nodes.NodePool("cpu", "", count=3, gpus=0)])


def test_required_anti_affinity_places_one_pod_per_node() -> None:
    assert jobrunner.choose_node(anti("a"), CPU_NODES, [anti("a", node="cpu-0")]) == "cpu-1"
    full = [anti("a", node=f"cpu-{i}") for i in range(3)]
    assert jobrunner.choose_node(anti("a"), CPU_NODES, full) is None
    message = jobrunner.unschedulable(anti("a"), CPU_NODES, full)
    assert message == "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    # Another Job's pods, pods of another namespace and finished pods do not repel it.
    assert jobrunner.choose_node(anti("a"), CPU_NODES, [anti("b", node="cpu-0")]) == "cpu-0"
    assert jobrunner.choose_node(anti("a"), CPU_NODES, [anti("a", "other", node="cpu-0")]) == "cpu-0"
    done = anti("a", node="cpu-0") | {"status": {"phase": "Succeeded"}}
    assert not jobrunner.is_placed(done) and jobrunner.is_placed(anti("a", node="cpu-0"))


def test_anti_affinity_counts_both_ways_and_only_where_the_topology_key_is() -> None:
    plain = {"metadata": {"namespace": "ns", "labels": {LABEL: "a"}}, "spec": {}}
    # The placed pod's own term repels a newcomer it selects, though the newcomer has no term.
    assert jobrunner.choose_node(plain, CPU_NODES, [anti("a", node="cpu-0")]) == "cpu-1"
    # A node without the topology key's label is not constrained by the term.
    on_cpu_0 = plain | {"spec": {"nodeName": "cpu-0"}}
    assert jobrunner.choose_node(anti("a", key="topology.kubernetes.io/zone"), CPU_NODES, [on_cpu_0]) == "cpu-0"
    assert jobrunner.choose_node(anti("a"), CPU_NODES, [on_cpu_0]) == "cpu-1"
    # A term without a labelSelector selects no pod; an empty one selects every pod.
    placed = [anti("b", node="cpu-0")]
    no_selector = anti("a")
    del no_selector["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"
    ]
    assert jobrunner.choose_node(no_selector, CPU_NODES, placed) == "cpu-0"
    everyone = anti("a")
    everyone["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"
    ] = {}
    assert jobrunner.choose_node(everyone, CPU_NODES, placed) == "cpu-1"


def test_the_unschedulable_message_counts_each_nodes_reason() -> None:
    cluster = nodes.nodes(nodes.DEFAULT_POOLS)
    pod = anti("a")
    pod["spec"] |= {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    placed = [anti("a", node="h100-0"), anti("a", node="h100-1")]
    assert jobrunner.choose_node(pod, cluster, placed) is None
    assert jobrunner.unschedulable(pod, cluster, placed) == (
        "0/4 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "2 node(s) didn't match pod anti-affinity rules."
    )
    untolerated = {"metadata": {"namespace": "ns"}, "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"}}}
    assert jobrunner.unschedulable(untolerated, cluster, []) == (
        "0/4 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "3 node(s) had untolerated taint {nvidia.com/gpu: present}."
    )


# --- the cluster DNS ----------------------------------------------------------------------------------

HOST = dns.Host("127.0.0.1", {8476: 20100, 8477: 20101, 8478: 20102, 8479: 20103})
TABLE = {name: HOST for name in dns.names_of("warm-0", "warm", "ns", "ns")}


@pytest.mark.parametrize(
    ("value", "mapped"),
    [
        ("warm-0.warm:8476", "127.0.0.1:20100"),
        ("warm-0.warm.ns:8477", "127.0.0.1:20101"),
        ("warm-0.warm.ns.svc:8478", "127.0.0.1:20102"),
        ("warm-0.warm.ns.svc.cluster.local:8479", "127.0.0.1:20103"),
        ("WARM-0.Warm:8476", "127.0.0.1:20100"),  # DNS names are case-insensitive
        ("warm-0.warm", "127.0.0.1"),
        ("warm-0.warm:9000", "127.0.0.1:9000"),  # a port outside the Job's block keeps its number
        ("--coordinator=warm-0.warm:8476", "--coordinator=127.0.0.1:20100"),
        ("grpc://warm-0.warm:8476/x,warm-0.warm:8477", "grpc://127.0.0.1:20100/x,127.0.0.1:20101"),
        ("warm-1.warm:8476", "warm-1.warm:8476"),  # not in the table
        ("xwarm-0.warm:8476", "xwarm-0.warm:8476"),  # part of a longer name
        ("a.warm-0.warm:8476", "a.warm-0.warm:8476"),
        ("warm-0.warmer:8476", "warm-0.warmer:8476"),
        ("warm-0.warm.other.svc:8476", "warm-0.warm.other.svc:8476"),
        ("/var/cache/warm-0.warm", "/var/cache/warm-0.warm"),  # a path, not a host
        ("", ""),
    ],
)
def test_cluster_dns_names_and_their_ports_are_rewritten(value: str, mapped: str) -> None:
    assert dns.map_hosts(value, TABLE) == mapped


def test_a_name_resolves_in_its_namespace_or_with_the_namespace_written() -> None:
    assert dns.names_of("w-0", "w", "ns", "ns") == ["w-0.w", "w-0.w.ns", "w-0.w.ns.svc", "w-0.w.ns.svc.cluster.local"]
    assert dns.names_of("w-0", "w", "ns", "other") == ["w-0.w.ns", "w-0.w.ns.svc", "w-0.w.ns.svc.cluster.local"]


def test_a_jobs_block_spans_every_port_its_containers_name_plus_three() -> None:
    job = indexed_job()
    assert dns.named_ports(job, dns.job_names(job)) == {8476, 8480}
    assert dns.job_block_size(job) == 8  # 8476..8483: the init container's group and the main one's
    assert dns.port_map({8476, 8480}, 30000) == {8476 + i: 30000 + i for i in range(8)}
    assert dns.block_size(set()) == 4 and dns.port_map(set(), 30000) == {}
    single = indexed_job(
        template={"spec": {"subdomain": "warm", "containers": [{"name": "c", "args": ["warm-1.warm:7000"]}]}}
    )
    assert dns.job_block_size(single) == 4


def test_the_host_table_needs_a_headless_service_that_selects_the_pods_and_a_block() -> None:
    job = indexed_job()
    table = dns.host_table("ns", [job], [headless()], {"uid-warm": 30000})
    assert set(table) == {name for index in (0, 1) for name in dns.names_of(f"warm-{index}", "warm", "ns", "ns")}
    assert table["warm-1.warm.ns.svc"].ports[8480] == 30004
    assert set(dns.host_table("other", [job], [headless()], {"uid-warm": 30000})) == {
        name for index in (0, 1) for name in dns.names_of(f"warm-{index}", "warm", "ns", "other")
    }
    assert dns.host_table("ns", [job], [headless()], {}) == {}  # no block: the Job does not run
    assert dns.host_table("ns", [job], [], {"uid-warm": 30000}) == {}  # no Service: no records
    not_headless = headless(clusterIP="10.96.0.12")
    assert dns.host_table("ns", [job], [not_headless], {"uid-warm": 30000}) == {}
    other_selector = headless(selector={LABEL: "someone-else"})
    assert dns.host_table("ns", [job], [other_selector], {"uid-warm": 30000}) == {}
    by_index = headless(selector={INDEX: "0"})  # a Service may select one index only
    assert set(dns.host_table("ns", [job], [by_index], {"uid-warm": 30000})) == set(
        dns.names_of("warm-0", "warm", "ns", "ns")
    )
    wrong_namespace = headless(namespace="elsewhere")
    assert dns.host_table("ns", [job], [wrong_namespace], {"uid-warm": 30000}) == {}
    non_indexed = indexed_job(completionMode="NonIndexed")
    assert dns.host_table("ns", [non_indexed], [headless()], {"uid-warm": 30000}) == {}


def test_blocks_avoid_reserved_and_busy_ports() -> None:
    busy = {20003, 20010}
    base = dns.allocate_block(
        4, {20004, 20005}, rng=random.Random(0), is_free=lambda p: p not in busy, port_range=(20000, 20016)
    )
    assert all(port not in busy | {20004, 20005} for port in range(base, base + 4))
    assert base >= 20000 and base + 4 <= 20016
    with pytest.raises(RuntimeError, match="no 4 consecutive free ports"):
        dns.allocate_block(4, set(), is_free=lambda p: p % 3 != 0, port_range=(20000, 20016))
    with pytest.raises(ValueError, match="no block of 40 ports"):
        dns.allocate_block(40, set(), port_range=(20000, 20016))


def test_a_listening_port_is_not_free() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert not dns.port_is_free(port)
    assert dns.port_is_free(dns.allocate_block(4, set()))


# --- the API server's checks --------------------------------------------------------------------------


def test_dns_labels() -> None:
    assert validation.dns1035_label("warm-h100-2h") == []
    assert validation.dns1035_label("2h") and validation.dns1035_label("a_b") and validation.dns1035_label("a" * 64)
    assert validation.dns1123_label("2h-0") == []  # a hostname may start with a digit, a Service name not
    assert validation.dns1123_label("a" * 64) == ["must be no more than 63 characters"]
