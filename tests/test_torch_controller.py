"""spec.framework pytorch on the controller's side: warm-up and expiry commands, the webhook's
mutation of PyTorch consumers, and the refusal of JAX-only options (pure functions, no server)."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest

import podsecurity
from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG
from compilecache.controller import admission, expiryjob, jobs, plan, status
from compilecache.controller.api import SpecError, parse_spec
from compilecache.controller.kube import JOBS
from compilecache.controller.pools import resolve_pools
from compilecache.frameworks.pytorch.env import (
    FRAMEWORK,
    TORCH_CACHE_DIR,
    TORCH_LOCAL_DIR,
    TORCH_SOURCE,
    torch_cache_env,
)
from crdschema import apply_defaults, load_crd, openapi_schema, validate
from k8snames import KUBERNETES_VERSIONS
from specs import cache, cache_spec, cluster
from torchhelpers import ROOT

MOUNT = "/var/cache/compilecache"
SCHEMA = openapi_schema(load_crd(ROOT / "crds" / "compilecache.yaml"), "v1alpha1")
SCRIPT = {"name": "train", "script": "examples/pytorch/train.py", "steps": 3, "args": ["--layers", "2"]}


def torch_cache(**spec: Any) -> dict[str, Any]:
    warmup = {**cache_spec()["warmup"], "workloads": [SCRIPT]}
    return cache(**({"framework": "pytorch", "warmup": warmup} | spec))


def warmup_jobs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = parse_spec(obj["spec"])
    return [jobs.warmup_job(obj, spec, pool) for pool in resolve_pools(spec, cluster())]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def training_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "default", "labels": {"compilecache.dev/cache": "llama"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
    }


def test_warmup_job_runs_the_pytorch_warmer_on_the_script_without_jax_settings() -> None:
    [job, *_] = warmup_jobs(torch_cache())
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == [
        "compilecache", "warm", "--framework", "pytorch", "--cache-dir", MOUNT, "--verify",
        "--report", jobs.REPORT_PATH, "--termination-log", jobs.TERMINATION_LOG,
        "--script=examples/pytorch/train.py", "--steps", "3", "--", "--layers", "2",
    ]  # fmt: skip
    env = env_of(container)
    assert not [name for name in env if name.startswith(("JAX_", "XLA_"))], env
    assert env[FRAMEWORK] == "pytorch"
    # Inductor's cache switches as training has them; its folder is the warmer's staging, never the cache.
    expected = {k: v for k, v in torch_cache_env(MOUNT).items() if k != TORCH_CACHE_DIR}
    assert {k: env[k] for k in expected} == expected and TORCH_CACHE_DIR not in env
    assert {"name": "cache", "mountPath": MOUNT} in container["volumeMounts"]  # the warmer publishes there


def test_a_script_without_steps_runs_epochs_within_its_budget() -> None:
    workload = {"name": "train", "script": "train.py", "budget": "90s"}
    obj = torch_cache(warmup={**torch_cache()["spec"]["warmup"], "workloads": [workload, {**SCRIPT, "name": "b"}]})
    [job, *_] = warmup_jobs(obj)
    pod = job["spec"]["template"]["spec"]
    [first] = pod["initContainers"]  # scripts run one after the other, each its own warmer
    assert first["command"][-6:] == ["--script=train.py", "--steps", "auto", "--budget", "90", "--"]
    assert pod["containers"][0]["command"][-5:] == ["--steps", "3", "--", "--layers", "2"]
    assert "--jobs" not in first["command"] and "--step-fn" not in first["command"]


def test_gcs_pytorch_warmup_gets_the_url() -> None:
    gcs = {"gcs": {"bucket": "torch-caches", "prefix": "caches/torch", "serviceAccountName": "cache-writer"}}
    [job, *_] = warmup_jobs(torch_cache(storage=gcs))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][2:6] == ["--framework", "pytorch", "--cache-dir", "gs://torch-caches/caches/torch"]
    assert TORCH_CACHE_DIR not in env_of(container)  # a gs:// URL is no folder for Inductor


def test_expiry_job_expires_pytorch_entries_and_jax_commands_stay_as_they_were() -> None:
    obj = torch_cache(lifecycle={"maxAge": "7d", "maxSize": "1Gi"})
    spec = parse_spec(obj["spec"])
    command = expiryjob.expiry_job(obj, spec, ["w-1"])["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:6] == ["compilecache", "expire", "--framework", "pytorch", "--cache-dir", MOUNT]
    assert "--max-age" in command and "--max-size" in command
    assert "--framework" not in expiryjob.expire_command(parse_spec(cache_spec()))
    assert "--framework" not in warmup_jobs(cache())[0]["spec"]["template"]["spec"]["containers"][0]["command"]


def test_manifests_of_a_pytorch_cache_are_schema_valid_and_restricted() -> None:
    obj = torch_cache(lifecycle={"maxSize": "1Gi"})
    spec = parse_spec(obj["spec"])
    made = [*warmup_jobs(obj), expiryjob.expiry_job(obj, spec, ["w-1"])]
    mutated = admission.mutate(training_pod(), obj).pod
    for manifest in [*made, mutated]:
        if manifest["kind"] == "Job":
            assert podsecurity.violations(manifest) == [], manifest
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(copy.deepcopy(manifest), version, strict=True)


def test_pytorch_consumer_gets_the_cache_read_only_a_local_copy_and_torch_env() -> None:
    obj = torch_cache(consumers={"readOnly": False})  # pytorch trainers never write the cache, whatever it says
    result = admission.mutate(training_pod(), obj)
    spec = result.pod["spec"]
    assert {"name": "compilecache", "persistentVolumeClaim": {"claimName": "jax-cache", "readOnly": True}} in spec[
        "volumes"
    ]
    # The claim is created at 10Gi (specs.cache_spec): the copy can never be larger.
    assert {"name": admission.LOCAL_VOLUME, "emptyDir": {"sizeLimit": str(10 * 2**30)}} in spec["volumes"]
    [container] = spec["containers"]
    assert container["volumeMounts"] == [
        {"name": "compilecache", "mountPath": MOUNT, "readOnly": True},
        {"name": admission.LOCAL_VOLUME, "mountPath": TORCH_LOCAL_DIR},
    ]
    env = env_of(container)
    assert env == {
        **torch_cache_env(MOUNT, local_dir=TORCH_LOCAL_DIR),
        REPORT: "1",
        TERMINATION_LOG: "/dev/termination-log",
    }
    assert env[TORCH_SOURCE] == MOUNT and env[TORCH_CACHE_DIR] == TORCH_LOCAL_DIR
    assert {"name": admission.GATE} in spec["schedulingGates"]
    assert result.skipped == ()
    assert admission.mutate(result.pod, obj).pod == result.pod  # idempotent


def test_gcs_pytorch_consumer_copies_from_the_url_into_an_unbounded_local_folder() -> None:
    gcs = {"gcs": {"bucket": "torch-caches", "prefix": "p", "serviceAccountName": "w", "readerServiceAccountName": "r"}}
    result = admission.mutate(training_pod(), torch_cache(storage=gcs))
    spec = result.pod["spec"]
    assert spec["volumes"] == [{"name": admission.LOCAL_VOLUME, "emptyDir": {}}]  # no size known
    assert env_of(spec["containers"][0])[TORCH_SOURCE] == "gs://torch-caches/p"
    assert spec["serviceAccountName"] == "r"


def test_size_limit_is_the_larger_bound_and_the_snippet_matches_the_webhook() -> None:
    gcs = {"gcs": {"bucket": "torch-caches", "prefix": "p", "serviceAccountName": "w"}}
    obj = torch_cache(storage=gcs, lifecycle={"maxSize": "2Gi"})
    assert admission.local_volume(parse_spec(obj["spec"])) == {
        "name": admission.LOCAL_VOLUME,
        "emptyDir": {"sizeLimit": str(2 * 2**30)},
    }
    pvc = torch_cache(lifecycle={"maxSize": "50Gi"})
    snippet = admission.pod_snippet(pvc)
    mutated = admission.mutate(training_pod(), pvc).pod["spec"]
    assert snippet["volumes"] == mutated["volumes"]
    assert snippet["volumeMounts"] == mutated["containers"][0]["volumeMounts"]
    assert snippet["volumes"][1]["emptyDir"] == {"sizeLimit": str(50 * 2**30)}
    assert {item["name"]: item["value"] for item in snippet["env"]} == env_of(mutated["containers"][0])


def test_a_pod_volume_of_the_local_name_is_left_alone_and_not_mounted() -> None:
    pod = training_pod()
    pod["spec"]["volumes"] = [{"name": admission.LOCAL_VOLUME, "hostPath": {"path": "/x"}}]
    result = admission.mutate(pod, torch_cache())
    assert any(admission.LOCAL_VOLUME in item for item in result.skipped)
    mounts = result.pod["spec"]["containers"][0]["volumeMounts"]
    assert [m["name"] for m in mounts] == ["compilecache"]


def test_a_thread_count_that_differs_from_the_warmups_is_named() -> None:
    workload = {**SCRIPT, "env": [{"name": "OMP_NUM_THREADS", "value": "8"}]}
    obj = torch_cache(warmup={**torch_cache()["spec"]["warmup"], "workloads": [workload]})
    pod = training_pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "OMP_NUM_THREADS", "value": "4"},
        {"name": "TORCHINDUCTOR_MAX_AUTOTUNE", "value": "1"},
    ]
    result = admission.mutate(pod, obj)
    [threads, autotune] = [item for item in result.skipped if "warm-up ran with" in item]
    assert "OMP_NUM_THREADS is '4' but the warm-up ran with '8'" in threads and "torch.compile" in threads
    assert "TORCHINDUCTOR_MAX_AUTOTUNE is '1' but the warm-up ran with unset" in autotune
    same = training_pod()
    same["spec"]["containers"][0]["env"] = [{"name": "OMP_NUM_THREADS", "value": "8"}]
    assert admission.mutate(same, obj).skipped == ()  # and our own TORCHINDUCTOR_CACHE_DIR is no difference


def test_jax_consumers_are_unchanged() -> None:
    spec = admission.mutate(training_pod(), cache()).pod["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["compilecache"]
    assert not [k for k in env_of(spec["containers"][0]) if k.startswith(("TORCH", "COMPILECACHE_TORCH"))]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"jax": {"xlaFlags": "--xla_foo=1"}}, "spec.warmup.jax.xlaFlags"),
        ({"jax": {"minCompileTimeSecs": 1}}, "spec.warmup.jax.minCompileTimeSecs"),
        ({"workloads": [{"name": "aot", "entrypoint": "m:targets"}]}, "spec.warmup.workloads[0].entrypoint"),
        ({"workloads": [SCRIPT, {**SCRIPT, "name": "b", "stepFn": "step"}]}, "spec.warmup.workloads[1].stepFn"),
        ({"workloads": [{**SCRIPT, "resume": False}]}, "spec.warmup.workloads[0].resume"),
        ({"workloads": [{**SCRIPT, "resumeArgs": ["--restore"]}]}, "spec.warmup.workloads[0].resumeArgs"),
        ({"topologies": [{"hosts": 1}, {"hosts": 2}]}, "spec.warmup.topologies[1].hosts"),
        ({"jobs": 4}, "spec.warmup.jobs"),
    ],
)
def test_jax_only_options_are_refused_for_pytorch_naming_the_field(change: dict[str, Any], field: str) -> None:
    obj = torch_cache()
    obj["spec"]["warmup"] |= change
    with pytest.raises(SpecError) as caught:
        parse_spec(obj["spec"])
    assert caught.value.field == field
    assert "pytorch" in str(caught.value)
    obj["spec"]["framework"] = "jax"
    parse_spec(obj["spec"])  # the same options are JAX's own


def test_a_pytorch_spec_as_the_api_server_defaults_it_is_accepted() -> None:
    """The CRD's defaults (``jax: {minCompileTimeSecs: 0, ...}``, ``jobs: 1``) are in every stored object."""
    obj = apply_defaults(SCHEMA, torch_cache())
    assert obj["spec"]["warmup"]["jax"] == {"minCompileTimeSecs": 0, "minEntrySizeBytes": 0}
    assert obj["spec"]["warmup"]["jobs"] == 1 and obj["spec"]["warmup"]["topologies"] == [{"hosts": 1}]
    assert [str(v) for v in validate(SCHEMA, obj)] == []
    assert parse_spec(obj["spec"]).framework == "pytorch"


