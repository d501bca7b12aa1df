"""What a cache author can make the operator's pods get, held on what the pods really get (issue 28).

Each reproduction of the issue, through admission (``policy.admission_violations``, the validating
webhook's check), a pass (``plan.plan``) and the pod webhook (``admission.admit``):
- the GPU cap held on the accelerators a warm-up pod really asks for, whatever field they come from;
- a GCS cache's writer is the identity its warm-up and expiry pods run as, and never a training pod's;
- the expiry Job runs with the warm-up's identity and pull Secrets;
- Secrets, projected tokens and secret-manager CSI volumes only as the policy allows;
- the pod webhook applies the policy in force, not the one the cache was admitted under.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from compilecache.controller import admission, expiryjob, jobs, plan, policy
from compilecache.controller.api import parse_cache
from compilecache.controller.pools import resolve_pools
from compilecache.controller.snapshot import Cache, Snapshot
from specs import PRODUCT, cache, cache_spec, cluster

NOW = "2026-11-26T10:00:00Z"
IMAGE = "registry.example/trainer:1.2"
H100 = {"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}}


def warmup(**fields: Any) -> dict[str, Any]:
    return cache_spec()["warmup"] | fields


def pass_of(obj: dict[str, Any], rules: policy.Policy = policy.DEFAULT) -> plan.Plan:
    return plan.plan(Snapshot(Cache.read(obj), nodes=tuple(cluster()), policy=rules), NOW)


def created_jobs(result: plan.Plan) -> list[dict[str, Any]]:
    return [dict(create.manifest) for create in result.creates if create.manifest["kind"] == "Job"]


def template(**pod: Any) -> dict[str, Any]:
    """A training pod spec for ``warmup.podTemplate.spec``."""
    return {"containers": [{"name": "train", "image": IMAGE, "command": ["python", "train.py"]}]} | pod


# --- accelerators -------------------------------------------------------------------------------------


def test_the_gpu_cap_cannot_be_bypassed_through_warmup_resources() -> None:
    """The issue's reproduction: a pool of an unknown resource with 0 GPUs, and 64 nvidia.com/gpu in resources."""
    gpus = {"nvidia.com/gpu": "64"}
    spec = warmup(pools=[{**H100, "gpuResource": "example.com/none", "gpusPerPod": 0}])
    del spec["discover"]  # no pool counts nvidia.com/gpu: the spec's own check does not see it
    obj = cache(warmup=spec | {"resources": {"requests": gpus, "limits": gpus}})
    found = policy.admission_violations(obj, policy.DEFAULT)
    assert [path for path, _ in found] == ["spec.warmup.resources.requests.nvidia.com/gpu"], found
    assert "64 accelerators" in found[0][1] and "policy's 8" in found[0][1]
    result = pass_of(obj)
    assert result.status["phase"] == "Failed" and not result.creates
    assert "spec.warmup.resources.requests.nvidia.com/gpu" in result.status["message"]


def test_accelerators_of_several_kinds_add_up_against_the_cap() -> None:
    """8 GPUs of the pool (its nodes' count, known to the pass only) and one AMD GPU: 9 above a cap of 8."""
    amd = {"amd.com/gpu": "1"}
    obj = cache(warmup=warmup(resources={"requests": amd, "limits": amd}))
    assert policy.admission_violations(obj, policy.DEFAULT) == []  # a discovered pool's GPUs are the pass's
    result = pass_of(obj)
    assert result.status["phase"] == "Failed" and not result.creates
    assert "spec.warmup.resources.requests.amd.com/gpu" in result.status["message"]
    assert pass_of(obj, policy.parse({"maxGpusPerPod": 9})).status["phase"] != "Failed"
    # A resource the policy does not count is no accelerator (a NIC, say).
    nic = {"example.com/rdma": "4"}
    assert pass_of(cache(warmup=warmup(resources={"requests": nic, "limits": nic}))).status["phase"] != "Failed"


