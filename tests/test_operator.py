"""The operator end to end: its real kopf client against the API emulator over HTTP.

Nothing runs controllers in the emulator: the tests play the Job controller by
writing Job status themselves, and the emulator's ownerReference GC plays the
garbage collector.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

import podsecurity
from compilecache.controller import expiryjob, handlers, policy
from compilecache.controller.api import parse_spec
from compilecache.frameworks.jax.env import jax_cache_env
from compilecache.local import jobrunner
from specs import GPU, PRODUCT, cache_spec, cluster

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

CC = "compilecache.dev/v1alpha1/compilecaches"
JOBS = "batch/v1/jobs"
NS = "default"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"


@contextlib.contextmanager
def running_operator(monkeypatch: pytest.MonkeyPatch, resync_seconds: float) -> Iterator[KopfRunner]:
    """The real operator (kopf, our handlers) in this process, watching every namespace; checked at its end."""
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, str(resync_seconds))
    runner = KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30)
    with runner:
        yield runner
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


@pytest.fixture
def operator(kube_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    """The real operator, passing each cache every 0.5 s besides its events."""
    with running_operator(monkeypatch, 0.5) as runner:
        yield runner


@pytest.fixture
def nodes(kube_env: Any) -> list[dict[str, Any]]:
    """5 GPU nodes in 2 products and 1 CPU node, with their allocatable GPUs in their status."""
    created = []
    for node in cluster():
        kube_env.create("v1/nodes", node)
        name = node["metadata"]["name"]
        created.append(kube_env.patch("v1/nodes", name, {"status": node["status"]}, subresource="status"))
    return created


def create_cache(kube: Any, name: str = "llama", **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": name}}
    created: dict[str, Any] = kube.create(CC, body | {"spec": cache_spec(**spec)}, NS)
    return created


def jobs_of(kube: Any, name: str = "llama") -> dict[str, dict[str, Any]]:
    return {
        job["metadata"]["labels"]["compilecache.dev/pool"]: job
        for job in kube.list(JOBS, NS, f"compilecache.dev/cache={name}")
    }


def wait_jobs(kube: Any, count: int, name: str = "llama") -> dict[str, dict[str, Any]]:
    return kube.wait_for(lambda: len(jobs_of(kube, name)) == count and jobs_of(kube, name))


def status_of(kube: Any, name: str = "llama") -> dict[str, Any]:
    return (kube.get(CC, name, NS) or {}).get("status") or {}


def wait_phase(kube: Any, phase: str, name: str = "llama") -> dict[str, Any]:
    return kube.wait_for(lambda: status_of(kube, name).get("phase") == phase and status_of(kube, name))


def finish(kube: Any, job: dict[str, Any], *, succeeded: bool, reason: str = "BackoffLimitExceeded") -> None:
    """Play the Job controller: mark the Job complete or failed."""
    condition = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-21T10:05:00Z"}
    if not succeeded:
        condition |= {
            "type": "Failed",
            "reason": reason,
            "message": "Job has reached the specified backoff limit",
        }
    job_status = {"startTime": "2026-11-21T10:00:00Z", "conditions": [condition]}
    if succeeded:
        job_status |= {"succeeded": 1, "completionTime": "2026-11-21T10:05:00Z"}
    else:
        job_status |= {"failed": 3}
    kube.patch(JOBS, job["metadata"]["name"], {"status": job_status}, NS, subresource="status")


EXPIRY = "compilecache.dev/expiry-of"
SUMMARY = {
    "schema": "compilecache.dev/expiry/v1",
    "ok": True,
    "at": "2026-11-21T10:07:00Z",
    "before": {"entries": 5, "bytes": 5 * 2**20},
    "after": {"entries": 3, "bytes": 3 * 2**20},
    "deleted": {"integrity": 1, "keepVersions": 0, "maxAge": 1, "maxSize": 0},
    "versions": [{"jax": "0.10.2", "jaxlib": "0.10.2", "backend": "gpu", "deviceKind": "H100", "entries": 3}],
}


def expiry_job(kube: Any, name: str = "llama", *, other_than: str = "") -> dict[str, Any]:
    """Wait for the cache's expiry Job (a new one when ``other_than`` names the last)."""
    found = lambda: [j for j in kube.list(JOBS, NS, f"{EXPIRY}={name}") if j["metadata"]["name"] != other_than]  # noqa: E731
    [job] = kube.wait_for(found)
    return job


