"""The operator end to end: its real kopf client against the API emulator over HTTP.

Nothing runs controllers in the emulator: the tests play the Job controller by
writing Job status themselves, and the emulator's ownerReference GC plays the
garbage collector.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from compilecache import handlers
from compilecache.cacheenv import jax_cache_env
from specs import GPU, PRODUCT, cache_spec, cluster

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

CC = "compilecache.dev/v1alpha1/compilecaches"
JOBS = "batch/v1/jobs"
NS = "default"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"


@pytest.fixture
def operator(kube_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    """The real operator (kopf, our handlers) in this process, watching every namespace."""
    monkeypatch.setenv(handlers.RESYNC_SECONDS_ENV, "0.5")
    runner = KopfRunner(["run", "--standalone", "-A"], registry=handlers.registry, timeout=30)
    with runner:
        yield runner
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


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
    for job in jobs.values():
        finish(kube_env, job, succeeded=True)
    status = wait_phase(kube_env, "Ready")
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
    status = wait_phase(kube_env, "Degraded")
    failed = next(pool for pool in status["pools"] if pool["state"] == "Failed")
    assert (failed["name"], failed["reason"]) == ("nvidia-a100-sxm4-40gb", "BackoffLimitExceeded")
    assert "nvidia-a100-sxm4-40gb" in status["message"]
    warnings = [e for e in kube_env.list("v1/events", NS) if e["type"] == "Warning"]
    assert {"PoolFailed", "Degraded"} <= {e["reason"] for e in warnings}


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
        wait_phase(kube_env, "Ready")
    assert second.exception is None, second.output
    after = kube_env.list(JOBS, NS)
    assert sorted(job["metadata"]["name"] for job in after) == sorted(j["metadata"]["name"] for j in before.values())


def test_finished_job_removed_by_ttl_is_not_rerun(kube_env, nodes, operator):
    create_cache(kube_env)
    jobs = wait_jobs(kube_env, 2)
    for job in jobs.values():
        finish(kube_env, job, succeeded=True)
    wait_phase(kube_env, "Ready")
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
    kube_env.create(
        "v1/persistentvolumeclaims",
        {"metadata": {"name": "brought"}, "spec": {"accessModes": ["ReadWriteMany"]}},
        NS,
    )
    wait_jobs(kube_env, 2)  # the resync notices the claim
    wait_phase(kube_env, "Warming")


def test_pool_without_nodes_is_no_nodes_not_a_failure(kube_env, nodes, operator):
    warmup = cache_spec()["warmup"]
    warmup["pools"] = [{"name": "b200", "nodeSelector": {PRODUCT: "NVIDIA-B200"}}]
    create_cache(kube_env, warmup=warmup)
    jobs = wait_jobs(kube_env, 2)
    status = kube_env.wait_for(lambda: len(status_of(kube_env).get("pools", [])) == 3 and status_of(kube_env))
    assert {p["name"]: p["state"] for p in status["pools"]}["b200"] == "NoNodes"
    for job in jobs.values():
        finish(kube_env, job, succeeded=True)
    status = wait_phase(kube_env, "Ready")
    assert status["poolsReady"] == "2/2"