def test_a_pod_counts_accelerators_as_the_scheduler_does() -> None:
    """Containers add up; init containers run one at a time, so the largest counts when it is larger."""
    gpus = lambda count: {"resources": {"limits": {"nvidia.com/gpu": count}}}  # noqa: E731
    pod = {"containers": [gpus(2), gpus("3")], "initContainers": [gpus(4), gpus(1)]}
    assert policy.pod_accelerators(pod, policy.DEFAULT, "nvidia.com/gpu") == Decimal(5)
    pod["initContainers"].append(gpus(7))
    assert policy.pod_accelerators(pod, policy.DEFAULT, "nvidia.com/gpu") == Decimal(7)
    # The pool's own resource counts even when the policy names no such accelerator.
    odd = {"containers": [{"resources": {"limits": {"example.com/tpu-ish": 16}}}]}
    assert policy.pod_accelerators(odd, policy.DEFAULT, "example.com/tpu-ish") == Decimal(16)
    assert policy.pod_accelerators(odd, policy.DEFAULT, "nvidia.com/gpu") == Decimal(0)


def test_pod_violations_name_each_rule_a_pod_breaks() -> None:
    """The last check before a Job is created, on the pod itself."""
    pod = {
        "serviceAccountName": "cluster-admin-ish",
        "nodeSelector": {"kubernetes.io/hostname": "n1"},
        "initContainers": [{"name": "a", "image": "docker.io/x:latest"}],
        "containers": [
            {
                "name": "b",
                "image": "plain:1",
                "resources": {"limits": {"nvidia.com/gpu": 9}},
                "envFrom": [{"secretRef": {"name": "db-password"}}],
            }
        ],
        "volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}],
    }
    found = dict(policy.pod_violations(pod, policy.DEFAULT, "nvidia.com/gpu", "Job x"))
    assert set(found) == {
        "Job x: initContainers[0].image",
        "Job x: containers[0].image",
        "Job x: containers[0].envFrom[0].secretRef.name",
        "Job x: serviceAccountName",
        "Job x: automountServiceAccountToken",
        "Job x: resources",
        "Job x.nodeSelector.kubernetes.io/hostname",
        "Job x: volumes[0].projected.sources[0].serviceAccountToken",
    }, found
    assert "9 accelerators" in found["Job x: resources"]


# --- identities ---------------------------------------------------------------------------------------


GCS_WITHOUT_WRITER = {"gcs": {"bucket": "my-caches", "prefix": "p", "readerServiceAccountName": "trainer"}}
ACCOUNTS = policy.parse({"serviceAccounts": {"allow": ["default", "trainer", "cache-writer", "cache-reader"]}})


def test_a_gcs_cache_without_a_writer_cannot_make_training_the_writer() -> None:
    """The issue's reproduction: no writer, training's template runs as trainer, and trainer is the reader."""
    obj = cache(
        storage=GCS_WITHOUT_WRITER,
        warmup=warmup(podTemplate={"spec": template(serviceAccountName="trainer")}),
    )
    found = policy.admission_violations(obj, ACCOUNTS)
    assert found == [("spec.storage.gcs", found[0][1])] and "names no writer" in found[0][1], found
    assert pass_of(obj, ACCOUNTS).status["phase"] == "Failed"


@pytest.mark.parametrize(
    "storage",
    [
        {"gcs": {"bucket": "my-caches", "serviceAccountName": "default"}},
        {"gcs": {"bucket": "my-caches"}},
    ],
    ids=["writer-default", "warmup-default"],
)
def test_a_gcs_cache_whose_writer_is_default_is_refused(storage: dict[str, Any]) -> None:
    """Every pod that names no ServiceAccount runs as default: training's would be the writer."""
    spec = warmup(serviceAccountName="default") if "serviceAccountName" not in storage["gcs"] else warmup()
    found = policy.admission_violations(cache(storage=storage, warmup=spec), ACCOUNTS)
    assert len(found) == 1 and "must not be default" in found[0][1], found


