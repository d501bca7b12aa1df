"""Gate release: the pure decisions, then the real operator releasing pods on the API emulator.

The emulator runs no admission, so the tests create pods as the webhook leaves them
(labelled, gated), and play the Job controller with ``finish()``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from kopf.testing import KopfRunner

from compilecache.controller import admission, gates, handlers, status
from compilecache.controller.admission import GATE
from compilecache.controller.api import Consumers
from specs import cluster
from test_operator import NS, create_cache, status_of, wait_jobs, warm_and_expire

NOW = datetime.datetime(2026, 11, 21, 10, 0, 0, tzinfo=datetime.UTC)
OTHER_GATE = {"name": "example.com/quota"}


def gated_pod(
    name: str = "train-0", cache: str = "llama", created: str = "2026-11-21T10:00:00Z", **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"compilecache.dev/cache": cache}, "creationTimestamp": created, **meta},
        "spec": {
            "schedulingGates": [OTHER_GATE, {"name": GATE}],
            "containers": [{"name": "t", "image": "registry.example/trainer:1.2"}],
        },  # the cache's image (specs.cache_spec)
    }


# --- pure ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("consumers", "phase", "age", "reason"),
    [
        (Consumers(), status.READY, 0, gates.CACHE_READY),
        # Settled with some pools failed: the pods start on what warmed rather than wait out the timeout.
        (Consumers(), status.DEGRADED, 0, gates.CACHE_DEGRADED),
        (Consumers(), status.WARMING, 0, None),
        (Consumers(), status.EXPIRING, 0, None),
        (Consumers(), status.FAILED, 0, None),
        (Consumers(), None, 1799, None),
        (Consumers(), status.PENDING, 1800, gates.GATE_TIMEOUT),
        (Consumers(gate_timeout_seconds=1), status.WARMING, 1, gates.GATE_TIMEOUT),
        (Consumers(gate=False), status.WARMING, 0, gates.GATE_DISABLED),
        (None, None, 0, gates.CACHE_DELETED),
    ],
)
def test_reason_to_release(consumers: Consumers | None, phase: str | None, age: int, reason: str | None) -> None:
    now = NOW + datetime.timedelta(seconds=age)
    assert gates.reason_to_release(gated_pod(), consumers, phase=phase, now=now) == reason


def test_ungated_or_untimed_pods() -> None:
    free = gated_pod()
    free["spec"]["schedulingGates"] = [OTHER_GATE]
    assert gates.reason_to_release(free, None, phase=status.READY, now=NOW) is None
    untimed = gated_pod(created="")
    assert gates.reason_to_release(untimed, Consumers(), phase=status.WARMING, now=NOW) == gates.GATE_TIMEOUT


def test_release_patch_removes_only_our_gate_and_records_why() -> None:
    pod = gated_pod(annotations={"keep": "me"})
    released = jsonpatch.apply_patch(pod, gates.release_patch(pod, gates.CACHE_READY, NOW))
    assert released["spec"]["schedulingGates"] == [OTHER_GATE]
    assert released["metadata"]["annotations"] == {
        "keep": "me",
        gates.ANNOTATION_RELEASED: "CacheReady 2026-11-21T10:00:00Z",
    }
    alone = gated_pod()
    alone["spec"]["schedulingGates"] = [{"name": GATE}]
    released = jsonpatch.apply_patch(alone, gates.release_patch(alone, gates.GATE_TIMEOUT, NOW))
    assert "schedulingGates" not in released["spec"]
    assert released["metadata"]["annotations"][gates.ANNOTATION_RELEASED].startswith("GateTimeout ")


def test_release_patch_fails_when_the_gates_changed_meanwhile() -> None:
    pod = gated_pod()
    ops = gates.release_patch(pod, gates.CACHE_READY, NOW)
    pod["spec"]["schedulingGates"].append({"name": "example.com/new"})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(pod, ops)


def test_plan_and_counts() -> None:
    pods = [gated_pod("a"), gated_pod("b", created="2026-11-21T09:00:00Z"), gated_pod("c")]
    pods[2]["spec"]["schedulingGates"] = []
    pods[2]["metadata"]["annotations"] = {gates.ANNOTATION_RELEASED: "CacheReady 2026-11-21T09:59:00Z"}
    releases = gates.plan(pods, Consumers(), phase=status.WARMING, now=NOW)
    assert [(r.pod, r.reason) for r in releases] == [("b", gates.GATE_TIMEOUT)]
    assert gates.counts(pods) == {"gated": 2, "released": 1}


# --- the operator on the API emulator -----------------------------------------------------------------

PODS = "v1/pods"


@pytest.fixture
def operator(kube_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    """The real operator, resyncing every 0.3 s so that short gate timeouts are seen quickly."""
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.3")
    monkeypatch.delenv("COMPILECACHE_WEBHOOK", raising=False)
    for node in cluster():
        kube_env.create("v1/nodes", node)
        kube_env.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as runner:
        yield runner
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


def create_pod(kube: Any, name: str, cache: str = "llama") -> dict[str, Any]:
    body = gated_pod(name, cache)
    del body["metadata"]["creationTimestamp"]  # the server sets it
    created: dict[str, Any] = kube.create(PODS, body, NS)
    return created


def gate_names(kube: Any, name: str) -> list[str]:
    pod = kube.get(PODS, name, NS)
    return [gate["name"] for gate in pod["spec"].get("schedulingGates") or []]


def consumers(kube: Any) -> dict[str, int]:
    return status_of(kube).get("consumers") or {}


def events(kube: Any, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", NS) if e["reason"] == reason]


@pytest.mark.slow
@pytest.mark.emulator
def test_gated_pod_is_released_when_the_cache_turns_ready(kube_env: Any, operator: KopfRunner) -> None:
    create_cache(kube_env)
    jobs = wait_jobs(kube_env, 2)
    create_pod(kube_env, "train-0")
    kube_env.wait_for(lambda: consumers(kube_env) == {"gated": 1, "released": 0})
    assert gate_names(kube_env, "train-0") == ["example.com/quota", GATE]
    assert len(jobs) == 2
    warm_and_expire(kube_env)  # Warming → Expiring → Ready
    kube_env.wait_for(lambda: gate_names(kube_env, "train-0") == ["example.com/quota"])  # the other gate stays
    pod = kube_env.get(PODS, "train-0", NS)
    assert pod["metadata"]["annotations"][gates.ANNOTATION_RELEASED].startswith("CacheReady ")
    kube_env.wait_for(lambda: consumers(kube_env) == {"gated": 0, "released": 1})
    assert events(kube_env, gates.GATE_TIMEOUT) == []

    # A pod gated just as the cache turned Ready (the webhook saw the old phase) goes at once.
    create_pod(kube_env, "train-1")
    kube_env.wait_for(lambda: gate_names(kube_env, "train-1") == ["example.com/quota"])
    kube_env.wait_for(lambda: consumers(kube_env) == {"gated": 0, "released": 2})


@pytest.mark.slow
@pytest.mark.emulator
def test_gate_timeout_releases_with_a_warning_and_other_caches_wait(kube_env: Any, operator: KopfRunner) -> None:
    create_cache(kube_env, consumers={"gateTimeout": "1s"})
    create_cache(kube_env, name="slow", storage={"pvc": {"claimName": "other"}})  # default 30m
    wait_jobs(kube_env, 2)
    create_pod(kube_env, "train-0")
    create_pod(kube_env, "waits", cache="slow")
    kube_env.wait_for(lambda: gate_names(kube_env, "train-0") == ["example.com/quota"], timeout=15)
    pod = kube_env.get(PODS, "train-0", NS)
    assert pod["metadata"]["annotations"][gates.ANNOTATION_RELEASED].startswith("GateTimeout ")
    warnings = kube_env.wait_for(lambda: events(kube_env, gates.GATE_TIMEOUT))
    assert {e["involvedObject"]["kind"] for e in warnings} == {"Pod", "CompileCache"}
    assert all(e["type"] == "Warning" for e in warnings)
    assert status_of(kube_env)["phase"] == "Warming"  # released although not Ready
    kube_env.wait_for(lambda: consumers(kube_env) == {"gated": 0, "released": 1})
    assert gate_names(kube_env, "waits") == ["example.com/quota", GATE]


@pytest.mark.slow
@pytest.mark.emulator
def test_deleting_the_cache_releases_its_pods(kube_env: Any, operator: KopfRunner) -> None:
    create_cache(kube_env)
    wait_jobs(kube_env, 2)
    create_pod(kube_env, "train-0")
    kube_env.wait_for(lambda: consumers(kube_env).get("gated") == 1)
    kube_env.delete("compilecache.dev/v1alpha1/compilecaches", "llama", NS)
    kube_env.wait_for(lambda: gate_names(kube_env, "train-0") == ["example.com/quota"])
    pod = kube_env.get(PODS, "train-0", NS)
    assert pod["metadata"]["annotations"][gates.ANNOTATION_RELEASED].startswith("CacheDeleted ")


@pytest.mark.slow
@pytest.mark.emulator
def test_a_timeout_release_counts_only_where_its_patch_took(kube_env: Any) -> None:
    """Two paths may release one pod (a pass, the pod's own event): the one whose patch fails (422) counted none."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from compilecache.controller.kube import Client
    from compilecache.controller.metrics import METRICS

    def timeouts() -> float:
        for family in text_string_to_metric_families(generate_latest(METRICS.registry).decode()):
            for sample in family.samples:
                if sample.name == "compilecache_gate_timeouts_total" and sample.labels == {
                    "namespace": NS,
                    "name": "t",
                }:
                    return float(sample.value)
        return 0.0

    raced, waiting = create_pod(kube_env, "raced", cache="t"), create_pod(kube_env, "waiting", cache="t")
    client = Client.from_environment()
    stale = [raced, waiting]  # what a pass listed before another path released "raced"
    gates.apply(client, NS, "t", None, Consumers(), gates.plan([raced], Consumers(), phase=status.READY, now=NOW), [])
    before = timeouts()
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)  # the server stamped the pods
    late = gates.plan(stale, Consumers(gate_timeout_seconds=60), phase=status.WARMING, now=later)
    assert {r.reason for r in late} == {gates.GATE_TIMEOUT} and len(late) == 2
    gates.apply(client, NS, "t", None, Consumers(), late, stale)
    assert timeouts() - before == 1  # only "waiting": "raced" had been released as CacheReady
    assert gate_names(kube_env, "waiting") == [OTHER_GATE["name"]]


