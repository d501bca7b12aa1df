"""Warm-ups with training's own pod template (spec.warmup.podTemplate): parsing, Jobs, policy, the pass.

Pure: the Jobs built from a template are checked against the Kubernetes schemas (kubernetes-validate)
and the restricted Pod Security Standard (podsecurity.py), as test_multihost_jobs.py does.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import podsecurity
import specgen
from compilecache.controller import jobs, plan, policy, status, template
from compilecache.controller.api import SpecError, parse_spec
from compilecache.controller.pools import resolve_pools
from compilecache.controller.snapshot import Cache, Snapshot
from k8snames import KUBERNETES_VERSIONS
from specs import OPEN_POLICY, cache, cache_spec, cluster
from test_spec_property import check, field_exists, manifests

IMAGE = "registry.example/trainer:1.2"  # specs.cache_spec's warmup.image
NOW = "2026-11-21T10:00:00Z"


def training_pod_spec(**changes: Any) -> dict[str, Any]:
    """A training Job's pod spec: data on a claim, a config map, a secret, a sidecar that is not taken."""
    spec: dict[str, Any] = {
        "serviceAccountName": "default",
        "restartPolicy": "Never",  # not taken: the warm-up's own
        # Not copied (the pool places the warm-up); read only to leave out the pools training cannot use.
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "imagePullSecrets": [{"name": "pull"}],
        "containers": [
            {
                "name": "train",
                "image": IMAGE,
                "command": ["python", "/app/train.py"],  # not taken: the warm command runs the workload
                "workingDir": "/app",
                "env": [{"name": "DATA", "value": "/data/train.bin"}, {"name": "TMPDIR", "value": "/scratch"}],
                "envFrom": [{"configMapRef": {"name": "train-config"}}],
                "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}},  # not taken
                "securityContext": {"privileged": True},  # not taken: the warm-up's own
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "config", "mountPath": "/etc/train"},
                    {"name": "token", "mountPath": "/var/run/secrets/hf", "readOnly": True},
                    {"name": "work", "mountPath": "/work"},
                ],
            },
            {"name": "sidecar", "image": "registry.example/logger:1"},
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "training-data"}},
            {"name": "config", "configMap": {"name": "train-config"}},
            {"name": "token", "secret": {"secretName": "hf-token"}},
            {"name": "work", "emptyDir": {}},
        ],
    }
    spec.update(changes)
    return spec


