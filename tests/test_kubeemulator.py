"""Tests of the Kubernetes API emulator (``compilecache/local/apiserver.py``), over real HTTP.

The canary tests assert that stock kmock still lacks each behaviour the subclass adds; when one
fails, upstream kmock gained the feature and the subclass can drop its part.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import kopf
import kubernetes
import pytest
from kopf.testing import KopfRunner

from compilecache.local.apiserver import merge_patch, parse_label_selector
from conftest import RESOURCES, KubeClient, KubeError, running_emulator

pytestmark = pytest.mark.emulator

CC = "compilecache.dev/v1alpha1/compilecaches"
JOBS = "batch/v1/jobs"
PODS = "v1/pods"
NODES = "v1/nodes"


def cc_body(name: str, **extra: Any) -> dict[str, Any]:
    """A minimal CompileCache manifest."""
    return {
        "apiVersion": "compilecache.dev/v1alpha1",
        "kind": "CompileCache",
        "metadata": {"name": name},
        **extra,
    }


def owned_by(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """An ownerReferences list pointing at ``obj``."""
    meta = obj["metadata"]
    return [{"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"]}]


def watch(kube: KubeClient, resource: str, namespace: str | None = None, **params: str) -> list[dict[str, Any]]:
    """Watch with a server-side timeout and return all the events the stream carried."""
    query = urllib.parse.urlencode({"watch": "true", "timeoutSeconds": "0.3", **params})
    url = f"{kube.url}{kube.path(resource, namespace)}?{query}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as rsp:
        return [json.loads(line) for line in rsp.read().splitlines() if line.strip()]


# --- canaries: stock kmock still lacks what the subclass adds ------------------------------------


@pytest.fixture
def stock(tmp_path: Path) -> Iterator[KubeClient]:
    """Stock ``kmock.KubernetesEmulator`` with the same resources, behind the same client."""
    with running_emulator(tmp_path, kmock.KubernetesEmulator()) as runner:
        yield KubeClient(runner)


def test_canary_stock_create_fills_no_metadata_and_answers_200(stock: KubeClient) -> None:
    status, obj = stock.call("POST", stock.path(CC, "ns1"), cc_body("c1"))
    assert status == 200, "upstream kmock now answers 201 on create: drop it from local/apiserver"
    for field in ("resourceVersion", "uid", "creationTimestamp", "generation", "namespace"):
        assert field not in obj["metadata"], f"upstream kmock now fills {field}: drop it from local/apiserver"
    status, obj = stock.call("POST", stock.path(PODS, "ns1"), {"metadata": {"name": "p"}})
    assert "kind" not in obj, "upstream kmock now fills apiVersion/kind: drop it from local/apiserver"


def test_canary_stock_ignores_generate_name(stock: KubeClient) -> None:
    _, obj = stock.call("POST", stock.path(CC, "ns1"), {"metadata": {"generateName": "c-"}})
    assert not obj["metadata"].get("name"), "upstream kmock now honours generateName: drop it from local/apiserver"


def test_canary_stock_ignores_label_selector(stock: KubeClient) -> None:
    stock.create(CC, {"metadata": {"name": "a", "labels": {"x": "1"}}}, "ns1")
    stock.create(CC, {"metadata": {"name": "b", "labels": {"x": "2"}}}, "ns1")
    names = {o["metadata"]["name"] for o in stock.list(CC, "ns1", label_selector="x=1")}
    assert names == {"a", "b"}, "upstream kmock now filters by labelSelector: drop it from local/apiserver"


def test_canary_stock_list_has_no_kind_nor_resource_version(stock: KubeClient) -> None:
    answer = stock.request("GET", stock.path(CC, "ns1"))
    assert "kind" not in answer, "upstream kmock now fills the list kind: drop it from local/apiserver"
    assert not answer["metadata"]["resourceVersion"].isdigit(), "upstream kmock now versions lists"


def test_canary_stock_does_not_isolate_status(stock: KubeClient) -> None:
    stock.create(CC, cc_body("c1"), "ns1")
    obj = stock.patch(CC, "c1", {"status": {"phase": "Ready"}}, "ns1")
    assert obj.get("status") == {"phase": "Ready"}, "upstream kmock now isolates status: drop it from local/apiserver"


def test_canary_stock_has_no_owner_gc(stock: KubeClient) -> None:
    stock.create(CC, {"metadata": {"name": "c1", "uid": "u1"}}, "ns1")
    stock.create(JOBS, {"metadata": {"name": "j1", "ownerReferences": [{"uid": "u1", "name": "c1"}]}}, "ns1")
    stock.delete(CC, "c1", "ns1")
    assert stock.get(JOBS, "j1", "ns1") is not None, "upstream kmock now collects garbage: drop it from local/apiserver"


def test_canary_stock_json_patch_test_failure_is_not_422(stock: KubeClient) -> None:
    stock.create(CC, cc_body("c1"), "ns1")
    ops = [{"op": "test", "path": "/metadata/name", "value": "other"}]
    status, _ = stock.call("PATCH", stock.path(CC, "ns1", "c1"), ops, "application/json-patch+json")
    assert status != 422, "upstream kmock now answers 422 on a failed JSON-patch test: drop it from local/apiserver"


def test_canary_stock_does_not_route_put(stock: KubeClient) -> None:
    stock.create(CC, cc_body("c1"), "ns1")
    status, _ = stock.call("PUT", stock.path(CC, "ns1", "c1"), cc_body("c1"))
    assert status == 404, "upstream kmock now serves PUT: drop it from local/apiserver"


def test_canary_stock_cannot_list_namespaces(stock: KubeClient) -> None:
    status, _ = stock.call("GET", "/api/v1/namespaces")
    assert status == 500, "upstream kmock now parses /api/v1/namespaces: drop it from local/apiserver"


# --- Services (multi-host warm-ups pair an Indexed Job with a headless Service) --------------------

SVC = "v1/services"


def test_a_headless_service_is_stored_defaulted_listed_and_deleted(kube: KubeClient) -> None:
    body = {"metadata": {"name": "warm-h100-2h"}, "spec": {"clusterIP": "None", "selector": {"app": "x"}}}
    status, created = kube.call("POST", kube.path(SVC, "ns1"), body)
    assert status == 201, created
    assert (created["kind"], created["apiVersion"]) == ("Service", "v1")
    spec = created["spec"]
    assert (spec["clusterIP"], spec["clusterIPs"], spec["type"]) == ("None", ["None"], "ClusterIP")
    assert "ports" not in spec  # a headless Service needs no ports
    assert kube.get(SVC, "warm-h100-2h", "ns1") == created
    assert [s["metadata"]["name"] for s in kube.list(SVC, "ns1")] == ["warm-h100-2h"]
    assert kube.list(SVC, "ns2") == []
    kube.delete(SVC, "warm-h100-2h", "ns1")
    assert kube.get(SVC, "warm-h100-2h", "ns1") is None


def test_a_cluster_ip_service_gets_an_address_and_keeps_it(kube: KubeClient) -> None:
    body = {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    created = kube.create(SVC, body, "ns1")
    ip = created["spec"]["clusterIP"]
    assert ip.startswith("10.96.") and created["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    replaced = {**created, "spec": {"ports": [{"port": 81}]}}  # a PUT that leaves the address out keeps it
    assert kube.request("PUT", kube.path(SVC, "ns1", "web"), replaced)["spec"]["clusterIP"] == ip
    with pytest.raises(KubeError) as changed:
        kube.patch(SVC, "web", {"spec": {"clusterIP": "None"}}, "ns1")
    assert changed.value.status == 422 and "may not change once set" in changed.value.body["message"]


@pytest.mark.parametrize(
    ("name", "spec", "field"),
    [
        ("Warm", {"clusterIP": "None"}, "metadata.name"),  # upper case: not a DNS-1035 label
        ("2h-warm", {"clusterIP": "None"}, "metadata.name"),  # a DNS-1035 label starts with a letter
        ("w" * 64, {"clusterIP": "None"}, "metadata.name"),
        ("web", {}, "spec.ports"),  # only a headless Service may have no ports
        ("web", {"clusterIP": "None", "type": "NodePort", "ports": [{"port": 80}]}, "spec.clusterIP"),
        ("web", {"clusterIP": "not-an-ip", "ports": [{"port": 80}]}, "spec.clusterIP"),
        ("web", {"ports": [{"port": 80}, {"port": 81}]}, "spec.ports[0].name"),
        ("web", {"ports": [{"port": 0}]}, "spec.ports[0].port"),
    ],
)
def test_invalid_services_are_refused_as_the_api_server_does(
    kube: KubeClient, name: str, spec: dict[str, Any], field: str
) -> None:
    status, answer = kube.call("POST", kube.path(SVC, "ns1"), {"metadata": {"name": name}, "spec": spec})
    assert (status, answer["reason"]) == (422, "Invalid"), answer
    assert answer["message"].startswith(f'Service "{name}" is invalid: ')
    assert field in {cause["field"] for cause in answer["details"]["causes"]}
    assert kube.list(SVC, "ns1") == []


def test_a_pod_hostname_must_be_a_dns_label(kube: KubeClient) -> None:
    long_job = "j" * 62
    status, answer = kube.call(
        "POST", kube.path("v1/pods", "ns1"), {"metadata": {"name": "p"}, "spec": {"hostname": f"{long_job}-10"}}
    )
    assert status == 422 and "spec.hostname" in answer["message"] and "no more than 63" in answer["message"]
    ok = {"metadata": {"name": "p"}, "spec": {"hostname": "warm-0", "subdomain": "warm"}}
    assert kube.call("POST", kube.path("v1/pods", "ns1"), ok)[0] == 201


# --- create ---------------------------------------------------------------------------------------


def test_create_fills_server_managed_fields(kube: KubeClient) -> None:
    status, obj = kube.call("POST", kube.path(CC, "ns1"), {"metadata": {"name": "c1"}, "spec": {"a": 1}})
    assert status == 201
    meta = obj["metadata"]
    assert uuid.UUID(meta["uid"]).version == 4
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1 and meta["namespace"] == "ns1" and meta["resourceVersion"].isdigit()
    assert obj["apiVersion"] == "compilecache.dev/v1alpha1" and obj["kind"] == "CompileCache"
    node = kube.create(NODES, {"metadata": {"name": "n1"}})
    assert node["apiVersion"] == "v1" and node["kind"] == "Node" and "namespace" not in node["metadata"]
    assert int(node["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])  # one global counter


def test_create_generate_name(kube: KubeClient) -> None:
    names = {kube.create(JOBS, {"metadata": {"generateName": "warm-"}}, "ns1")["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(re.fullmatch(r"warm-[a-z0-9]{5}", n) for n in names)
    with pytest.raises(KubeError) as e:
        kube.create(JOBS, {"metadata": {}}, "ns1")
    assert e.value.status == 422


def test_create_conflict_and_recreate(kube: KubeClient) -> None:
    first = kube.create(CC, cc_body("c1"), "ns1")
    with pytest.raises(KubeError) as e:
        kube.create(CC, cc_body("c1"), "ns1")
    assert e.value.status == 409 and e.value.body["reason"] == "AlreadyExists"
    kube.create(CC, cc_body("c1"), "ns2")  # the same name in another namespace is another object
    kube.delete(CC, "c1", "ns1")
    again = kube.create(CC, cc_body("c1"), "ns1")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]


def test_create_scope_mismatches_are_rejected(kube: KubeClient) -> None:
    assert kube.call("POST", kube.path(CC), cc_body("c1"))[0] == 404  # namespaced, no namespace
    assert kube.call("POST", kube.path(NODES, "ns1"), {"metadata": {"name": "n"}})[0] == 404
    body = {"metadata": {"name": "c1", "namespace": "other"}}
    assert kube.call("POST", kube.path(CC, "ns1"), body)[0] == 400
    assert kube.call("POST", kube.path("v1/unknowns", "ns1"), body)[0] == 404


def test_create_ignores_status_only_with_a_status_subresource(kube: KubeClient) -> None:
    assert "status" not in kube.create(CC, cc_body("c1", status={"phase": "Ready"}), "ns1")
    event = kube.create("v1/events", {"metadata": {"name": "e1"}, "status": {"kept": True}}, "ns1")
    assert event["status"] == {"kept": True}


# --- update ---------------------------------------------------------------------------------------


def test_merge_patch_semantics_and_versions(kube: KubeClient) -> None:
    obj = kube.create(CC, cc_body("c1", spec={"a": 1, "b": {"c": 2}, "l": [1, 2]}), "ns1")
    rv = int(obj["metadata"]["resourceVersion"])
    obj = kube.patch(CC, "c1", {"spec": {"a": None, "b": {"d": 3}, "l": [3]}}, "ns1")
    assert obj["spec"] == {"b": {"c": 2, "d": 3}, "l": [3]}
    assert obj["metadata"]["generation"] == 2 and int(obj["metadata"]["resourceVersion"]) > rv
    rv = int(obj["metadata"]["resourceVersion"])
    obj = kube.patch(CC, "c1", {"metadata": {"labels": {"x": "y"}}}, "ns1")
    assert obj["metadata"]["generation"] == 2 and int(obj["metadata"]["resourceVersion"]) > rv
    same = kube.patch(CC, "c1", {"metadata": {"labels": {"x": "y"}}}, "ns1")
    assert same["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]  # no-op: no write
    kept = kube.patch(CC, "c1", {"metadata": {"uid": "forged", "generation": 9}}, "ns1")
    assert kept["metadata"]["uid"] == obj["metadata"]["uid"] and kept["metadata"]["generation"] == 2
    assert kube.get(CC, "c1", "ns1") == same
    with pytest.raises(KubeError) as e:
        kube.patch(CC, "missing", {"spec": {}}, "ns1")
    assert e.value.status == 404


def test_merge_patch_with_a_stale_resource_version_conflicts(kube: KubeClient) -> None:
    obj = kube.create(CC, cc_body("c1"), "ns1")
    kube.patch(CC, "c1", {"spec": {"a": 1}}, "ns1")
    with pytest.raises(KubeError) as e:
        kube.patch(CC, "c1", {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}}, "ns1")
    assert e.value.status == 409


def test_strategic_merge_patch_is_a_merge_patch(kube: KubeClient) -> None:
    kube.create(PODS, {"metadata": {"name": "p"}, "spec": {"x": 1}}, "ns1")
    path = kube.path(PODS, "ns1", "p")
    obj = kube.request("PATCH", path, {"spec": {"y": 2}}, "application/strategic-merge-patch+json")
    assert obj["spec"] == {"x": 1, "y": 2}
    assert kube.call("PATCH", path, {"spec": {}}, "application/apply-patch+yaml")[0] == 415


def test_json_patch_and_its_test_op(kube: KubeClient) -> None:
    obj = kube.create(CC, cc_body("c1"), "ns1")
    rv = obj["metadata"]["resourceVersion"]
    path = kube.path(CC, "ns1", "c1")
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
    ]
    patched = kube.request("PATCH", path, ops, "application/json-patch+json")
    assert patched["metadata"]["finalizers"] == ["x/y"]
    status, answer = kube.call("PATCH", path, ops, "application/json-patch+json")  # rv is stale now
    assert status == 422 and answer["kind"] == "Status"
    bad = [{"op": "remove", "path": "/spec/nothing"}]
    assert kube.call("PATCH", path, bad, "application/json-patch+json")[0] == 422


def test_put_replaces_with_optimistic_concurrency(kube: KubeClient) -> None:
    obj = kube.create(CC, cc_body("c1", spec={"a": 1, "b": 2}), "ns1")
    path = kube.path(CC, "ns1", "c1")
    body = {
        "metadata": {"name": "c1", "resourceVersion": obj["metadata"]["resourceVersion"]},
        "spec": {"a": 5},
    }
    replaced = kube.request("PUT", path, body)
    assert replaced["spec"] == {"a": 5} and replaced["metadata"]["generation"] == 2
    assert replaced["metadata"]["uid"] == obj["metadata"]["uid"]
    assert kube.call("PUT", path, body)[0] == 409  # the resourceVersion is stale now
    assert kube.call("PUT", path, {"metadata": {"name": "c1"}, "spec": {}})[0] == 422
    assert kube.call("PUT", kube.path(CC, "ns1", "nope"), body)[0] == 404


def test_status_subresource_isolation(kube: KubeClient) -> None:
    kube.create(CC, cc_body("c1", spec={"a": 1}), "ns1")
    obj = kube.patch(CC, "c1", {"spec": {"a": 2}, "status": {"phase": "Ready"}}, "ns1")
    assert obj["spec"] == {"a": 2} and "status" not in obj
    obj = kube.patch(CC, "c1", {"spec": {"a": 3}, "status": {"phase": "Ready"}}, "ns1", subresource="status")
    assert obj["spec"] == {"a": 2} and obj["status"] == {"phase": "Ready"}
    assert obj["metadata"]["generation"] == 2  # status writes do not bump the generation
    assert kube.request("GET", kube.path(CC, "ns1", "c1", "status"))["status"] == {"phase": "Ready"}
    assert kube.call("PATCH", kube.path(CC, "ns1", "c1", "scale"), {}, "application/merge-patch+json")[0] == 404
    # Without a status subresource, status is an ordinary field and /status does not exist.
    kube.create("v1/serviceaccounts", {"metadata": {"name": "sa"}}, "ns1")
    assert kube.patch("v1/serviceaccounts", "sa", {"status": {"x": 1}}, "ns1")["status"] == {"x": 1}
    status, _ = kube.call(
        "PATCH", kube.path("v1/serviceaccounts", "ns1", "sa", "status"), {}, "application/merge-patch+json"
    )
    assert status == 404


# --- delete ---------------------------------------------------------------------------------------


def test_delete_honours_finalizers(kube: KubeClient) -> None:
    kube.create(CC, {"metadata": {"name": "c1", "finalizers": ["x/y"]}}, "ns1")
    answer = kube.delete(CC, "c1", "ns1")
    assert answer["metadata"]["deletionTimestamp"] and answer["metadata"]["generation"] == 2
    assert kube.get(CC, "c1", "ns1") is not None
    with pytest.raises(KubeError) as e:
        kube.patch(CC, "c1", {"metadata": {"finalizers": ["x/y", "new/one"]}}, "ns1")
    assert e.value.status == 422
    kube.patch(CC, "c1", {"metadata": {"finalizers": None}}, "ns1")
    assert kube.get(CC, "c1", "ns1") is None


def test_delete_without_finalizers_answers_a_status(kube: KubeClient) -> None:
    obj = kube.create(CC, cc_body("c1"), "ns1")
    answer = kube.delete(CC, "c1", "ns1")
    assert answer["kind"] == "Status" and answer["status"] == "Success"
    assert answer["details"]["uid"] == obj["metadata"]["uid"]
    assert kube.get(CC, "c1", "ns1") is None
    with pytest.raises(KubeError) as e:
        kube.delete(CC, "c1", "ns1")
    assert e.value.status == 404


def test_owner_gc_cascades(kube: KubeClient) -> None:
    cache = kube.create(CC, cc_body("c1"), "ns1")
    job = kube.create(JOBS, {"metadata": {"name": "j1", "ownerReferences": owned_by(cache)}}, "ns1")
    pod = kube.create(PODS, {"metadata": {"name": "p1", "ownerReferences": owned_by(job)}}, "ns1")
    blocked = kube.create(
        PODS, {"metadata": {"name": "p2", "finalizers": ["x/y"], "ownerReferences": owned_by(job)}}, "ns1"
    )
    other = kube.create(CC, cc_body("c2"), "ns1")
    shared = kube.create(
        JOBS, {"metadata": {"name": "j2", "ownerReferences": owned_by(cache) + owned_by(other)}}, "ns1"
    )
    kube.delete(CC, "c1", "ns1")
    assert kube.get(JOBS, "j1", "ns1") is None and kube.get(PODS, "p1", "ns1") is None
    assert kube.get(PODS, "p2", "ns1")["metadata"]["deletionTimestamp"]  # type: ignore[index]
    assert kube.get(JOBS, "j2", "ns1") is not None  # another owner still lives
    assert pod and blocked and shared


def test_owner_gc_orphan_policy(kube: KubeClient) -> None:
    cache = kube.create(CC, cc_body("c1"), "ns1")
    kube.create(JOBS, {"metadata": {"name": "j1", "ownerReferences": owned_by(cache)}}, "ns1")
    kube.request("DELETE", kube.path(CC, "ns1", "c1"), {"propagationPolicy": "Orphan"})
    job = kube.get(JOBS, "j1", "ns1")
    assert job is not None and "ownerReferences" not in job["metadata"]


# --- list and watch -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gpu", {"a", "b"}),
        ("tier==gpu,pool=h100", {"a"}),
        ("tier!=gpu", {"c", "d"}),
        ("pool in (h100, a100)", {"a", "b"}),
        ("pool notin (h100)", {"b", "c", "d"}),
        ("pool", {"a", "b"}),
        ("!pool", {"c", "d"}),
        ("tier=gpu,!pool", set()),
    ],
)
def test_label_selectors(kube: KubeClient, selector: str, expected: set[str]) -> None:
    labels = {
        "a": {"tier": "gpu", "pool": "h100"},
        "b": {"tier": "gpu", "pool": "a100"},
        "c": {"tier": "cpu"},
        "d": {},
    }
    for name, node_labels in labels.items():
        kube.create(NODES, {"metadata": {"name": name, "labels": node_labels}})
    assert {n["metadata"]["name"] for n in kube.list(NODES, label_selector=selector)} == expected


def test_label_selector_parser_rejects_garbage(kube: KubeClient) -> None:
    assert parse_label_selector("") == []
    assert kube.call("GET", kube.path(NODES), params={"labelSelector": "a in (b"})[0] == 400


def test_field_selectors_and_namespaces(kube: KubeClient) -> None:
    for ns, name in [("ns1", "a"), ("ns1", "b"), ("ns2", "a")]:
        kube.create(CC, cc_body(name), ns)
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in kube.list(CC)] == [
        ("ns1", "a"),
        ("ns1", "b"),
        ("ns2", "a"),
    ]

    def names(params: dict[str, str], namespace: str | None = None) -> list[str]:
        answer = kube.request("GET", kube.path(CC, namespace), params=params)
        return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in answer["items"]]

    assert names({"fieldSelector": "metadata.name=a"}) == ["ns1/a", "ns2/a"]
    assert names({"fieldSelector": "metadata.name!=a"}, "ns1") == ["ns1/b"]
    assert names({"fieldSelector": "metadata.namespace==ns2"}) == ["ns2/a"]
    assert kube.call("GET", kube.path(CC), params={"fieldSelector": "spec.x=1"})[0] == 400


def test_list_envelope(kube: KubeClient) -> None:
    kube.create(JOBS, {"metadata": {"name": "j1"}}, "ns1")
    answer = kube.request("GET", kube.path(JOBS, "ns1"))
    assert answer["kind"] == "JobList" and answer["apiVersion"] == "batch/v1"
    assert answer["metadata"]["resourceVersion"] == str(kube.emulator.resource_version)  # type: ignore[attr-defined]


def test_watch_from_a_resource_version(kube: KubeClient) -> None:
    kube.create(CC, cc_body("old"), "ns1")
    rv = kube.request("GET", kube.path(CC))["metadata"]["resourceVersion"]
    kube.create(CC, cc_body("new"), "ns1")
    kube.patch(CC, "new", {"spec": {"a": 1}}, "ns1")
    kube.delete(CC, "new", "ns1")
    events = watch(kube, CC, resourceVersion=rv)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"),
        ("MODIFIED", "new"),
        ("DELETED", "new"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)


def test_watch_without_a_version_lists_then_bookmarks(kube: KubeClient) -> None:
    kube.create(CC, cc_body("c1"), "ns1")
    kube.create(CC, cc_body("c2"), "ns2")
    events = watch(kube, CC, "ns1", sendInitialEvents="true")
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "c1"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_watch_with_a_label_selector_sees_objects_enter_and_leave(kube: KubeClient) -> None:
    rv = kube.create(PODS, {"metadata": {"name": "p", "labels": {"cc": "no"}}}, "ns1")["metadata"]["resourceVersion"]
    kube.patch(PODS, "p", {"metadata": {"labels": {"cc": "yes"}}}, "ns1")
    kube.patch(PODS, "p", {"spec": {"a": 1}}, "ns1")
    kube.patch(PODS, "p", {"metadata": {"labels": {"cc": "no"}}}, "ns1")
    events = watch(kube, PODS, resourceVersion=rv, labelSelector="cc=yes")
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]


def test_namespaces_paths(kube: KubeClient) -> None:
    kube.create("v1/namespaces", {"metadata": {"name": "team-a", "labels": {"gpu": "yes"}}})
    kube.create("v1/namespaces", {"metadata": {"name": "team-b"}})
    assert [n["metadata"]["name"] for n in kube.list("v1/namespaces", label_selector="gpu")] == ["team-a"]
    assert kube.get("v1/namespaces", "team-a")["kind"] == "Namespace"  # type: ignore[index]
    kube.delete("v1/namespaces", "team-b")
    assert kube.get("v1/namespaces", "team-b") is None


def test_pure_merge_patch() -> None:
    assert merge_patch({"a": 1, "b": {"c": 1}}, {"a": {"x": 1}, "b": None, "n": {"k": None}}) == {
        "a": {"x": 1},
        "n": {},
    }


# --- the operator's real clients --------------------------------------------------------------------


def test_kubernetes_client(kube_env: KubeClient) -> None:
    kube_env.create(NODES, {"metadata": {"name": "gpu1", "labels": {"nvidia.com/gpu.product": "H100"}}})
    kube_env.create(NODES, {"metadata": {"name": "cpu1"}})
    kube_env.create(CC, cc_body("c1"), "ns1")
    api = kubernetes.config.new_client_from_config(config_file=str(kube_env.kubeconfig))
    batch, core = kubernetes.client.BatchV1Api(api), kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)

    job = kubernetes.client.V1Job(
        metadata=kubernetes.client.V1ObjectMeta(name="warm-1", labels={"app": "warm"}),
        spec=kubernetes.client.V1JobSpec(
            template=kubernetes.client.V1PodTemplateSpec(
                spec=kubernetes.client.V1PodSpec(
                    restart_policy="Never", containers=[kubernetes.client.V1Container(name="w", image="i")]
                )
            )
        ),
    )
    created = batch.create_namespaced_job("ns1", job)
    assert created.metadata is not None
    assert created.metadata.uid and created.metadata.resource_version
    jobs = batch.list_namespaced_job("ns1", label_selector="app=warm").items
    assert [j.metadata.name for j in jobs if j.metadata] == ["warm-1"]
    nodes = core.list_node(label_selector="nvidia.com/gpu.product")
    assert [n.metadata.name for n in nodes.items if n.metadata] == ["gpu1"]
    patched: Any = custom.patch_namespaced_custom_object_status(
        "compilecache.dev", "v1alpha1", "ns1", "compilecaches", "c1", {"status": {"phase": "Warming"}}
    )
    assert patched["status"] == {"phase": "Warming"}
    with pytest.raises(kubernetes.client.ApiException) as e:
        batch.create_namespaced_job("ns1", job)
    assert e.value.status == 409
    batch.delete_namespaced_job("warm-1", "ns1", propagation_policy="Background")
    assert kube_env.get(JOBS, "warm-1", "ns1") is None
    # $KUBECONFIG leads to the same emulator for code that loads the default kubeconfig.
    assert kubernetes.config.new_client_from_config().configuration.host == kube_env.url


@pytest.mark.slow
def test_a_real_kopf_operator(kube_env: KubeClient) -> None:
    registry = kopf.OperatorRegistry()
    deleted: list[str] = []

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 10
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="test.compilecache.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="test.compilecache.dev")

    # An own registry lacks kopf's default login handlers: register the default one explicitly.
    kopf.on.login(registry=registry)(kopf.login_via_client)

    @kopf.on.create("compilecache.dev", "v1alpha1", "compilecaches", registry=registry)
    def created(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
        patch.status["message"] = f"Warming-{spec['x']}"  # a status the CRD's schema admits
        kopf.info(body, reason="Warming", message="started")  # kopf posts it with generateName

    @kopf.on.delete("compilecache.dev", "v1alpha1", "compilecaches", registry=registry)
    def deleting(name: str, **_: Any) -> None:
        deleted.append(name)

    with KopfRunner(["run", "--standalone", "-A"], registry=registry, timeout=10) as runner:
        kube_env.create(CC, cc_body("c1", spec={"x": 5}), "ns1")
        obj: Any = kube_env.wait_for(lambda: (o := kube_env.get(CC, "c1", "ns1")) and "status" in o and o)
        assert obj["status"]["message"] == "Warming-5"
        assert obj["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        kube_env.delete(CC, "c1", "ns1")
        kube_env.wait_for(lambda: kube_env.get(CC, "c1", "ns1") is None)
        assert deleted == ["c1"]
        events = kube_env.wait_for(lambda: [e for e in kube_env.list("v1/events", "ns1") if e["reason"] == "Warming"])
        assert events[0]["involvedObject"]["name"] == "c1"
    assert runner.exception is None


def test_registered_resources_are_discoverable(kube: KubeClient) -> None:
    groups = {g["name"] for g in kube.request("GET", "/apis")["groups"]}
    assert {"batch", "compilecache.dev"} <= groups
    found = kube.request("GET", "/apis/compilecache.dev/v1alpha1")["resources"]
    assert {r["name"] for r in found} == {"compilecaches", "compilecaches/status"}
    assert {r["kind"] for r in found} == {"CompileCache"} and found[0]["shortNames"] == ["cc"]
    # With Mutating- and ValidatingWebhookConfigurations (admission), Services (multi-host DNS), kopf's
    # peerings (HA), PodTemplates (what a templateRef may name, watched into an index) and Cluster
    # Autoscaler's ProvisioningRequests (the local autoscaler answers them), and Kueue's five kinds (the
    # local Kueue stand-in answers them).
    assert len(RESOURCES) == 20
    kueue = kube.request("GET", "/apis/kueue.x-k8s.io/v1beta2")["resources"]
    assert {(r["name"], r["namespaced"]) for r in kueue if "/" not in r["name"]} == {
        ("workloads", True),
        ("localqueues", True),
        ("clusterqueues", False),
        ("admissionchecks", False),
        ("workloadpriorityclasses", False),
    }
    provreqs = kube.request("GET", "/apis/autoscaling.x-k8s.io/v1")["resources"]
    assert {(r["name"], r["namespaced"]) for r in provreqs} == {
        ("provisioningrequests", True),
        ("provisioningrequests/status", True),
    }
    peerings = kube.request("GET", "/apis/kopf.dev/v1")["resources"]
    assert {(r["name"], r["namespaced"]) for r in peerings} == {("clusterkopfpeerings", False), ("kopfpeerings", True)}


def test_served_requests_are_forgotten_unless_kept(tmp_path: Path) -> None:
    """kmock scans every kept request on each new one: a long run (the demo, e2e) must not keep them."""
    from compilecache.local.apiserver import KubeEmulator

    for keep, expected in ((False, 0), (True, 20)):
        with running_emulator(tmp_path, KubeEmulator(keep_requests=keep)) as runner:
            client = KubeClient(runner)
            for _ in range(20):
                client.list(PODS, "ns1")
            assert len(runner.emulator._requests) == expected
