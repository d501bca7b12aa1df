"""The operator's /metrics, scraped over HTTP from the real operator on the API emulator.

The test plays the kubelet and the Job controller as the other operator tests do: it
writes the warm-up pods' termination messages (what ``compilecache warm
--termination-log`` writes), the expiry pod's summary and a finished training pod's
own report, then checks that the status and the scrape say what happened.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner
from prometheus_client.parser import text_string_to_metric_families

from compilecache.controller import gates, handlers, metrics, reports, status
from compilecache.jobtools.warm import termination_summary
from compilecache.local import jobrunner
from specs import cluster
from test_gates import create_pod, gate_names
from test_operator import (
    CC,
    NS,
    SUMMARY,
    create_cache,
    expiry_job,
    finish,
    finish_expiry,
    status_of,
    wait_jobs,
    wait_phase,
)

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def scrape(kube_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real operator serving metrics on a free port; yields a function that scrapes it."""
    port = _free_port()
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.3")
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    monkeypatch.setenv(metrics.ADDR_ENV, "127.0.0.1")
    monkeypatch.delenv("COMPILECACHE_WEBHOOK", raising=False)
    for node in cluster():
        kube_env.create("v1/nodes", node)
        kube_env.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")

    def get() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{metrics.PATH}", timeout=5) as answer:
            assert answer.status == 200
            text = answer.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    # The operator's metrics live in this process: an earlier test's operator in the same process
    # (its cluster gone, the cache never seen deleted) left series of a `llama` too. Start from what
    # the operator itself does when a cache goes, so the counts below are this test's alone.
    metrics.METRICS.forget(NS, "llama")
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as runner:
        yield get
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


def value(samples: dict, metric: str, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


def warm_pod(kube: Any, job: dict[str, Any], entries: int) -> None:
    """Play the kubelet: the warm-up pod of ``job`` terminated with ``compilecache warm``'s summary."""
    job_name = job["metadata"]["name"]
    pod = jobrunner.pod_for(job)  # with the template's labels, as the Job controller makes it
    pod["metadata"]["name"] = f"{job_name}-x1"
    kube.create("v1/pods", pod, NS)
    report = {
        "ok": True,
        "entries": entries,
        "bytes": entries * 2**20,
        "verify": {"hits": entries, "requests": entries},
        "targets": [
            {"name": f"step{i}", "compile_seconds": 2.0, "entries_written": ["x"], "bytes": 2**20}
            for i in range(entries)
        ],
    }
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "finishedAt": "2026-11-21T10:05:00Z",
        "message": termination_summary(report),
    }
    container = {"name": "warm", "state": {"terminated": terminated}, "ready": False, "restartCount": 0}
    kube.patch("v1/pods", pod["metadata"]["name"], {"status": {"containerStatuses": [container]}}, NS, "status")