def with_template(pod_template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    obj = cache(**spec)
    obj["spec"]["warmup"]["podTemplate"] = pod_template
    return obj


def warmup_jobs(obj: dict[str, Any], referenced: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    spec = template.resolve(parse_spec(obj["spec"]), referenced)
    return [jobs.warmup_job(obj, spec, pool) for pool in resolve_pools(spec, cluster())]


def test_an_inline_template_gives_the_warm_up_trainings_env_volumes_and_workdir() -> None:
    [job, *_] = warmup_jobs(with_template({"spec": training_pod_spec()}))
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["DATA"] == "/data/train.bin"
    assert env["TMPDIR"] == "/tmp"  # the operator's scratch wins over training's
    assert container["envFrom"] == [{"configMapRef": {"name": "train-config"}}]
    assert container["workingDir"] == "/app"
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    claim = {"claimName": "training-data", "readOnly": True}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": claim}
    assert volumes["config"] == {"name": "config", "configMap": {"name": "train-config"}}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["data"] == {"name": "data", "mountPath": "/data", "readOnly": True}  # never writes training data
    assert mounts["config"]["readOnly"] is True
    assert "readOnly" not in mounts["work"]  # the pod's own scratch
    assert mounts["cache"] == {"name": "cache", "mountPath": "/var/cache/compilecache"}  # read-write for the warmer
    assert pod["serviceAccountName"] == "default"
    assert pod["imagePullSecrets"] == [{"name": "pull"}]


def test_what_the_operator_supplies_wins_over_the_template() -> None:
    [job, *_] = warmup_jobs(with_template({"spec": training_pod_spec()}))
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"][:2] == ["compilecache", "warm"]
    assert container["securityContext"] == jobs.container_security_context()
    assert pod["securityContext"] == jobs.pod_security_context()
    assert pod["automountServiceAccountToken"] is False
    assert "pool" not in pod["nodeSelector"]  # the pool's placement
    pool = resolve_pools(parse_spec(cache_spec()), cluster())[0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": pool.gpus_per_pod}  # the pool's, not training's
    assert pool.gpus_per_pod != 1
    assert pod["restartPolicy"] == "Never"
    assert job["spec"]["template"]["metadata"]["labels"][jobs.LABEL_ROLE] == "warmup"


def test_jobs_from_a_template_are_schema_valid_and_restricted() -> None:
    for job in warmup_jobs(with_template({"spec": training_pod_spec()})):
        assert podsecurity.violations(job) == [], job
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(copy.deepcopy(job), version, strict=True)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("PodTemplate", lambda pod: {"kind": "PodTemplate", "template": {"spec": pod}}),
        ("Job", lambda pod: {"kind": "Job", "spec": {"template": {"spec": pod}}}),
        (
            "JobSet",
            lambda pod: {
                "kind": "JobSet",
                "spec": {"replicatedJobs": [{"name": "w", "template": {"spec": {"template": {"spec": pod}}}}]},
            },
        ),
    ],
)
def test_a_referenced_template_of_each_kind_gives_the_same_job_as_inline(kind: str, body: Any) -> None:
    inline = warmup_jobs(with_template({"spec": training_pod_spec(), "container": "train"}))
    referenced = warmup_jobs(
        with_template({"templateRef": {"kind": kind, "name": "training"}, "container": "train"}),
        body(training_pod_spec()),
    )
    assert [job["spec"] for job in referenced] == [job["spec"] for job in inline]


def test_the_named_container_is_taken() -> None:
    pod = training_pod_spec()
    pod["containers"].reverse()  # the sidecar first
    [job, *_] = warmup_jobs(with_template({"spec": pod, "container": "train"}))
    assert job["spec"]["template"]["spec"]["containers"][0]["workingDir"] == "/app"
    with pytest.raises(SpecError) as caught:
        parse_spec(with_template({"spec": pod, "container": "missing"})["spec"])
    assert caught.value.field == "spec.warmup.podTemplate.container"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            {"volumeMounts": [{"name": "nope", "mountPath": "/data"}]},
            "spec.warmup.podTemplate.spec.containers[0].volumeMounts[0].name",
            "names no volume",
        ),
        (
            {"volumeMounts": [{"name": "data", "mountPath": "/var/cache/compilecache"}]},
            "spec.warmup.podTemplate.spec.containers[0].volumeMounts[0].mountPath",
            "spec.mountPath",
        ),
        (
            {"volumeMounts": [{"name": "data", "mountPath": "/tmp"}]},
            "spec.warmup.podTemplate.spec.containers[0].volumeMounts[0].mountPath",
            "scratch",
        ),
        (
            {"envFrom": [{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]},
            "spec.warmup.podTemplate.spec.containers[0].envFrom[0]",
            "exactly one",
        ),
    ],
)
def test_a_container_that_cannot_be_used_is_refused_naming_the_field(change: dict, field: str, words: str) -> None:
    pod = training_pod_spec()
    pod["containers"][0].update(change)
    with pytest.raises(SpecError) as caught:
        parse_spec(with_template({"spec": pod})["spec"])
    assert caught.value.field == field and words in caught.value.message


def test_a_volume_named_like_the_warm_ups_own_is_refused() -> None:
    pod = training_pod_spec(volumes=[{"name": "cache", "emptyDir": {}}])
    pod["containers"][0]["volumeMounts"] = []
    with pytest.raises(SpecError) as caught:
        parse_spec(with_template({"spec": pod})["spec"])
    assert caught.value.field == "spec.warmup.podTemplate.spec.volumes[0].name"


def test_spec_and_template_ref_are_exclusive() -> None:
    both = {"spec": training_pod_spec(), "templateRef": {"kind": "Job", "name": "t"}}
    for value in (both, {}):
        with pytest.raises(SpecError) as caught:
            parse_spec(with_template(value)["spec"])
        assert caught.value.field == "spec.warmup.podTemplate"


