"""Hostile reports against the real operator on the API emulator: the status never freezes.

The emulator refuses a CompileCache status that the CRD's schema refuses (422: an integer past
int64) and a body that is not JSON (400: ``Infinity``), as kube-apiserver does
(``compilecache.local.validation``). A training pod that reports ``requests: 10**30``, a warm-up
whose script wrote ``compileSeconds: 1e999`` and an expiry summary with ``bytes: 10**30`` made every
status patch fail, so the cache stayed where it was; now each report is refused, named, and the
cache goes on to Ready. The test plays the kubelet and the Job controller, as tests/test_operator.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from kopf.testing import KopfRunner

import test_gates
from compilecache.api import bounds
from compilecache.controller import metrics, reports, status
from compilecache.controller.jobs import LABEL_WARMUP_OF as WARMUP_OF
from compilecache.jobtools.warm import termination_summary
from compilecache.local.client import KubeError
from test_operator import CC, NS, SUMMARY, create_cache, expiry_job, finish, finish_expiry, wait_jobs, wait_phase

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


# The real operator on the emulator's 5 GPU nodes, resyncing every 0.3 s: test_gates' fixture.
operator = test_gates.operator


def finished_pod(kube: Any, name: str, labels: dict[str, str], container: str, message: str) -> None:
    """Play the kubelet: a pod whose one container terminated with ``message``."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}}
    pod["spec"] = {"containers": [{"name": container, "image": "registry.example.com/i:1"}]}
    kube.create("v1/pods", pod, NS)
    terminated = {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-11-21T10:05:00Z", "message": message}
    state = {"name": container, "state": {"terminated": terminated}, "ready": False, "restartCount": 0}
    kube.patch("v1/pods", name, {"status": {"phase": "Succeeded", "containerStatuses": [state]}}, NS, "status")


def test_the_emulator_refuses_what_kube_apiserver_refuses_in_a_status(kube: Any) -> None:
    """The stand-in must refuse as the real server does, or the test below could not fail."""
    kube.create(CC, {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": "c"}}, NS)
    with pytest.raises(KubeError) as refused:
        kube.patch(CC, "c", {"status": {"consumers": {"requests": 10**30}}}, NS, "status")
    assert refused.value.status == 422
    assert refused.value.body["message"] == (
        'CompileCache.compilecache.dev "c" is invalid: status.consumers.requests: Invalid value: '
        "1000000000000000000000000000000 is out of the int64 range"
    )
    body = {"status": {"pools": [{"name": "a", "compileSeconds": math.inf}]}}  # json.dumps writes Infinity
    code, answer = kube.call("PATCH", kube.path(CC, NS, "c", "status"), body, "application/merge-patch+json")
    assert (code, answer["reason"]) == (400, "BadRequest"), answer
    kube.patch(CC, "c", {"status": {"consumers": {"requests": 2**63 - 1}}}, NS, "status")  # int64 itself is fine


def test_reports_past_int64_or_not_finite_are_refused_named_and_the_cache_still_gets_ready(
    kube_env: Any, operator: KopfRunner
) -> None:
    create_cache(kube_env)
    jobs = list(wait_jobs(kube_env, 2).values())
    labels = {"compilecache.dev/cache": "llama"}
    verdict = {"schema": reports.SCHEMA, "hits": 3, "summary": "compilecache: 3/4 compiles hit"}
    finished_pod(kube_env, "train-good", labels, "train", json.dumps(verdict | {"requests": 4}))
    finished_pod(kube_env, "train-evil", labels, "train", "done\n" + json.dumps(verdict | {"requests": 10**30}))

    evil, good = (job["metadata"]["name"] for job in jobs)
    summary = '{"schema": "compilecache.dev/warm/v1", "ok": true, "entries": 2, "compileSeconds": 1e999}'
    finished_pod(kube_env, f"{evil}-x1", {"job-name": evil, WARMUP_OF: "llama"}, "warm", summary)
    report = {"ok": True, "entries": 3, "bytes": 3000, "targets": []}
    finished_pod(kube_env, f"{good}-x1", {"job-name": good, WARMUP_OF: "llama"}, "warm", termination_summary(report))
    for job in jobs:
        finish(kube_env, job, succeeded=True)
    wait_phase(kube_env, "Expiring")
    finish_expiry(
        kube_env, expiry_job(kube_env), message=json.dumps(SUMMARY | {"after": {"entries": 3, "bytes": 10**30}})
    )
    ready = wait_phase(kube_env, "Ready")

    assert bounds.violations(ready) == []
    pools = {pool["job"]: pool for pool in ready["pools"]}
    assert pools[evil]["reason"] == status.REPORT_REFUSED and "entries" not in pools[evil]
    assert "compileSeconds: inf is not a finite number of seconds" in pools[evil]["message"]
    assert pools[good]["entries"] == 3
    expired = next(c for c in ready["conditions"] if c["type"] == "Expired")
    assert (
        expired["reason"] == status.REPORT_REFUSED
        and "after.bytes: 1000000000000000000000000000000" in expired["message"]
    )
    consumers = kube_env.wait_for(
        lambda: (
            (wait_phase(kube_env, "Ready").get("consumers") or {}).get("requests")
            and wait_phase(kube_env, "Ready")["consumers"]
        )
    )
    assert (consumers["requests"], consumers["hits"]) == (4, 3)  # the evil pod's report is not counted

    def refused() -> list[dict[str, Any]]:
        return [e for e in kube_env.list("v1/events", NS) if e["reason"] == status.REPORT_REFUSED]

    events = kube_env.wait_for(lambda: len(refused()) == 3 and refused())
    messages = sorted(event["message"] for event in events)
    assert messages[0].startswith("expiry: warmed and expired; its summary was refused")
    assert messages[1].startswith("pool ") and "compileSeconds" in messages[1]
    assert messages[2].startswith("training pod train-evil: its report was refused and is not counted")
    assert "requests: 1000000000000000000000000000000 is out of the int64 range" in messages[2]
    # Later passes (every 0.3 s) post no second Event for the same pod, pool or expiry.
    done = passes()
    kube_env.wait_for(lambda: passes() >= done + 4, timeout=15)
    assert len(refused()) == 3


def passes() -> float:
    """Passes the operator in this process finished without an error, so far."""
    count = metrics.METRICS.registry.get_sample_value(
        "compilecache_reconcile_duration_seconds_count", {"result": "success"}
    )
    return count or 0.0