def finish_expiry(kube: Any, job: dict[str, Any], *, succeeded: bool = True, message: str | None = None) -> None:
    """Play the Job controller and the kubelet: a pod whose container terminated with ``message``, then the Job."""
    job_name = job["metadata"]["name"]
    pod = jobrunner.pod_for(job)  # with the template's labels, as the Job controller makes it
    pod["metadata"]["name"] = f"{job_name}-x1"
    kube.create("v1/pods", pod, NS)
    terminated = {
        "exitCode": 0 if succeeded else 2,
        "reason": "Completed" if succeeded else "Error",
        "finishedAt": "2026-11-21T10:07:00Z",
        "message": json.dumps(SUMMARY) if message is None else message,
    }
    container = {"name": "expire", "state": {"terminated": terminated}, "ready": False, "restartCount": 0}
    kube.patch("v1/pods", pod["metadata"]["name"], {"status": {"containerStatuses": [container]}}, NS, "status")
    finish(kube, job, succeeded=succeeded)


def warm_and_expire(kube: Any, name: str = "llama") -> dict[str, Any]:
    """Finish every warm-up Job, see Expiring, finish the expiry Job; return the Ready status."""
    for job in jobs_of(kube, name).values():
        finish(kube, job, succeeded=True)
    wait_phase(kube, "Expiring", name)
    finish_expiry(kube, expiry_job(kube, name))
    return wait_phase(kube, "Ready", name)


def event_reasons(kube: Any) -> list[str]:
    return [event["reason"] for event in kube.list("v1/events", NS)]


def test_two_gpu_products_get_two_jobs_with_the_right_pods(kube_env, nodes, operator):
    cache = create_cache(kube_env)
    jobs = wait_jobs(kube_env, 2)
    assert set(jobs) == {"nvidia-h100-80gb-hbm3", "nvidia-a100-sxm4-40gb"}

    for pool, product, gpus in [("nvidia-h100-80gb-hbm3", H100, 8), ("nvidia-a100-sxm4-40gb", A100, 4)]:
        job = jobs[pool]
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", PRODUCT: product}
        assert container["resources"]["limits"][GPU] == gpus
        assert {"name": "cache", "persistentVolumeClaim": {"claimName": "jax-cache"}} in pod["volumes"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert {key: env[key] for key in jax_cache_env("/var/cache/compilecache")} == jax_cache_env(
            "/var/cache/compilecache"
        )
        assert job["metadata"]["ownerReferences"][0]["uid"] == cache["metadata"]["uid"]

    claim = kube_env.get("v1/persistentvolumeclaims", "jax-cache", NS)
    assert claim is not None and "ownerReferences" not in claim["metadata"]

    status = wait_phase(kube_env, "Warming")
    assert status["poolsReady"] == "0/2"
    assert {pool["name"]: pool["state"] for pool in status["pools"]} == {
        "nvidia-h100-80gb-hbm3": "Pending",
        "nvidia-a100-sxm4-40gb": "Pending",
    }
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]}["StorageReady"] == "True"