def test_the_job_name_changes_with_trainings_env_not_with_its_volumes() -> None:
    def names(pod: dict[str, Any]) -> set[str]:
        return {job["metadata"]["name"] for job in warmup_jobs(with_template({"spec": pod}))}

    base = names(training_pod_spec())
    assert base.isdisjoint({job["metadata"]["name"] for job in warmup_jobs(cache())})
    other_claim = training_pod_spec()
    other_claim["volumes"][0] = {"name": "data", "persistentVolumeClaim": {"claimName": "other-data"}}
    assert names(other_claim) == base  # new data compiles the same programs
    other_env = training_pod_spec()
    other_env["containers"][0]["env"] = [{"name": "DATA", "value": "/data/other.bin"}]
    assert names(other_env).isdisjoint(base)  # an env var can enter what a script compiles


# The default policy, with the Secret of training_pod_spec() allowed (no Secret is, by default).
TEMPLATE_POLICY = policy.parse({"secrets": {"allow": ["hf-token"]}})

# --- policy -------------------------------------------------------------------------------------------


def test_a_template_asking_for_a_host_path_is_refused_by_the_policy() -> None:
    pod = training_pod_spec()
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/etc"}})
    obj = with_template({"spec": pod})
    found = policy.admission_violations(obj, TEMPLATE_POLICY)
    assert ("spec.warmup.podTemplate.spec.volumes[4]", found[0][1]) == found[0], found
    assert "hostPath" in found[0][1]


def test_a_template_running_as_a_service_account_the_policy_refuses_is_refused() -> None:
    obj = with_template({"spec": training_pod_spec(serviceAccountName="cluster-admin-ish")})
    found = policy.admission_violations(obj, TEMPLATE_POLICY)
    assert [path for path, _ in found] == ["spec.warmup.podTemplate.spec.serviceAccountName"], found
    # warmup.serviceAccountName wins over training's account: then that one is what the policy checks.
    obj["spec"]["warmup"]["serviceAccountName"] = "default"
    assert policy.admission_violations(obj, TEMPLATE_POLICY) == []


def test_the_pass_checks_a_referenced_template_against_the_policy() -> None:
    obj = with_template({"templateRef": {"kind": "Job", "name": "training"}})
    pod = training_pod_spec(volumes=[*training_pod_spec()["volumes"], {"name": "h", "hostPath": {"path": "/"}}])
    training = {"kind": "Job", "metadata": {"name": "training"}, "spec": {"template": {"spec": pod}}}
    result = plan.plan(
        Snapshot(Cache.read(obj), policy=TEMPLATE_POLICY, nodes=tuple(cluster()), template=training), NOW
    )
    assert result.status["phase"] == status.FAILED and not result.creates
    assert "templateRef (Job training: spec.template.spec).volumes[4]" in result.status["message"]


# --- the pass -----------------------------------------------------------------------------------------


def test_a_missing_reference_waits_naming_the_field_and_creates_nothing() -> None:
    obj = with_template({"templateRef": {"kind": "PodTemplate", "name": "training"}})
    result = plan.plan(Snapshot(Cache.read(obj), policy=TEMPLATE_POLICY, nodes=tuple(cluster())), NOW)
    assert result.status["phase"] == status.PENDING
    assert not result.creates
    ready = result.status["conditions"][0]
    assert ready["reason"] == plan.TEMPLATE_NOT_FOUND
    assert "spec.warmup.podTemplate.templateRef: PodTemplate training does not exist" in ready["message"]


def test_a_referenced_template_that_cannot_be_used_fails_naming_where() -> None:
    obj = with_template({"templateRef": {"kind": "PodTemplate", "name": "training"}})
    pod = training_pod_spec()
    pod["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/var/cache/compilecache"}]
    body = {"kind": "PodTemplate", "template": {"spec": pod}}
    result = plan.plan(Snapshot(Cache.read(obj), policy=TEMPLATE_POLICY, nodes=tuple(cluster()), template=body), NOW)
    assert result.status["phase"] == status.FAILED
    message = result.status["message"]
    assert "templateRef (PodTemplate training: template.spec).containers[0].volumeMounts[0].mountPath" in message