def test_the_writer_is_what_warm_up_and_expiry_pods_run_as_and_training_never_gets_it() -> None:
    gcs = {"gcs": {"bucket": "my-caches", "serviceAccountName": "cache-writer", "readerServiceAccountName": "trainer"}}
    obj = cache(storage=gcs, warmup=warmup(podTemplate={"spec": template(serviceAccountName="trainer")}))
    assert policy.admission_violations(obj, ACCOUNTS) == []
    made = created_jobs(pass_of(obj, ACCOUNTS))
    spec = parse_cache(obj)
    made.append(expiryjob.expiry_job(obj, spec, [made[0]["metadata"]["name"]]))
    assert {job["spec"]["template"]["spec"]["serviceAccountName"] for job in made} == {"cache-writer"}
    # Training pods: their own account stays; the writer is swapped for the reader.
    trainer = {"metadata": {"namespace": "default", "labels": {jobs.LABEL_CACHE: "llama"}}, "spec": template()}
    named_writer = copy.deepcopy(trainer)
    named_writer["spec"]["serviceAccountName"] = "cache-writer"
    for pod, expected in ((trainer, "trainer"), (named_writer, "trainer")):
        admitted = admission.admit(pod, [obj], rules=ACCOUNTS).pod
        assert admitted["spec"]["serviceAccountName"] == expected


def test_the_expiry_job_runs_with_the_warm_ups_identity_and_pull_secrets() -> None:
    """The issue's reproduction: the warm-up got trainer and regcred from the template, the expiry neither."""
    pod = template(serviceAccountName="trainer", imagePullSecrets=[{"name": "regcred"}])
    obj = cache(warmup=warmup(podTemplate={"spec": pod}, imagePullSecrets=[{"name": "mirror"}]))
    spec = parse_cache(obj)
    [warm, *_] = [jobs.warmup_job(obj, spec, pool) for pool in resolve_pools(spec, cluster())]
    expiry = expiryjob.expiry_job(obj, spec, [warm["metadata"]["name"]])
    for job in (warm, expiry):
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["serviceAccountName"] == "trainer"
        assert pod_spec["imagePullSecrets"] == [{"name": "mirror"}, {"name": "regcred"}]
    container = expiry["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    assert not [name for name in container["resources"]["limits"] if "/" in name]  # no accelerator


# --- credentials --------------------------------------------------------------------------------------


TOKEN = {"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "audience": "x"}}]}}
SECRET_VOLUME = {"name": "hf", "secret": {"secretName": "hf-token"}}
PROJECTED_SECRET = {"name": "mix", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "db"}}]}}
VAULT = {
    "name": "vault",
    "csi": {"driver": "secrets-store.csi.k8s.io", "volumeAttributes": {"secretProviderClass": "x"}},
}
CERTIFICATE = {
    "name": "cert",
    "projected": {"sources": [{"podCertificate": {"signerName": "x/y", "keyType": "ED25519"}}]},
}


@pytest.mark.parametrize(
    ("volume", "path", "allowing"),
    [
        (TOKEN, "volumes[0].projected.sources[0].serviceAccountToken", {"serviceAccountTokens": True}),
        (CERTIFICATE, "volumes[0].projected.sources[0].podCertificate", {"serviceAccountTokens": True}),
        (SECRET_VOLUME, "volumes[0].secret.secretName", {"secrets": {"allow": ["hf-*"]}}),
        (PROJECTED_SECRET, "volumes[0].projected.sources[1].secret.name", {"secrets": {"allow": ["db"]}}),
        (VAULT, "volumes[0].csi.driver", {"csiDrivers": {"allow": ["*"], "deny": []}}),
    ],
    ids=["token", "pod-certificate", "secret", "projected-secret", "secrets-store-csi"],
)
def test_a_template_volume_with_a_credential_needs_the_policy(
    volume: dict[str, Any], path: str, allowing: dict[str, Any]
) -> None:
    mounts = [{"name": volume["name"], "mountPath": "/creds"}]
    pod = template(volumes=[volume])
    pod["containers"][0]["volumeMounts"] = mounts
    obj = cache(warmup=warmup(podTemplate={"spec": pod}))
    found = policy.admission_violations(obj, policy.DEFAULT)
    assert [where for where, _ in found] == [f"spec.warmup.podTemplate.spec.{path}"], found
    assert pass_of(obj).status["phase"] == "Failed"
    assert policy.admission_violations(obj, policy.parse(allowing)) == []
    made = created_jobs(pass_of(obj, policy.parse(allowing)))
    assert made and all(volume in job["spec"]["template"]["spec"]["volumes"] for job in made)