def training_pod(kube: Any, name: str, requests: int, hits: int, reason: str) -> None:
    """Play the kubelet: a training pod of the cache that finished, its own report in its termination message."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"compilecache.dev/cache": "llama"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
    }
    kube.create("v1/pods", pod, NS)
    verdict = {
        "schema": reports.SCHEMA,
        "requests": requests,
        "hits": hits,
        "misses": requests - hits,
        "missed": [{"name": "train_step", "reason": reason}],
        "summary": f"compilecache: {hits}/{requests} compiles hit; missed: train_step ({reason})",
    }
    message = "training done\n" + json.dumps(verdict)
    terminated = {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-11-21T11:00:00Z", "message": message}
    container = {"name": "train", "state": {"terminated": terminated}, "ready": False, "restartCount": 0}
    kube.patch("v1/pods", name, {"status": {"phase": "Succeeded", "containerStatuses": [container]}}, NS, "status")


def test_status_and_metrics_after_a_gated_pod_a_warm_up_an_expiry_and_training(kube_env, scrape):
    before = kube_env.wait_for(scrape)  # once served; the metrics are the process's: other operators counted too
    create_cache(kube_env, consumers={"gateTimeout": "1s"})
    jobs = wait_jobs(kube_env, 2)
    create_pod(kube_env, "gated-0")  # times out while the cache warms
    kube_env.wait_for(lambda: gate_names(kube_env, "gated-0") == ["example.com/quota"], timeout=15)
    assert kube_env.get("v1/pods", "gated-0", NS)["metadata"]["annotations"][gates.ANNOTATION_RELEASED].startswith(
        "GateTimeout"
    )

    for entries, job in zip((2, 3), jobs.values(), strict=True):
        warm_pod(kube_env, job, entries)
        finish(kube_env, job, succeeded=True)
    expiring = kube_env.wait_for(
        lambda: (s := status_of(kube_env)).get("phase") == "Expiring" and "entries" in s.get("cache", {}) and s
    )
    # The warm reports reached the status before any expiry: kubectl get cc shows Entries and Size.
    assert sorted(pool["entries"] for pool in expiring["pools"]) == [2, 3]
    assert all(pool["verifyHits"] == pool["verifyRequests"] == pool["entries"] for pool in expiring["pools"])
    assert sorted(pool["compileSeconds"] for pool in expiring["pools"]) == [4.0, 6.0]
    assert (expiring["cache"]["entries"], expiring["cache"]["size"]) == (5, "5Mi")
    # The metrics follow the status the same pass recorded.
    kube_env.wait_for(lambda: value(scrape(), "compilecache_cache_entries", namespace=NS, name="llama") == 5)
    assert value(scrape(), "compilecache_cache_phase", namespace=NS, name="llama", phase="Expiring") == 1

    finish_expiry(kube_env, expiry_job(kube_env))
    wait_phase(kube_env, "Ready")
    training_pod(kube_env, "train-a", 26, 10, "arg 3 sharding differs")
    consumers = kube_env.wait_for(lambda: (c := status_of(kube_env).get("consumers") or {}).get("requests") and c)
    assert consumers == {
        "gated": 0,
        "released": 1,
        "hits": 10,
        "requests": 26,
        "lastMissReason": "train_step: arg 3 sharding differs",
    }

    def settled() -> dict | None:
        samples = scrape()  # the metrics follow the recorded status within a pass
        return (
            samples
            if value(samples, "compilecache_training_compile_requests_total", namespace=NS, name="llama")
            else None
        )

    samples = kube_env.wait_for(settled)
    cache = {"namespace": NS, "name": "llama"}
    for phase in status.PHASES:
        assert value(samples, "compilecache_cache_phase", **cache, phase=phase) == (phase == "Ready")
    assert value(samples, "compilecache_cache_entries", **cache) == SUMMARY["after"]["entries"]
    assert value(samples, "compilecache_cache_bytes", **cache) == SUMMARY["after"]["bytes"]
    assert value(samples, "compilecache_warmup_last_duration_seconds", **cache) == 300  # 10:00 → 10:05
    assert value(samples, "compilecache_warmup_last_finished_timestamp_seconds", **cache) == 1795255500
    assert value(samples, "compilecache_warmup_last_compile_seconds", **cache) == 10.0
    for rule, count in SUMMARY["deleted"].items():
        assert value(samples, "compilecache_expiry_deleted_entries_total", **cache, rule=rule) == count
    assert value(samples, "compilecache_gate_timeouts_total", **cache) == 1
    assert value(samples, "compilecache_consumers_gated_pods", **cache) == 0
    assert value(samples, "compilecache_training_compile_requests_total", **cache) == 26
    assert value(samples, "compilecache_training_cache_hits_total", **cache) == 10
    assert (value(samples, "compilecache_reconcile_duration_seconds_count", result="success") or 0) > 3
    # Every call counted by verb and resource: the Jobs it created, and no list of Jobs (passes read them from
    # the watch-fed indexes).
    requests = "compilecache_api_requests_total"
    created = value(samples, requests, verb="create", resource="jobs") or 0
    assert created - (value(before, requests, verb="create", resource="jobs") or 0) == 3  # 2 + expiry
    assert value(samples, requests, verb="list", resource="jobs") == value(
        before, requests, verb="list", resource="jobs"
    )

    # Passes keep seeing the same pods: nothing counts twice.
    kube_env.patch(CC, "llama", {"metadata": {"annotations": {"touch": "1"}}}, NS)
    kube_env.wait_for(
        lambda: (
            (value(scrape(), "compilecache_reconcile_duration_seconds_count", result="success") or 0)
            > value(samples, "compilecache_reconcile_duration_seconds_count", result="success") + 3
        )
    )
    again = scrape()
    assert value(again, "compilecache_training_compile_requests_total", **cache) == 26
    assert value(again, "compilecache_gate_timeouts_total", **cache) == 1
    assert value(again, "compilecache_expiry_deleted_entries_total", **cache, rule="maxAge") == 1

    # A deleted cache's series go.
    kube_env.delete(CC, "llama", NS)

    def forgotten() -> dict | None:
        samples = scrape()
        return None if any(dict(labels).get("name") == "llama" for _, labels in samples) else samples

    gone = kube_env.wait_for(forgotten)
    assert value(gone, "compilecache_cache_entries", **cache) is None