def test_jobs_succeed_then_ready(kube_env, nodes, operator):
    create_cache(kube_env)
    jobs = wait_jobs(kube_env, 2)
    kube_env.patch(JOBS, jobs["nvidia-h100-80gb-hbm3"]["metadata"]["name"], {"status": {"active": 1}}, NS, "status")
    kube_env.wait_for(
        lambda: {p["name"]: p["state"] for p in status_of(kube_env)["pools"]}["nvidia-h100-80gb-hbm3"] == "Running"
    )
    status = warm_and_expire(kube_env)
    assert status["poolsReady"] == "2/2"
    assert all(pool["state"] == "Succeeded" and pool["finishedAt"] for pool in status["pools"])
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"]
    reasons = kube_env.wait_for(lambda: "Ready" in event_reasons(kube_env) and event_reasons(kube_env))
    assert {"Warming", "PoolSucceeded", "PoolRunning"} <= set(reasons)


def test_one_pool_fails_degraded_then_all_fail_failed(kube_env, nodes, operator):
    create_cache(kube_env)
    jobs = wait_jobs(kube_env, 2)
    finish(kube_env, jobs["nvidia-h100-80gb-hbm3"], succeeded=True)
    finish(kube_env, jobs["nvidia-a100-sxm4-40gb"], succeeded=False)
    # A Degraded cache still prunes and checks what it holds: expiry runs over the pool that warmed.
    expiring = wait_phase(kube_env, "Expiring")
    assert "nvidia-a100-sxm4-40gb" in expiring["message"]
    job = expiry_job(kube_env)
    h100_job = jobs["nvidia-h100-80gb-hbm3"]["metadata"]["name"]
    assert (
        job["metadata"]["name"]
        == expiryjob.expiry_job(kube_env.get(CC, "llama", NS), parse_spec(cache_spec()), [h100_job])["metadata"]["name"]
    )
    finish_expiry(kube_env, job)
    status = wait_phase(kube_env, "Degraded")
    failed = next(pool for pool in status["pools"] if pool["state"] == "Failed")
    assert (failed["name"], failed["reason"]) == ("nvidia-a100-sxm4-40gb", "BackoffLimitExceeded")
    assert "nvidia-a100-sxm4-40gb" in status["message"] and "warmed and expired" in status["message"]
    expired = next(c for c in status["conditions"] if c["type"] == "Expired")
    assert (expired["status"], expired["reason"]) == ("True", "Expired")
    assert status["cache"]["entries"] == 3 and status["cache"]["lastExpired"]
    warnings = [e for e in kube_env.list("v1/events", NS) if e["type"] == "Warning"]
    assert {"PoolFailed", "Degraded"} <= {e["reason"] for e in warnings}
    time.sleep(1.5)  # resyncs pass: it stays Degraded, with one expiry Job
    assert status_of(kube_env)["phase"] == "Degraded" and len(kube_env.list(JOBS, NS, f"{EXPIRY}=llama")) == 1


def test_all_pools_fail(kube_env, nodes, operator):
    create_cache(kube_env)
    for job in wait_jobs(kube_env, 2).values():
        finish(kube_env, job, succeeded=False, reason="DeadlineExceeded")
    status = wait_phase(kube_env, "Failed")
    assert all(pool["reason"] == "DeadlineExceeded" for pool in status["pools"])


def test_restart_mid_warm_creates_no_duplicate(kube_env, nodes, monkeypatch):
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.5")
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as first:
        create_cache(kube_env)
        before = wait_jobs(kube_env, 2)
        wait_phase(kube_env, "Warming")
    assert first.exception is None, first.output

    # While the operator is away, one Job finishes.
    finish(kube_env, before["nvidia-h100-80gb-hbm3"], succeeded=True)
    with KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30) as second:
        kube_env.wait_for(
            lambda: (
                {p["name"]: p["state"] for p in status_of(kube_env)["pools"]}["nvidia-h100-80gb-hbm3"] == "Succeeded"
            )
        )
        finish(kube_env, before["nvidia-a100-sxm4-40gb"], succeeded=True)
        wait_phase(kube_env, "Expiring")
        finish_expiry(kube_env, expiry_job(kube_env))
        wait_phase(kube_env, "Ready")
    assert second.exception is None, second.output
    after = kube_env.list(JOBS, NS, "compilecache.dev/cache")
    assert sorted(job["metadata"]["name"] for job in after) == sorted(j["metadata"]["name"] for j in before.values())