def test_a_referenced_template_that_exists_creates_the_jobs_with_it() -> None:
    obj = with_template({"templateRef": {"kind": "Job", "name": "training"}})
    body = {"kind": "Job", "spec": {"template": {"spec": training_pod_spec()}}}
    result = plan.plan(Snapshot(Cache.read(obj), policy=TEMPLATE_POLICY, nodes=tuple(cluster()), template=body), NOW)
    created = [create.manifest for create in result.creates if create.resource.plural == "jobs"]
    assert created and all(
        {"name": "data", "mountPath": "/data", "readOnly": True}
        in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        for job in created
    )


def test_a_cache_without_a_template_keeps_its_job_names() -> None:
    # The hash material gains "template" only when one is set (cache_hash): no re-warm on upgrade.
    spec = parse_spec(cache_spec())
    assert jobs.cache_hash(cache(), spec) == jobs.digest(
        {
            "cacheDir": spec.cache_dir,
            "mountPath": spec.mount_path,
            "image": spec.warmup.image,
            "workloads": [jobs._workload_material(w) for w in spec.warmup.workloads],
            "jax": [0.0, 0, None],
            "rewarm": None,
        }
    )


def _script_cache(pod: dict[str, Any], **workload: Any) -> dict[str, Any]:
    obj = with_template({"spec": pod})
    obj["spec"]["warmup"]["workloads"] = [{"name": "train", "script": "/app/train.py", "steps": 2, **workload}]
    return obj


def test_a_script_workload_without_args_runs_with_the_arguments_training_gives_its_script() -> None:
    pod = training_pod_spec()
    pod["containers"][0] |= {"command": ["python", "/app/./train.py"], "args": ["--config", "/etc/train/c.yaml"]}
    [job, *_] = warmup_jobs(_script_cache(pod))
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["compilecache", "warm"]  # the operator's command, training's arguments
    assert command[command.index("--") + 1 :] == ["--config", "/etc/train/c.yaml"]
    # A workload's own args win.
    [job, *_] = warmup_jobs(_script_cache(pod, args=["--config", "/etc/warm.yaml"]))
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--") + 1 :] == ["--config", "/etc/warm.yaml"]
    # Training running another script gives no arguments.
    pod["containers"][0]["command"] = ["python", "/app/other.py"]
    [job, *_] = warmup_jobs(_script_cache(pod))
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-1] == "--"


def test_the_job_name_changes_with_the_training_arguments_a_workload_takes() -> None:
    def names(training_args: list[str], **workload: Any) -> set[str]:
        pod = training_pod_spec()
        pod["containers"][0]["args"] = training_args
        return {job["metadata"]["name"] for job in warmup_jobs(_script_cache(pod, **workload))}

    assert names(["--config", "a.yaml"]).isdisjoint(names(["--config", "b.yaml"]))
    own = ["--config", "w.yaml"]
    assert names(["--config", "a.yaml"], args=own) == names(["--config", "b.yaml"], args=own)  # not taken: no re-warm


# --- any training template: valid objects, or a Failed status naming a field of the cache ------------------


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specgen.template_pod_specs(), st.booleans())
def test_any_training_template_gives_valid_objects_or_names_the_field(pod: dict[str, Any], usual: bool) -> None:
    """test_spec_property's property with training templates drawn (hostPath, duplicate or reserved mount
    paths, reserved env, privileged containers, host networking...), under the default policy too."""
    obj = with_template({"spec": pod})
    outcome = check(obj, cluster(), KUBERNETES_VERSIONS[-1:])
    event(outcome)
    try:
        objects = manifests(obj, cluster(), TEMPLATE_POLICY if usual else OPEN_POLICY)
    except SpecError as error:
        assert field_exists(obj, error.field), error
        return
    for job in objects:
        if job["kind"] == "Job":
            assert podsecurity.violations(job) == [], job