@pytest.mark.emulator
@pytest.mark.parametrize(
    ("served", "released"),
    [
        (["team-*"], {"team-a", "team-b"}),
        (["!team-*"], {"other", NS}),  # kopf: a leading exclusion implies "*" before it
        (["team-a", "oth*"], {"team-a", "other"}),
        (["team-a, !team-a"], set()),
        ([None], {"team-a", "team-b", "other", NS}),
    ],
)
def test_the_watchdog_serves_kopfs_namespace_patterns(
    kube_env: Any, served: list[str | None], released: set[str]
) -> None:
    # A replica started with `-n 'team-*'` must still release the pods of team-a when no replica is
    # active: the watchdog matches kopf's patterns against the namespaces there are, as kopf does.
    from compilecache.controller import watchdog
    from compilecache.controller.kube import Client

    spaces = ["team-a", "team-b", "other", NS]
    for namespace in spaces:
        kube_env.create("v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        body = gated_pod("train-0", cache="gone")  # its cache is gone: due at once
        del body["metadata"]["creationTimestamp"]
        kube_env.create(PODS, body, namespace)
    client = Client.from_environment()
    try:
        watchdog.release_overdue(client, served)
    finally:
        client.close()

    def gated(namespace: str) -> bool:
        pod = kube_env.get(PODS, "train-0", namespace)
        return GATE in [gate["name"] for gate in pod["spec"].get("schedulingGates") or []]

    assert {namespace for namespace in spaces if not gated(namespace)} == released


def test_print_snippet_reads_the_cache_from_the_cluster(kube_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # `compilecache env NAME -n NS` (no operator needed: it only reads the CompileCache).
    created = create_cache(kube_env)
    assert admission.print_snippet("llama", NS) == 0
    assert capsys.readouterr().out == admission.format_snippet(created)
    assert admission.print_snippet("nope", NS) == 1
    assert "CompileCache default/nope not found" in capsys.readouterr().err
