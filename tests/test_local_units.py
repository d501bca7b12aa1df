"""The local cluster's decisions, without running it: admission matching, the Job controller, the kubelet's mapping."""

from __future__ import annotations

import base64
import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.local import admission, jobrunner, nodes, pods

NOW = datetime.datetime(2026, 11, 22, 10, 0, 0, tzinfo=datetime.UTC)


# --- admission -------------------------------------------------------------------------------------


def test_absent_or_empty_selector_selects_everything_as_in_the_api_server() -> None:
    assert admission.selector_matches(None, {})
    assert admission.selector_matches({}, {"a": "b"})


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ["x"], {"k": "x"}, True),
        ("In", ["x"], {}, False),
        ("NotIn", ["false"], {}, True),  # an absent label is "not in": Istio's opt-out pattern relies on it
        ("NotIn", ["false"], {"k": "false"}, False),
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {}, False),
        ("DoesNotExist", [], {}, True),
        ("Bogus", [], {"k": "x"}, False),
    ],
)
def test_match_expressions(operator: str, values: list[str], labels: dict[str, str], expected: bool) -> None:
    selector = {"matchExpressions": [{"key": "k", "operator": operator, "values": values}]}
    assert admission.selector_matches(selector, labels) is expected


def webhook(name: str, **fields: Any) -> dict[str, Any]:
    rule = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
    return {"name": name, "rules": [rule], **fields}


def test_webhooks_are_chosen_by_rules_and_both_selectors_in_configuration_name_order() -> None:
    configurations = [
        {"metadata": {"name": "b"}, "webhooks": [webhook("b1")]},
        {
            "metadata": {"name": "a"},
            "webhooks": [
                webhook("a1", objectSelector={"matchLabels": {"app": "train"}}),
                webhook("a2", namespaceSelector={"matchLabels": {"team": "ml"}}),
                {**webhook("a3"), "rules": [{**webhook("x")["rules"][0], "operations": ["UPDATE"]}]},
                {**webhook("a4"), "rules": [{**webhook("x")["rules"][0], "resources": ["*"]}]},
            ],
        },
    ]
    pod = {"metadata": {"labels": {"app": "train"}}}
    chosen = admission.webhooks_to_call(configurations, pod, {"kubernetes.io/metadata.name": "default"})
    assert [w["name"] for w in chosen] == ["a1", "a4", "b1"]


def answer(sent: dict[str, Any], **response: Any) -> dict[str, Any]:
    return {"kind": "AdmissionReview", "response": {"uid": sent["request"]["uid"], "allowed": True, **response}}


def test_a_json_patch_answer_is_applied() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {}}
    sent = admission.review(pod, "default")
    assert sent["request"]["namespace"] == "default" and sent["request"]["object"] == pod
    patch = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "g"}]}]
    encoded = base64.b64encode(json.dumps(patch).encode()).decode()
    patched = admission.apply_response(pod, sent, answer(sent, patchType="JSONPatch", patch=encoded))
    assert patched["spec"]["schedulingGates"] == [{"name": "g"}]
    assert pod["spec"] == {}  # the input is left alone
    assert admission.apply_response(pod, sent, answer(sent)) is pod


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"uid": "other"}, ValueError),
        ({"allowed": False, "status": {"message": "no"}}, PermissionError),
        ({"patchType": "Merge", "patch": "e30="}, ValueError),
        ({"patchType": "JSONPatch", "patch": "not base64!"}, ValueError),
    ],
)
def test_bad_or_denying_answers_raise(change: dict[str, Any], error: type[Exception]) -> None:
    sent = admission.review({"metadata": {}}, "default")
    reply = answer(sent)
    reply["response"].update(change)
    with pytest.raises(error):
        admission.apply_response({"metadata": {}}, sent, reply)


# --- nodes and scheduling ---------------------------------------------------------------------------


def test_default_nodes_have_gpu_labels_allocatable_and_taints() -> None:
    made = {node["metadata"]["name"]: node for node in nodes.nodes(nodes.DEFAULT_POOLS)}
    assert sorted(made) == ["a100-0", "cpu-0", "h100-0", "h100-1"]
    h100 = made["h100-0"]
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert h100["spec"]["taints"] == [nodes.GPU_TAINT]
    assert "nvidia.com/gpu" not in made["cpu-0"]["status"]["allocatable"] and not made["cpu-0"]["spec"]