def test_finished_job_removed_by_ttl_is_not_rerun(kube_env, nodes, operator):
    create_cache(kube_env)
    jobs = wait_jobs(kube_env, 2)
    warm_and_expire(kube_env)
    kube_env.delete(JOBS, jobs["nvidia-h100-80gb-hbm3"]["metadata"]["name"], NS)  # as ttlSecondsAfterFinished does
    kube_env.wait_for(lambda: len(jobs_of(kube_env)) == 1)
    # Three resync periods pass; the record of the finished pool stands and no Job is recreated.
    time.sleep(1.5)
    assert len(jobs_of(kube_env)) == 1
    assert status_of(kube_env)["phase"] == "Ready"


BAD_SPECS = [
    (
        "both storages",
        {"storage": {"pvc": {"claimName": "c"}, "gcs": {"bucket": "my-caches"}}},
        "spec.storage",
    ),
    ("no storage", {"storage": {}}, "spec.storage"),
    ("no workloads", {"warmup": cache_spec()["warmup"] | {"workloads": []}}, "spec.warmup.workloads"),
    ("empty image", {"warmup": cache_spec()["warmup"] | {"image": ""}}, "spec.warmup.image"),
    (
        "bad size",
        {"storage": {"pvc": {"claimName": "c", "create": {"size": "200GB"}}}},
        "spec.storage.pvc.create.size",
    ),
    ("bad duration", {"lifecycle": {"maxAge": "7days"}}, "spec.lifecycle.maxAge"),
    (
        "unknown pool",
        {"warmup": cache_spec()["warmup"] | {"workloads": [{"name": "w", "entrypoint": "m:f", "pools": ["tpu"]}]}},
        "spec.warmup.workloads[0].pools[0]",
    ),
]


@pytest.mark.parametrize(("case", "bad", "field"), BAD_SPECS, ids=[case for case, _, _ in BAD_SPECS])
def test_bad_input_fails_with_the_field_named_and_fixing_recovers(kube_env, nodes, operator, case, bad, field):
    create_cache(kube_env, **copy.deepcopy(bad))
    status = wait_phase(kube_env, "Failed")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith(f"{field}: "), ready["message"]
    assert field in status["message"]
    warning = kube_env.wait_for(
        lambda: [e for e in kube_env.list("v1/events", NS) if e["reason"] == "InvalidSpec" and e["type"] == "Warning"]
    )
    assert field in warning[0]["message"]
    assert jobs_of(kube_env) == {}

    fix = [{"op": "replace", "path": "/spec", "value": cache_spec()}]  # as `kubectl apply` of a fixed file
    kube_env.request("PATCH", kube_env.path(CC, NS, "llama"), fix, "application/json-patch+json")
    wait_jobs(kube_env, 2)
    status = wait_phase(kube_env, "Warming")
    assert status["observedGeneration"] == 2


def test_compile_change_replaces_jobs_and_lifecycle_change_does_not(kube_env, nodes, operator):
    create_cache(kube_env)
    old = {job["metadata"]["name"] for job in wait_jobs(kube_env, 2).values()}

    kube_env.patch(CC, "llama", {"spec": {"lifecycle": {"maxAge": "3d"}}}, NS)
    kube_env.wait_for(lambda: status_of(kube_env).get("observedGeneration") == 2)
    assert {job["metadata"]["name"] for job in jobs_of(kube_env).values()} == old

    warmup = cache_spec()["warmup"] | {"image": "registry.example/trainer:1.3"}
    kube_env.patch(CC, "llama", {"spec": {"warmup": warmup}}, NS)
    new = kube_env.wait_for(
        lambda: (names := {job["metadata"]["name"] for job in jobs_of(kube_env).values()}) and not names & old and names
    )
    assert len(new) == 2
    images = {job["spec"]["template"]["spec"]["containers"][0]["image"] for job in jobs_of(kube_env).values()}
    assert images == {"registry.example/trainer:1.3"}