def _through_the_loop(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """``plan()`` pass after pass, every Job finishing: (phase, status, created manifests) per pass."""
    from test_plan import NOW, OURS, SUMMARY, expiry_pod, job_from, snapshot, with_status

    claim = {"metadata": {"name": "jax-cache", "labels": OURS}, "status": {"phase": "Bound"}}
    first = plan.plan(snapshot(obj), NOW)
    warmups = tuple(job_from(c, "Complete") for c in first.creates if c.resource == JOBS)
    second = plan.plan(snapshot(with_status(obj, first.status), claim=claim, jobs=warmups), NOW)
    [create] = second.creates
    expiry = job_from(create, "Complete")
    third = plan.plan(
        snapshot(
            with_status(obj, second.status),
            claim=claim,
            jobs=warmups,
            expiry_jobs=(expiry,),
            expiry_pods=(expiry_pod(expiry, json.dumps(SUMMARY)),),
        ),
        NOW,
    )
    return [(d.status["phase"], dict(d.status), [dict(c.manifest) for c in d.creates]) for d in (first, second, third)]


def test_status_and_gates_go_the_same_way_for_both_frameworks() -> None:
    """Pending → Warming → Expiring → Ready with the same status fields; only the commands differ."""
    workload = {"name": "train", "script": "train.py", "steps": 2}
    jax = cache(warmup={**cache_spec()["warmup"], "workloads": [workload]})
    torch = torch_cache(warmup={**cache_spec()["warmup"], "workloads": [workload]})
    jax_loop, torch_loop = _through_the_loop(jax), _through_the_loop(torch)
    assert [phase for phase, _, _ in torch_loop] == [phase for phase, _, _ in jax_loop] == [
        status.WARMING, status.EXPIRING, status.READY,
    ]  # fmt: skip
    for (_, jax_status, _), (_, torch_status, _) in zip(jax_loop, torch_loop, strict=True):
        assert set(torch_status) == set(jax_status)
        assert torch_status.get("cache") == jax_status.get("cache")
    [expiry] = torch_loop[1][2]
    assert expiry["spec"]["template"]["spec"]["containers"][0]["command"][2:4] == ["--framework", "pytorch"]
    # A Ready PyTorch cache lets its consumers start without a gate, as a JAX one does.
    ready = torch | {"status": torch_loop[2][1]}
    assert "schedulingGates" not in admission.mutate(training_pod(), ready).pod["spec"]


def test_another_image_is_named_with_what_torchs_key_holds() -> None:
    pod = training_pod()
    pod["spec"]["containers"][0]["image"] = "registry.example/trainer:2.0"
    [warning] = [w for w in admission.mutate(pod, torch_cache()).warnings if "warm-up's image" in w]
    assert "a hash of torch's sources" in warning and "jax" not in warning