def test_pools_from_config_and_errors() -> None:
    [pool, cpu] = nodes.pools_from_config({"pools": [{"name": "l4", "product": "NVIDIA-L4", "count": 3, "gpus": 1}]})
    assert (pool.name, pool.count, pool.gpus) == ("l4", 3, 1)
    assert cpu.gpus == 0  # added: the expiry Job needs an untainted node
    with pytest.raises(ValueError, match=r"pools\[0\]"):
        nodes.pools_from_config({"pools": [{"product": "x"}]})


@pytest.mark.parametrize(
    ("labelling", "expected"),
    [
        ("gke", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}),
        ("eks", {"k8s.amazonaws.com/accelerator": "nvidia-h100-80gb"}),
        ("karpenter", {"karpenter.k8s.aws/instance-gpu-name": "nvidia-h100-80gb"}),
        ("aks", {"kubernetes.azure.com/accelerator": "nvidia", "node.kubernetes.io/instance-type": "nvidia-h100-80gb"}),
        ("amd", {"amd.com/gpu.product-name": "nvidia-h100-80gb"}),
        ("gfd", {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
    ],
)
def test_a_pool_labelled_the_way_of_one_cloud_carries_its_labels_only(labelling, expected) -> None:
    pool = nodes.NodePool("h100", "NVIDIA-H100-80GB-HBM3", 1, 8, "nvidia-h100-80gb", labelling=labelling)
    [node] = nodes.nodes([pool])
    labels = node["metadata"]["labels"]
    assert {key: labels.get(key) for key in expected} == expected
    others = {"gke": "cloud.google.com/", "gfd": "nvidia.com/gpu.", "amd": "amd.com/", "aks": "kubernetes.azure.com/"}
    assert not [
        key for key in labels for kind, prefix in others.items() if kind != labelling and key.startswith(prefix)
    ]
    resource = "amd.com/gpu" if labelling == "amd" else "nvidia.com/gpu"
    assert node["status"]["allocatable"][resource] == "8"


def test_the_default_labelling_is_gfd_with_gke_and_an_unknown_one_is_refused() -> None:
    [pool, _] = nodes.pools_from_config({"pools": [{"name": "h100", "product": "P", "accelerator": "a", "gpus": 8}]})
    [node] = nodes.nodes([pool])
    assert {"nvidia.com/gpu.product": "P", "cloud.google.com/gke-accelerator": "a"}.items() <= node["metadata"][
        "labels"
    ].items()
    [eks, _] = nodes.pools_from_config({"pools": [{"name": "a", "product": "P", "labelling": "eks"}]})
    assert eks.labelling == "eks"
    with pytest.raises(ValueError, match=r"pools\[0\].*labelling"):
        nodes.pools_from_config({"pools": [{"name": "a", "product": "P", "labelling": "openstack"}]})


def test_scheduling_honours_node_selector_and_taints() -> None:
    cluster = nodes.nodes(nodes.DEFAULT_POOLS)
    gpu = {"nodeSelector": {"nvidia.com/gpu.present": "true"}}
    tolerant = {**gpu, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    assert jobrunner.choose_node({"spec": gpu}, cluster) is None  # the taint repels it
    assert jobrunner.choose_node({"spec": tolerant}, cluster) == "a100-0"
    assert jobrunner.choose_node({"spec": {}}, cluster) == "cpu-0"
    exact = {"tolerations": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    assert nodes.tolerates(exact["tolerations"], nodes.GPU_TAINT)
    assert not nodes.tolerates([{"key": "nvidia.com/gpu", "value": "other"}], nodes.GPU_TAINT)


# --- the Job controller -----------------------------------------------------------------------------


def job(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "uid": "u1"}, "spec": {"template": {"spec": {}}, **spec}, "status": {}}


def pod_in(phase: str | None, name: str = "j-x") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": phase} if phase else {}}


def test_a_new_job_starts_one_pod() -> None:
    verdict = jobrunner.job_verdict(job(), [], NOW)
    assert verdict["create"] and verdict["status"]["startTime"] == "2026-11-22T10:00:00Z"
    assert not jobrunner.job_verdict(job(), [pod_in("Running")], NOW)["create"]
    assert not jobrunner.job_verdict(job(suspend=True), [], NOW)["create"]


def test_success_completes_with_both_conditions() -> None:
    verdict = jobrunner.job_verdict(job(), [pod_in("Failed", "a"), pod_in("Succeeded", "b")], NOW)
    types = [c["type"] for c in verdict["status"]["conditions"]]
    assert types == ["SuccessCriteriaMet", "Complete"]
    assert (verdict["status"]["succeeded"], verdict["status"]["failed"]) == (1, 1)
    assert jobrunner.is_finished({"status": verdict["status"]})


@settings(derandomize=True, max_examples=50)
@given(limit=st.integers(0, 5), failed=st.integers(0, 7))
def test_backoff_limit(limit: int, failed: int) -> None:
    verdict = jobrunner.job_verdict(job(backoffLimit=limit), [pod_in("Failed", f"p{i}") for i in range(failed)], NOW)
    if failed > limit:
        assert not verdict["create"]
        assert verdict["status"]["conditions"][-1]["reason"] == "BackoffLimitExceeded"
    else:
        assert verdict["create"] and "conditions" not in verdict["status"]


def test_active_deadline_fails_the_job_and_kills_its_pod() -> None:
    started = {"startTime": "2026-11-22T09:59:00Z"}
    running = [pod_in("Running")]
    late = jobrunner.job_verdict(job(activeDeadlineSeconds=60) | {"status": started}, running, NOW)
    assert late["kill"] == ["j-x"] and late["status"]["conditions"][-1]["reason"] == "DeadlineExceeded"
    early = jobrunner.job_verdict(job(activeDeadlineSeconds=61) | {"status": started}, running, NOW)
    assert early["kill"] == [] and "conditions" not in early["status"]


def test_pods_are_made_from_the_template_with_the_job_controller_labels() -> None:
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}
    made = jobrunner.pod_for(job(template=template))
    assert made["metadata"]["generateName"] == "j-"
    assert made["metadata"]["labels"] == {
        "app": "x",
        "job-name": "j",
        "batch.kubernetes.io/job-name": "j",
        "controller-uid": "u1",
        "batch.kubernetes.io/controller-uid": "u1",
    }
    assert made["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert made["spec"] == template["spec"]


# --- the kubelet --------------------------------------------------------------------------------------

TABLE = [("/var/cache/compilecache", "/local/pvc"), ("/tmp", "/local/tmp")]


@pytest.mark.parametrize(
    ("value", "mapped"),
    [
        ("/var/cache/compilecache", "/local/pvc"),
        ("/var/cache/compilecache/sub/x", "/local/pvc/sub/x"),
        ("--cache-dir=/var/cache/compilecache", "--cache-dir=/local/pvc"),
        ("/var/cache/compilecachex", "/var/cache/compilecachex"),  # a prefix of a name is not the path
        ("/tmp/compilecache-report.json", "/local/tmp/compilecache-report.json"),
        ("gs://bucket/prefix", "gs://bucket/prefix"),
        ("relative/tmp", "relative/tmp"),
    ],
)
def test_container_paths_are_mapped(value: str, mapped: str) -> None:
    assert pods.map_value(value, TABLE) == mapped


def test_termination_message_and_the_log_fallback(tmp_path: Path) -> None:
    file, log = tmp_path / "term", tmp_path / "log"
    log.write_text("".join(f"line {i}\n" for i in range(200)))
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    assert pods.termination_message(fallback, file, log, 0) == ""  # succeeded: no fallback
    tail = pods.termination_message(fallback, file, log, 1)
    assert tail.endswith("line 199\n") and len(tail.encode()) <= 2048 and tail.count("\n") <= 80
    assert pods.termination_message({}, file, log, 1) == ""  # policy File: no fallback
    file.write_text("x" * 5000)
    assert pods.termination_message(fallback, file, log, 1) == "x" * 4096


def test_a_read_only_copy_refuses_writes(tmp_path: Path) -> None:
    source = tmp_path / "volume"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "entry").write_text("compiled")
    copy = tmp_path / "copy"
    pods.read_only_copy(source, copy)
    assert (copy / "sub" / "entry").read_text() == "compiled"
    for path in (copy, copy / "sub"):
        assert path.stat().st_mode & 0o777 == 0o555
    assert (copy / "sub" / "entry").stat().st_mode & 0o777 == 0o444
    if os.geteuid() == 0:
        assert (copy / "sub" / "entry").stat().st_uid == pods.NOBODY