def test_delete_removes_jobs_and_keeps_the_claim(kube_env, nodes, operator):
    create_cache(kube_env)
    wait_jobs(kube_env, 2)
    kube_env.delete(CC, "llama", NS)
    kube_env.wait_for(lambda: kube_env.get(CC, "llama", NS) is None)
    kube_env.wait_for(lambda: jobs_of(kube_env) == {})
    assert kube_env.get("v1/persistentvolumeclaims", "jax-cache", NS) is not None


def test_missing_claim_waits_then_proceeds(kube_env, nodes, operator):
    create_cache(kube_env, storage={"pvc": {"claimName": "brought"}})
    status = wait_phase(kube_env, "Pending")
    storage = next(c for c in status["conditions"] if c["type"] == "StorageReady")
    assert (storage["status"], storage["reason"]) == ("False", "ClaimNotFound")
    assert jobs_of(kube_env) == {}
    # A claim the user brings opts in (policy.CLAIM_OPT_IN_LABEL); test_foreign_claim_... has one that does not.
    meta = {"name": "brought", "labels": {policy.CLAIM_OPT_IN_LABEL: "true"}}
    kube_env.create("v1/persistentvolumeclaims", {"metadata": meta, "spec": {"accessModes": ["ReadWriteMany"]}}, NS)
    wait_jobs(kube_env, 2)  # the resync notices the claim
    wait_phase(kube_env, "Warming")


