"""Multi-host warm-up on the controller side (issue 12): topologies in the spec, the Indexed Job and its
headless Service, their names, TooFewNodes, the Services' lifetime and the per-process reports.

Single-host Jobs are pinned to the manifests the code produced before topologies existed.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import kubernetes_validate
import pytest

from compilecache.cache import cacheenv
from compilecache.controller import api, jobs, plan, status
from compilecache.controller.api import SpecError, Topology, parse_spec
from compilecache.controller.kube import JOBS, SERVICES
from compilecache.controller.pools import resolve_pools
from compilecache.controller.snapshot import Cache, Snapshot, uses_services
from compilecache.local.validation import dns1035_label
from k8snames import KUBERNETES_VERSIONS
from specs import PRODUCT, cache, cache_spec, cluster, node
from test_spec_property import api_server_rules, check, multihost_problems

NOW = "2026-11-21T10:00:00Z"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"


def multihost(name: str = "llama", hosts: tuple[int, ...] = (1, 2), **spec: Any) -> dict[str, Any]:
    """A cache on explicit pools h100 (3 nodes in ``cluster()``) and a100 (2 nodes), warmed for ``hosts``."""
    warmup = cache_spec()["warmup"] | {
        "pools": [
            {"name": "h100", "nodeSelector": {PRODUCT: H100}},
            {"name": "a100", "nodeSelector": {PRODUCT: A100}},
        ],
        "topologies": [{"hosts": h} for h in hosts],
    }
    warmup.pop("discover")
    warmup |= spec.pop("warmup", {})
    return cache(name=name, warmup=warmup, **spec)


def snapshot(obj: dict[str, Any], **parts: Any) -> Snapshot:
    parts.setdefault("nodes", tuple(cluster()))
    return Snapshot(Cache.read(obj), **parts)


def with_status(obj: dict[str, Any], new: Any) -> dict[str, Any]:
    return copy.deepcopy(obj) | {"status": copy.deepcopy(dict(new))}


def finished(manifest: Any, condition: str | None = "Complete", *, active: int = 0) -> dict[str, Any]:
    job = copy.deepcopy(dict(manifest))
    job["status"] = {"startTime": "2026-11-21T09:00:00Z", "active": active}
    if condition:
        job["status"]["conditions"] = [{"type": condition, "status": "True", "lastTransitionTime": NOW}]
    return job


def pod(job: str, index: int | None, containers: list[tuple[str, int, str]]) -> dict[str, Any]:
    """A pod of ``job`` (Indexed: its index annotation) whose containers terminated with (name, code, message)."""
    meta: dict[str, Any] = {"name": f"{job}-{index}-x", "labels": {"job-name": job}}
    if index is not None:
        meta["annotations"] = {status.COMPLETION_INDEX: str(index)}
    statuses = [
        {"name": name, "state": {"terminated": {"exitCode": code, "message": message, "finishedAt": f"{NOW[:-3]}{i}Z"}}}
        for i, (name, code, message) in enumerate(containers)
    ]
    return {"metadata": meta, "status": {"containerStatuses": statuses}}


def summary(**fields: Any) -> str:
    return json.dumps({"schema": status.WARM_SCHEMA, "ok": "error" not in fields, **fields})


# --- the spec ------------------------------------------------------------------------------------


def test_topologies_default_to_one_host_and_parse_to_typed_values():
    assert parse_spec(cache_spec()).warmup.topologies == (Topology(hosts=1),)
    spec = parse_spec(multihost(hosts=(1, 8))["spec"])
    assert spec.warmup.topologies == (Topology(1), Topology(8))
    assert [t.multi_host for t in spec.warmup.topologies] == [False, True]


@pytest.mark.parametrize(
    ("topologies", "field"),
    [
        ([], "spec.warmup.topologies"),
        ({"hosts": 2}, "spec.warmup.topologies"),
        ([{"hosts": 2}, {"hosts": 2}], "spec.warmup.topologies[1].hosts"),
        ([{"hosts": 0}], "spec.warmup.topologies[0].hosts"),
        ([{"hosts": 257}], "spec.warmup.topologies[0].hosts"),
        ([{"hosts": "2"}], "spec.warmup.topologies[0].hosts"),
        ([{"hosts": True}], "spec.warmup.topologies[0].hosts"),
        ([{}], "spec.warmup.topologies[0].hosts"),
        (["2"], "spec.warmup.topologies[0]"),
        ([{"hosts": h} for h in range(1, 10)], "spec.warmup.topologies"),
    ],
)
def test_bad_topologies_name_the_field(topologies: Any, field: str):
    spec = cache_spec()
    spec["warmup"]["topologies"] = topologies
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    assert error.value.field == field


# --- single-host Jobs are what they were ---------------------------------------------------------

# Copies of examples/cache-pvc.yaml and examples/cache-gcs.yaml as they were before topologies, so
# that this pins the code, not the examples (which may grow topologies).
EXAMPLE_PVC = {
    "storage": {"pvc": {"claimName": "llama-jax-cache", "create": {"size": "200Gi", "accessModes": ["ReadWriteMany"]}}},
    "warmup": {
        "image": "registry.example.com/ml/llama-trainer:1.2.0",
        "workloads": [
            {
                "name": "train-step",
                "entrypoint": "examples.workloads.transformer:targets",
                "env": [{"name": "MODEL_LAYERS", "value": "24"}],
            }
        ],
        "discover": {
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "resources": {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "64Gi"}},
    },
    "lifecycle": {"maxAge": "14d", "maxSize": "150Gi", "keepVersions": 2, "verify": True},
    "consumers": {"podSelector": {"matchLabels": {"app": "llama-train"}}, "readOnly": True, "gate": True},
}
_GKE_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
EXAMPLE_GCS = {
    "storage": {"gcs": {"bucket": "my-jax-caches", "prefix": "caches/llama", "serviceAccountName": "cache-writer"}},
    "warmup": {
        "image": "us-docker.pkg.dev/example/llama/trainer:1.2.0",
        "workloads": [
            {
                "name": "train-step",
                "entrypoint": "examples.workloads.transformer:targets",
                "env": [{"name": "MODEL_LAYERS", "value": "32"}],
            },
            {
                "name": "train-script",
                "script": "/app/train_compile.py",
                "args": ["--config=/app/configs/llama-8b.yaml", "--steps=100000"],
                "steps": 2,
                "stepFn": "_train_step",
                "pools": ["h100"],
            },
        ],
        "pools": [
            {
                "name": "h100",
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                "tolerations": _GKE_TOLERATIONS,
                "gpusPerPod": 8,
            },
            {
                "name": "a100",
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
                "tolerations": _GKE_TOLERATIONS,
                "gpusPerPod": 8,
            },
        ],
        "backoffLimit": 2,
        "activeDeadlineSeconds": 7200,
        "jax": {"xlaFlags": "--xla_gpu_enable_latency_hiding_scheduler=true"},
    },
    "schedule": "0 3 * * *",
    "lifecycle": {"maxAge": "7d", "keepVersions": 2},
}
# (cache, slot, pool) → (Job name, sha256 of the manifest's sorted JSON, first 16), computed with the
# code of commit ec133f1, before topologies existed.
PINNED = {
    ("llama-pvc", None, "nvidia-a100-sxm4-40gb"): ("llama-pvc-nvidia-a100-sxm4-40gb-ad6d77e9", "4c3463bfc0e97487"),
    ("llama-pvc", None, "nvidia-h100-80gb-hbm3"): ("llama-pvc-nvidia-h100-80gb-hbm3-bbbc10e1", "22688dcca6de61bc"),
    ("llama-pvc", "20261122T0300Z", "nvidia-a100-sxm4-40gb"): (
        "llama-pvc-nvidia-a100-sxm4-40gb-d2246e56",
        "db2b9cdcca402a6f",
    ),
    ("llama-pvc", "20261122T0300Z", "nvidia-h100-80gb-hbm3"): (
        "llama-pvc-nvidia-h100-80gb-hbm3-4161b3e4",
        "6d0c00fc2526507b",
    ),
    # Issue 28: a script workload's command says --script=PATH (a path starting with '-' is no flag).
    ("llama-gcs", None, "h100"): ("llama-gcs-h100-7f782e5b", "bd83311e20fe9fca"),
    ("llama-gcs", None, "a100"): ("llama-gcs-a100-815b2575", "0a0431b78c5b161d"),
    ("llama-gcs", "20261122T0300Z", "h100"): ("llama-gcs-h100-6de6e190", "bc7b29f7b43cf8b1"),
    ("llama-gcs", "20261122T0300Z", "a100"): ("llama-gcs-a100-3bb046d9", "cbc6bcacbf1bc69a"),
    ("llama", None, "nvidia-a100-sxm4-40gb"): ("llama-nvidia-a100-sxm4-40gb-fcd710be", "67de8ff7296f0778"),
    ("llama", None, "nvidia-h100-80gb-hbm3"): ("llama-nvidia-h100-80gb-hbm3-9f115f76", "e71d6353453cd2bf"),
    ("llama", "20261122T0300Z", "nvidia-a100-sxm4-40gb"): ("llama-nvidia-a100-sxm4-40gb-8ee000e3", "1dd7ba526f979a8b"),
    ("llama", "20261122T0300Z", "nvidia-h100-80gb-hbm3"): ("llama-nvidia-h100-80gb-hbm3-46c66a52", "ad33c10eeda75d91"),
}


def _pinned_nodes() -> list[dict[str, Any]]:
    gke = "cloud.google.com/gke-accelerator"
    return [
        *cluster(),
        *(node(f"gke-h100-{i}", None, **{gke: "nvidia-h100-80gb"}) for i in range(2)),
        *(node(f"gke-a100-{i}", None, **{gke: "nvidia-tesla-a100"}) for i in range(2)),
    ]


def _pinned_caches() -> list[dict[str, Any]]:
    return [
        cache(name="llama-pvc", **copy.deepcopy(EXAMPLE_PVC)),
        cache(name="llama-gcs", **copy.deepcopy(EXAMPLE_GCS)),
        cache(),
    ]


@pytest.mark.parametrize("topologies", [None, [{"hosts": 1}], [{"hosts": 2}, {"hosts": 1}]])
def test_single_host_jobs_are_byte_for_byte_what_they_were(topologies: Any):
    seen = {}
    for obj in _pinned_caches():
        if topologies is not None:
            obj["spec"]["warmup"]["topologies"] = topologies
        spec = api.parse_cache(obj)
        for slot in (None, "20261122T0300Z"):
            for pool in resolve_pools(spec, _pinned_nodes()):
                manifest = jobs.warmup_job(obj, spec, pool, slot, Topology(1))
                # Issue 19 added the role label to warm-up pods (never a consumer); everything else is as pinned.
                assert manifest["spec"]["template"]["metadata"]["labels"].pop(jobs.LABEL_ROLE) == "warmup"
                # Issue 31 added the podFailurePolicy (a disrupted pod is retried, not counted): names unchanged.
                assert manifest["spec"].pop("podFailurePolicy") == jobs.POD_FAILURE_POLICY
                # Issue 33 added the image to the warm-up's env (its run manifests record it): names unchanged.
                pod_spec = manifest["spec"]["template"]["spec"]
                for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
                    image = {"name": cacheenv.IMAGE, "value": spec.warmup.image}
                    assert image in container["env"], container["env"]
                    container["env"].remove(image)
                digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
                seen[(obj["metadata"]["name"], slot, pool.name)] = (manifest["metadata"]["name"], digest)
    assert seen == PINNED


def test_the_plan_of_a_single_host_cache_creates_no_service_and_reads_none():
    decided = plan.plan(snapshot(cache()), NOW)
    assert {c.resource for c in decided.creates} == {JOBS, plan.PVCS}
    assert all(p["hosts"] == 1 for p in decided.status["pools"])
    assert not uses_services(Cache.read(cache()))
    assert uses_services(Cache.read(multihost()))
    # A cache that had a multi-host warm-up reads its Services once more, to delete them.
    was = with_status(cache(), {"pools": [{"name": "h100", "hosts": 2}]})
    assert uses_services(Cache.read(was))


# --- the Indexed Job and its Service ---------------------------------------------------------------


def _manifests(obj: dict[str, Any], hosts: int, pool_name: str = "h100") -> tuple[dict[str, Any], dict[str, Any]]:
    spec = api.parse_cache(obj)
    pool = next(p for p in resolve_pools(spec, cluster()) if p.name == pool_name)
    job = jobs.warmup_job(obj, spec, pool, None, Topology(hosts))
    return job, jobs.warmup_service(job)


def test_a_multi_host_job_is_indexed_one_pod_per_node_and_never_retried():
    job, service = _manifests(multihost(warmup={"backoffLimit": 5}), 2)
    name = job["metadata"]["name"]
    assert name.startswith("llama-h100-h2-")
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        2,
        2,
        0,
    )
    assert job["metadata"]["labels"][jobs.LABEL_HOSTS] == "2"
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert labels[jobs.LABEL_WARMUP_JOB] == name
    assert pod["subdomain"] == service["metadata"]["name"] == name
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {jobs.LABEL_WARMUP_JOB: name}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert jobs.LABEL_CACHE not in labels  # the pods would gate themselves
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8  # GPUs per host from the pool


def test_the_headless_service_selects_exactly_its_jobs_pods_and_is_owned_by_the_cache():
    job, service = _manifests(multihost(), 2)
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {jobs.LABEL_WARMUP_JOB: job["metadata"]["name"]},
    }
    assert service["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]
    assert service["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert service["metadata"]["labels"][jobs.LABEL_CACHE] == "llama"
    assert service["metadata"]["namespace"] == "default"
    assert multihost_problems([job, service]) == []
    assert multihost_problems([job])  # the check notices a missing Service


def test_every_container_is_told_the_coordinator_and_the_process_count():
    scripts = [
        {"name": "a", "script": "/app/a.py", "env": [{"name": "JAX_COORDINATOR_ADDRESS", "value": "mine:1"}]},
        {"name": "b", "script": "/app/b.py"},
    ]
    warmup = {"workloads": [*scripts, {"name": "c", "entrypoint": "m:f"}]}
    job, _ = _manifests(multihost(warmup=warmup), 3)
    name = job["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    containers = [*pod["initContainers"], *pod["containers"]]
    assert [c["name"] for c in containers] == ["warm-0", "warm-1", "warm"]
    for index, container in enumerate(containers):
        env = [(item["name"], item.get("value")) for item in container["env"]]
        assert env.count(("JAX_COORDINATOR_ADDRESS", f"{name}-0.{name}:{8476 + 4 * index}")) == 1
        assert ("COMPILECACHE_NUM_PROCESSES", "3") in env
        assert len({n for n, _ in env}) == len(env)  # the operator's value, not also the workload's
    # A single-host Job is told nothing of the kind.
    single, _ = _manifests(multihost(warmup=warmup), 1)
    env = {item["name"] for c in single["spec"]["template"]["spec"]["containers"] for item in c["env"]}
    assert "COMPILECACHE_NUM_PROCESSES" not in env and "subdomain" not in single["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "name",
    [
        "llama",
        "a" * 63,
        "7b-llama",
        "9" * 63,
        "llama.v2.cache",
        "x",
    ],
)
@pytest.mark.parametrize("hosts", [2, 10, 100, 256])
def test_names_fit_hostnames_and_services(name: str, hosts: int):
    pool = "p" * 63  # the longest explicit pool name
    obj = multihost(name=name, hosts=(hosts,))
    obj["spec"]["warmup"]["pools"] = [{"name": pool}]
    job, service = _manifests(obj, hosts, pool)
    job_name = job["metadata"]["name"]
    assert f"-h{hosts}-" in job_name
    assert len(job_name) <= jobs.MULTIHOST_NAME_MAX
    assert api.is_dns_label(f"{job_name}-{hosts - 1}")  # the last pod's hostname
    assert dns1035_label(service["metadata"]["name"]) == []
    assert api_server_rules(job) == [] and api_server_rules(service) == []
    assert _manifests(obj, hosts, pool)[0]["metadata"]["name"] == job_name  # deterministic
    others = {_manifests(obj, h, pool)[0]["metadata"]["name"] for h in (1, hosts + 1 if hosts < 256 else 3)}
    assert job_name not in others  # each topology its own Job


def test_a_truncated_name_still_differs_by_cache():
    long = "a" * 56
    one = _manifests(multihost(name=f"{long}-one", hosts=(2,)), 2)[0]["metadata"]["name"]
    two = _manifests(multihost(name=f"{long}-two", hosts=(2,)), 2)[0]["metadata"]["name"]
    assert one != two  # the hash covers the cache's name


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_job_and_service_validate_against_kubernetes(version: str):
    for obj in (multihost(), multihost(name="0.cache", hosts=(256,))):
        hosts = obj["spec"]["warmup"]["topologies"][-1]["hosts"]
        for manifest in _manifests(obj, hosts):
            kubernetes_validate.validate(manifest, version, strict=True)


def test_a_multi_host_cache_passes_the_property_checks():
    # The property test's own checks (test_spec_property.check) on a cache that surely has multi-host Jobs.
    obj = multihost(name="7b.llama", hosts=(1, 2, 3))
    obj["spec"]["warmup"]["workloads"].append({"name": "s", "script": "/app/s.py", "args": ["--x"]})
    assert check(obj, cluster(), KUBERNETES_VERSIONS) == "objects, multi-host"


# --- plan(): entries per pool × topology, TooFewNodes, the Services' lifetime ---------------------


def _entry(decided: plan.Plan, pool: str, hosts: int) -> dict[str, Any]:
    return next(p for p in decided.status["pools"] if (p["name"], p["hosts"]) == (pool, hosts))


def test_one_entry_per_pool_and_topology_and_a_pool_with_too_few_nodes_asks_for_the_rest():
    decided = plan.plan(snapshot(multihost(hosts=(1, 3))), NOW)
    assert [(p["name"], p["hosts"]) for p in decided.status["pools"]] == [
        ("h100", 1),
        ("h100", 3),
        ("a100", 1),
        ("a100", 3),
    ]
    # a100 has 2 nodes for a 3-host warm-up: its Job asks for all 3 hosts at once (an autoscaler adds the
    # third, else capacityTimeout ends it); before issue 31 it was TooFewNodes and nothing ran.
    short = _entry(decided, "a100", 3)
    assert (short["state"], short["reason"], short["nodes"]) == (status.POOL_PENDING, "JobCreated", 2)
    created = [(c.resource, c.name) for c in decided.creates]
    for hosts3 in (_entry(decided, "h100", 3)["job"], short["job"]):
        # The Service comes before its Job (process 0's name must resolve when the pods start).
        assert created.index((SERVICES, hosts3)) == created.index((JOBS, hosts3)) - 1
    assert len([r for r, _ in created if r == SERVICES]) == 2
    assert len([r for r, _ in created if r == JOBS]) == 4
    job = next(c.manifest for c in decided.creates if c.name == short["job"] and c.resource == JOBS)
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (3, 3)
    assert decided.status["poolsReady"] == "0/4"
    assert "PoolTooFewNodes" not in [e.reason for e in decided.events]


def test_the_first_process_waits_for_the_last_host_as_long_as_capacity_may_take():
    obj = multihost(hosts=(3,))
    obj["spec"]["warmup"]["capacityTimeout"] = "2h"
    decided = plan.plan(snapshot(obj), NOW)
    job = next(c.manifest for c in decided.creates if c.resource == JOBS)
    pod = job["spec"]["template"]["spec"]
    first = [*(pod.get("initContainers") or []), *pod["containers"]][0]
    env = {item["name"]: item.get("value") for item in first["env"]}
    assert env["COMPILECACHE_GROUP_CONNECT_TIMEOUT"] == "7200"


def test_no_nodes_stays_no_nodes_whatever_the_topology():
    obj = multihost(hosts=(2,))
    obj["spec"]["warmup"]["pools"].append({"name": "l4", "nodeSelector": {PRODUCT: "NVIDIA-L4"}})
    decided = plan.plan(snapshot(obj), NOW)
    assert _entry(decided, "l4", 2)["state"] == status.POOL_NO_NODES


def test_the_service_lives_while_its_job_runs():
    obj = multihost(hosts=(3,))
    first = plan.plan(snapshot(obj), NOW)
    job = next(c.manifest for c in first.creates if c.resource == JOBS and "-h100-h3-" in c.name)
    service = next(c.manifest for c in first.creates if c.resource == SERVICES and c.name == job["metadata"]["name"])
    others = tuple(finished(c.manifest, None) for c in first.creates if c.resource == JOBS and c.manifest is not job)
    other_services = tuple(c.manifest for c in first.creates if c.resource == SERVICES and c.manifest is not service)
    recorded = with_status(obj, first.status)
    # Running: kept, and not created again.
    running = plan.plan(
        snapshot(recorded, jobs=(finished(job, None, active=3), *others), services=(service, *other_services)), NOW
    )
    assert not [d for d in running.deletes if d.resource == SERVICES]
    assert not [c for c in running.creates if c.resource in (SERVICES, JOBS)]
    # Running without its Service (someone deleted it): made again.
    lost = plan.plan(snapshot(recorded, jobs=(finished(job, None, active=3), *others), services=other_services), NOW)
    assert [c.name for c in lost.creates if c.resource == SERVICES] == [service["metadata"]["name"]]
    # Finished (either way): deleted; the Job stays for its TTL.
    for condition in ("Complete", "Failed"):
        jobs_ = (finished(job, condition), *others)
        ended = plan.plan(snapshot(recorded, jobs=jobs_, services=(service, *other_services)), NOW)
        assert [(d.resource, d.name) for d in ended.deletes] == [(SERVICES, service["metadata"]["name"])]


def test_a_superseded_multi_host_job_takes_its_service_along():
    obj = multihost(hosts=(2,))
    first = plan.plan(snapshot(obj), NOW)
    service = next(c.manifest for c in first.creates if c.resource == SERVICES)
    job = next(c.manifest for c in first.creates if c.resource == JOBS and "-h2-" in c.name)
    changed = multihost(hosts=(2,), warmup={"image": "registry.example/trainer:1.3"})
    decided = plan.plan(
        snapshot(with_status(changed, first.status), jobs=(finished(job, None, active=2),), services=(service,)), NOW
    )
    deleted = {(d.resource, d.name) for d in decided.deletes}
    assert {(JOBS, job["metadata"]["name"]), (SERVICES, service["metadata"]["name"])} <= deleted
    # The topology dropped from the spec: its Service goes too (the status still lists it, so it is read).
    single = multihost(hosts=(1,))
    dropped = plan.plan(
        snapshot(with_status(single, first.status), jobs=(finished(job, None, active=2),), services=(service,)), NOW
    )
    assert (SERVICES, service["metadata"]["name"]) in {(d.resource, d.name) for d in dropped.deletes}
    # Another cache's Service (another owner uid) is never touched.
    foreign = copy.deepcopy(service)
    foreign["metadata"]["ownerReferences"][0]["uid"] = "uid-2"
    kept = plan.plan(snapshot(with_status(single, first.status), services=(foreign,)), NOW)
    assert not [d for d in kept.deletes if d.resource == SERVICES]


def test_a_refused_service_fails_its_entry_and_creates_no_job():
    obj = multihost(hosts=(2,))
    first = plan.plan(snapshot(obj), NOW)
    service = next(c for c in first.creates if c.resource == SERVICES)
    created = frozenset(c.key for c in first.creates[: first.creates.index(service)])
    after = snapshot(obj).after(created, {service.key: 'services is forbidden: User "x" cannot create'})
    second = plan.plan(after, NOW)
    entry = next(p for p in second.status["pools"] if p.get("job") == service.name)
    assert (entry["state"], entry["reason"]) == (status.POOL_FAILED, plan.SERVICE_REJECTED)
    assert "cannot create" in entry["message"]
    assert service.name not in [c.name for c in second.creates]  # neither the Service nor its Job
    # The Job is keyed apart from its Service: refusing one never reads as the other created.
    assert JOBS.key(service.name) != SERVICES.key(service.name)


# --- reports of N processes ------------------------------------------------------------------------


def test_a_succeeded_multi_host_job_adds_up_its_processes():
    obj = multihost(hosts=(2,))
    first = plan.plan(snapshot(obj), NOW)
    job = next(c.manifest for c in first.creates if c.resource == JOBS and "-h2-" in c.name)
    name = job["metadata"]["name"]
    target = {"name": "step", "seconds": 1.5, "entries": 3, "bytes": 300}
    pods = (
        pod(name, 0, [("warm", 0, summary(process=0, processes=2, entries=3, bytes=300, compileSeconds=1.5,
                                          verify={"hits": 3, "requests": 3}, targets=[target]))]),
        pod(name, 1, [("warm", 0, summary(process=1, processes=2, entries=0, bytes=0, compileSeconds=2.0,
                                          verify={"hits": 2, "requests": 3}, targets=[target | {"entries": 0}]))]),
    )  # fmt: skip
    decided = plan.plan(snapshot(with_status(obj, first.status), jobs=(finished(job),), warmup_pods=pods), NOW)
    entry = next(p for p in decided.status["pools"] if p.get("job") == name)
    assert entry["state"] == status.POOL_SUCCEEDED and entry["hosts"] == 2
    assert (entry["entries"], entry["bytes"]) == (3, 300)
    assert (entry["verifyHits"], entry["verifyRequests"]) == (5, 6)
    assert entry["compileSeconds"] == 2.0  # the slowest process: they compile side by side
    assert entry["targets"] == [target]  # one process's detail, not two copies


def test_the_index_comes_from_the_pod_when_a_summary_does_not_say():
    pods = [pod("j", i, [("warm", 0, summary(entries=1, bytes=10))]) for i in range(3)]
    assert status.warm_report(pods)["entries"] == 3  # three processes, not one container seen three times
    # A single-host Job retried: the newest summary of the container counts, once (as before).
    retried = [pod("j", None, [("warm", 0, summary(entries=1, bytes=10))]) for _ in range(3)]
    assert status.warm_report(retried)["entries"] == 1


def test_a_failed_multi_host_job_names_the_process_that_failed_first():
    obj = multihost(hosts=(2,))
    first = plan.plan(snapshot(obj), NOW)
    job = next(c.manifest for c in first.creates if c.resource == JOBS and "-h2-" in c.name)
    name = job["metadata"]["name"]
    lost = summary(process=0, processes=2, error="coordinator: the group lost process 1")
    pods = (
        pod(name, 0, [("warm", 1, "x"), ("warm", 1, lost)]),  # later: a consequence
        pod(name, 1, [("warm", 137, "Killed\nout of memory while compiling step")]),  # first
    )
    pods[1]["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2026-11-21T09:59:00Z"
    decided = plan.plan(
        snapshot(with_status(obj, first.status), jobs=(finished(job, "Failed"),), warmup_pods=pods), NOW
    )
    entry = next(p for p in decided.status["pools"] if p.get("job") == name)
    assert entry["state"] == status.POOL_FAILED
    assert entry["message"].startswith("process 1 of 2: out of memory while compiling step (")
    # The summary's error wins over a log tail at the same time; the summary's process over the pod's index.
    same_time = [pod(name, 1, [("warm", 1, "a log line")]), pod(name, 0, [("warm", 1, lost)])]
    same_time[1]["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2026-11-21T10:00:00Z"
    same_time[0]["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2026-11-21T10:00:00Z"
    said = status.failure(same_time, Topology(2))
    assert said == "process 0 of 2: coordinator: the group lost process 1"
    # One host: the newest failure, without a process (as before).
    assert status.failure([pod(name, None, [("warm", 1, summary(error="boom"))])]) == "boom"


def test_a_size_too_big_to_print_names_its_field():
    # Found by the long property run: the CRD's quantity pattern admits it, and the pass crashed on it.
    spec = cache_spec(lifecycle={"maxSize": ".1E5000"})
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    assert error.value.field == "spec.lifecycle.maxSize"
    assert parse_spec(cache_spec(lifecycle={"maxSize": "999999Ei"})).lifecycle.max_size_bytes == 999999 * 2**60
    with pytest.raises(SpecError):
        parse_spec(cache_spec(lifecycle={"maxSize": "1E31"}))