def test_secrets_in_the_environment_need_the_policy() -> None:
    secret_env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "t"}}}]
    pod = template()
    pod["containers"][0]["envFrom"] = [{"secretRef": {"name": "wandb"}}]
    obj = cache(warmup=warmup(podTemplate={"spec": pod}))
    obj["spec"]["warmup"]["workloads"][0]["env"] = secret_env
    found = [path for path, _ in policy.admission_violations(obj, policy.DEFAULT)]
    assert found == [
        "spec.warmup.workloads[0].env[0].valueFrom.secretKeyRef.name",
        "spec.warmup.podTemplate.spec.containers[0].envFrom[0].secretRef.name",
    ]
    assert policy.admission_violations(obj, policy.parse({"secrets": {"allow": ["hf-token", "wandb"]}})) == []


def test_an_unknown_projected_source_is_refused() -> None:
    odd = {"name": "odd", "projected": {"sources": [{"futureCredential": {"path": "x"}}]}}
    found = policy.admission_violations(
        cache(warmup=warmup(podTemplate={"spec": template(volumes=[odd])})), policy.DEFAULT
    )
    assert [path for path, _ in found] == [
        "spec.warmup.podTemplate.spec.volumes[0].projected.sources[0].futureCredential"
    ]


# --- the pod webhook applies the policy in force ------------------------------------------------------


def test_the_pod_webhook_gives_nothing_of_a_cache_the_policy_in_force_refuses() -> None:
    """The issue's reproduction: a reader the policy refuses (tightened since, or the validating webhook off)
    was still put on training pods, even while the cache was Failed."""
    gcs = {
        "gcs": {"bucket": "my-caches", "serviceAccountName": "cache-writer", "readerServiceAccountName": "cache-reader"}
    }
    obj = cache(storage=gcs) | {"status": {"phase": "Failed"}}
    pod = {"metadata": {"namespace": "default", "labels": {jobs.LABEL_CACHE: "llama"}}, "spec": template()}
    at_admission = admission.admit(pod, [obj], rules=ACCOUNTS)
    assert at_admission.pod["spec"]["serviceAccountName"] == "cache-reader"
    now = admission.admit(pod, [obj], rules=policy.DEFAULT)  # cache-writer and cache-reader no longer allowed
    assert now.pod == pod
    assert any(
        "refused by the operator's policy" in warning and "readerServiceAccountName" in warning
        for warning in now.warnings
    )


# --- no cache's reader is another cache's writer (review of issue 28) ---


def test_the_pod_webhook_never_hands_a_training_pod_the_writer_of_another_gcs_cache() -> None:
    """The reader is checked against its own cache's writers only. With the policy docs/security.md
    gives for examples/cache-gcs.yaml (``allow: [default, cache-writer, cache-reader]``), a second cache
    whose reader is ``cache-writer`` is admitted, and its training pods run as the first cache's
    writer: docs/gcs.md says "The writer is never handed out by the operator"."""
    rules = policy.parse({"serviceAccounts": {"allow": ["default", "cache-writer", "cache-reader"]}})
    first = cache(
        name="llama",
        storage={"gcs": {"bucket": "my-caches", "prefix": "llama", "serviceAccountName": "cache-writer",
                         "readerServiceAccountName": "cache-reader"}},
    )  # fmt: skip
    second = cache(
        name="other",
        uid="uid-2",
        storage={"gcs": {"bucket": "my-caches", "prefix": "other", "serviceAccountName": "cache-reader",
                         "readerServiceAccountName": "cache-writer"}},
    )  # fmt: skip
    assert policy.admission_violations(first, rules) == []
    pod = {
        "metadata": {"namespace": "default", "labels": {jobs.LABEL_CACHE: "other"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
    }
    admitted = admission.admit(pod, [first, second], rules=rules).pod
    writers = admission.writer_accounts(parse_cache(first))
    assert writers == {"cache-writer"}
    assert admitted["spec"].get("serviceAccountName") not in writers, admitted["spec"]