def test_foreign_claim_fails_the_cache_until_it_opts_in(kube_env, nodes, operator):
    """Naming an existing claim that was not made for the cache mounts nothing (issue 19: payroll-db-data)."""
    claim = {"metadata": {"name": "payroll-db-data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    kube_env.create("v1/persistentvolumeclaims", claim, NS)
    create_cache(kube_env, storage={"pvc": {"claimName": "payroll-db-data", "create": {"size": "1Gi"}}})
    status = wait_phase(kube_env, "Failed")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ClaimNotOptedIn")
    assert ready["message"].startswith("spec.storage.pvc.claimName: PersistentVolumeClaim payroll-db-data exists")
    assert jobs_of(kube_env) == {}
    labels = {"labels": {policy.CLAIM_OPT_IN_LABEL: "true"}}
    kube_env.patch("v1/persistentvolumeclaims", "payroll-db-data", {"metadata": labels}, NS)
    wait_jobs(kube_env, 2)  # opted in: the next pass uses it


def test_a_cache_the_policy_refuses_fails_naming_the_field_without_admission(kube_env, nodes, operator):
    """The emulator runs no validating webhook: the controller's own check (the default policy) stops it."""
    warmup = cache_spec()["warmup"] | {"image": "attacker.example/anything:latest", "serviceAccountName": "admin"}
    warmup["discover"] = warmup["discover"] | {"tolerations": [{"key": "node-role.kubernetes.io/control-plane"}]}
    create_cache(kube_env, warmup=warmup)
    status = wait_phase(kube_env, "Failed")
    [ready] = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "PolicyViolation")
    for field in ("spec.warmup.image:", "spec.warmup.serviceAccountName:", "spec.warmup.discover.tolerations[0]:"):
        assert field in ready["message"], ready["message"]
    assert jobs_of(kube_env) == {} and kube_env.get("v1/persistentvolumeclaims", "jax-cache", NS) is None
    # Fixed (a merge patch: null removes): the same cache warms.
    fixed = {"image": cache_spec()["warmup"]["image"], "serviceAccountName": None, "discover": {"tolerations": None}}
    kube_env.patch(CC, "llama", {"spec": {"warmup": fixed}}, NS)
    wait_jobs(kube_env, 2)


def test_the_jobs_the_operator_creates_pass_the_restricted_pod_security_standard(kube_env, nodes, operator):
    warmup = cache_spec()["warmup"]
    warmup["workloads"] = [{"name": "exact", "script": "train.py", "steps": 2}, *warmup["workloads"]]
    create_cache(kube_env, warmup=warmup)
    jobs = wait_jobs(kube_env, 2)
    warm_and_expire(kube_env)
    created = [*jobs.values(), expiry_job(kube_env, "llama")]
    assert any(job["spec"]["template"]["spec"].get("initContainers") for job in created)
    for job in created:
        assert podsecurity.violations(job["spec"]["template"]["spec"]) == [], job["metadata"]["name"]


def test_pool_without_nodes_is_no_nodes_not_a_failure(kube_env, nodes, operator):
    warmup = cache_spec()["warmup"]
    warmup["pools"] = [{"name": "b200", "nodeSelector": {PRODUCT: "NVIDIA-B200"}}]
    create_cache(kube_env, warmup=warmup)
    jobs = wait_jobs(kube_env, 2)
    status = kube_env.wait_for(lambda: len(status_of(kube_env).get("pools", [])) == 3 and status_of(kube_env))
    assert {p["name"]: p["state"] for p in status["pools"]}["b200"] == "NoNodes"
    assert len(jobs) == 2
    status = warm_and_expire(kube_env)
    assert status["poolsReady"] == "2/2"


def test_warming_expiring_ready_reports_the_cache(kube_env, nodes, operator):
    create_cache(kube_env, lifecycle={"maxAge": "7d", "maxSize": "100Gi", "keepVersions": 2})
    for job in wait_jobs(kube_env, 2).values():
        finish(kube_env, job, succeeded=True)
    expiring = wait_phase(kube_env, "Expiring")
    assert expiring["poolsReady"] == "2/2"
    job = expiry_job(kube_env)
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == [
        "compilecache", "expire", "--cache-dir", "/var/cache/compilecache", "--max-age", "604800s",
        "--max-size", str(100 * 2**30), "--keep-versions", "2", "--verify", "--termination-log", "/dev/termination-log",
    ]  # fmt: skip
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    claim = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert not claim["persistentVolumeClaim"].get("readOnly")  # expiry deletes: read-write
    assert "compilecache.dev/cache" not in job["spec"]["template"]["metadata"]["labels"]  # never gated

    finish_expiry(kube_env, job)
    status = wait_phase(kube_env, "Ready")
    cache = status["cache"]
    assert (cache["entries"], cache["bytes"], cache["size"]) == (3, 3 * 2**20, "3Mi")
    assert cache["versions"] == SUMMARY["versions"]
    assert cache["lastWarmed"] == "2026-11-21T10:05:00Z" and cache["lastExpired"]
    expired = next(c for c in status["conditions"] if c["type"] == "Expired")
    assert expired["status"] == "True" and "1 by integrity" in expired["message"]

    # Only the lifecycle changes: no new warm-up, a new expiry; the old expiry Job goes. The
    # published entries stay good meanwhile: the cache stays Ready (training is not gated).
    kube_env.patch(CC, "llama", {"spec": {"lifecycle": {"maxAge": "1d"}}}, NS)
    again = expiry_job(kube_env, other_than=job["metadata"]["name"])
    assert "86400s" in again["spec"]["template"]["spec"]["containers"][0]["command"]
    refreshing = kube_env.wait_for(
        lambda: "refreshing" in status_of(kube_env).get("message", "") and status_of(kube_env)
    )
    assert refreshing["phase"] == "Ready" and "expir" in refreshing["message"]
    assert next(c for c in refreshing["conditions"] if c["type"] == "Ready")["status"] == "True"
    kube_env.wait_for(lambda: len(kube_env.list(JOBS, NS, f"{EXPIRY}=llama")) == 1)
    assert len(jobs_of(kube_env)) == 2
    finish_expiry(kube_env, again)
    kube_env.wait_for(lambda: "refreshing" not in status_of(kube_env)["message"])
    assert status_of(kube_env)["phase"] == "Ready"


def test_expiry_failure_leaves_the_cache_not_ready_with_the_reason(kube_env, nodes, operator):
    create_cache(kube_env)
    for job in wait_jobs(kube_env, 2).values():
        finish(kube_env, job, succeeded=True)
    error = {"schema": "compilecache.dev/expiry/v1", "ok": False, "error": "cache dir /c is not a directory"}
    finish_expiry(kube_env, expiry_job(kube_env), succeeded=False, message=json.dumps(error))
    status = wait_phase(kube_env, "Failed")
    assert "expiry failed: cache dir /c is not a directory" in status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert (conditions["Expired"]["status"], conditions["Expired"]["reason"]) == ("False", "ExpiryFailed")
    assert conditions["PoolsWarmed"]["status"] == "True"
    time.sleep(1.5)  # resyncs pass: it stays failed, no new expiry Job
    assert status_of(kube_env)["phase"] == "Failed" and len(kube_env.list(JOBS, NS, f"{EXPIRY}=llama")) == 1


def test_a_bad_policy_stops_the_operator_at_startup_naming_the_key(
    kube_env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv(policy.POLICY_ENV, '{"tolerations": {"allow": ["*"]}, "image": {"allow": ["*"]}}')
    runner = KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30, reraise=False)
    with runner:
        pass  # the startup handler refuses the policy: kopf stops on its own
    assert runner.exit_code != 0 and runner.exception is not None
    assert "the operator's policy cannot be used: policy.image is not a policy key" in caplog.text


def test_a_rewarm_of_a_ready_cache_keeps_it_ready_while_it_refreshes(kube_env, nodes, operator):
    """Issue 22 item 5: the rewarm annotation re-runs every pool; training pods are not gated meanwhile."""
    create_cache(kube_env)
    wait_jobs(kube_env, 2)
    warm_and_expire(kube_env)
    expired = expiry_job(kube_env)
    before = {job["metadata"]["name"] for job in jobs_of(kube_env).values()}
    kube_env.patch(CC, "llama", {"metadata": {"annotations": {"compilecache.dev/rewarm": "2026-11-25"}}}, NS)
    fresh = kube_env.wait_for(
        lambda: (names := {j["metadata"]["name"] for j in jobs_of(kube_env).values()}) and not names & before and names
    )
    assert len(fresh) == 2
    refreshing = kube_env.wait_for(
        lambda: "refreshing" in status_of(kube_env).get("message", "") and status_of(kube_env)
    )
    assert refreshing["phase"] == "Ready"
    assert next(c for c in refreshing["conditions"] if c["type"] == "Ready")["status"] == "True"
    for job in jobs_of(kube_env).values():
        finish(kube_env, job, succeeded=True)
    finish_expiry(kube_env, expiry_job(kube_env, other_than=expired["metadata"]["name"]))
    ready = kube_env.wait_for(lambda: "refreshing" not in status_of(kube_env)["message"] and status_of(kube_env))
    assert ready["phase"] == "Ready"
    assert event_reasons(kube_env).count("Warming") == 1  # only the first warm-up: the cache never left Ready


def test_a_schedule_shorter_than_the_warm_up_never_deletes_the_running_job(kube_env, nodes, operator):
    """Issue 22 item 6: every minute, a warm-up that runs longer: the slot is skipped, in status and an Event."""
    create_cache(kube_env, schedule="* * * * *")
    running = {job["metadata"]["name"] for job in wait_jobs(kube_env, 2).values()}
    # The next slot comes within a minute; the Jobs (never finished here) keep running.
    skipped = kube_env.wait_for(
        lambda: status_of(kube_env).get("lastSkippedScheduleTime") and status_of(kube_env), timeout=75
    )
    assert skipped["lastSkippedScheduleTime"] > skipped["lastScheduleTime"]
    assert {job["metadata"]["name"] for job in jobs_of(kube_env).values()} == running
    assert skipped["phase"] == "Warming"
    kube_env.wait_for(lambda: "ScheduleSkipped" in event_reasons(kube_env))
