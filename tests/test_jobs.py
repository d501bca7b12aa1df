"""Warm-up Job and claim manifests: placement, GPUs, cache volume, env, security, names."""

import pytest

from compilecache.controller import jobs
from compilecache.controller.api import parse_spec
from compilecache.controller.pools import resolve_pools
from compilecache.frameworks.jax.env import jax_cache_env
from specs import GPU, cache, cache_spec, cluster


def _jobs(obj):
    spec = parse_spec(obj["spec"])
    return [jobs.warmup_job(obj, spec, pool) for pool in resolve_pools(spec, cluster())]


def test_job_runs_on_its_pool_with_its_gpus_and_the_cache():
    obj = cache()
    h100 = next(job for job in _jobs(obj) if "h100" in job["metadata"]["name"])
    pod = h100["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert container["resources"]["limits"][GPU] == 8
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "jax-cache"}} in pod["volumes"]
    assert {"name": "cache", "mountPath": "/var/cache/compilecache"} in container["volumeMounts"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    for key, value in jax_cache_env("/var/cache/compilecache").items():
        assert env[key] == value
    assert container["command"][:4] == ["compilecache", "warm", "--cache-dir", "/var/cache/compilecache"]
    assert container["command"][-2:] == ["--workload", "examples.workloads.transformer:targets"]
    assert "--verify" in container["command"]


def test_job_is_owned_labelled_and_bounded():
    obj = cache()
    job = _jobs(obj)[0]
    meta = job["metadata"]
    assert meta["ownerReferences"] == [
        {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "name": "llama", "uid": "uid-1",
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert meta["labels"][jobs.LABEL_CACHE] == "llama"
    assert meta["labels"][jobs.LABEL_POOL] == "nvidia-a100-sxm4-40gb"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "compilecache-operator"
    assert jobs.LABEL_CACHE not in job["spec"]["template"]["metadata"]["labels"]  # would gate itself
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (2, 7200)
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400


def test_pods_are_non_root_with_read_only_root():
    pod = _jobs(cache())[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"] + pod.get("initContainers", []):
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_names_are_deterministic_and_change_only_with_compilation():
    base = _jobs(cache())
    assert [j["metadata"]["name"] for j in base] == [j["metadata"]["name"] for j in _jobs(cache())]
    assert all(len(j["metadata"]["name"]) <= 63 for j in base)

    lifecycle_changed = _jobs(cache(lifecycle={"maxAge": "3d"}, schedule="0 1 * * *"))
    assert [j["metadata"]["name"] for j in lifecycle_changed] == [j["metadata"]["name"] for j in base]

    warmup = cache_spec()["warmup"] | {"image": "registry.example/trainer:1.3"}
    image_changed = _jobs(cache(warmup=warmup))
    assert not {j["metadata"]["name"] for j in image_changed} & {j["metadata"]["name"] for j in base}

    rewarm = cache()
    rewarm["metadata"]["annotations"] = {jobs.ANNOTATION_REWARM: "2026-11-21"}
    assert not {j["metadata"]["name"] for j in _jobs(rewarm)} & {j["metadata"]["name"] for j in base}
    # ... but it compiles the same: the cache's hash (what a Ready cache keeps serving on) stays.
    spec = parse_spec(cache_spec())
    assert jobs.cache_hash(rewarm, spec) == jobs.cache_hash(cache(), spec)


def test_long_names_fit_63_characters():
    obj = cache(name="a-very-long-cache-name-that-goes-on-and-on-for-ever-and-ever")
    names = [job["metadata"]["name"] for job in _jobs(obj)]
    assert all(len(name) <= 63 for name in names)
    assert len(set(names)) == len(names)


def test_scripts_run_in_order_before_entrypoints():
    warmup = cache_spec()["warmup"]
    warmup["workloads"] = [
        {"name": "compile", "script": "/app/train_compile.py", "args": ["--steps", "1"]},
        {"name": "step", "entrypoint": "m:f", "env": [{"name": "MODEL_LAYERS", "value": "24"}]},
    ]
    pod = _jobs(cache(warmup=warmup))[0]["spec"]["template"]["spec"]
    init = pod["initContainers"][0]["command"]
    # Without steps a script runs whole epochs within the default budget (--steps auto).
    assert init[-6:] == ["--script=/app/train_compile.py", "--steps", "auto", "--", "--steps", "1"]
    assert pod["containers"][0]["command"][-2:] == ["--workload", "m:f"]
    assert {"name": "MODEL_LAYERS", "value": "24"} in pod["containers"][0]["env"]


def test_exact_mode_runs_the_script_with_its_step_count_and_keeps_other_job_names():
    warmup = cache_spec()["warmup"]
    plain = {"name": "train", "script": "/app/train.py", "args": ["--steps=100000"]}
    warmup["workloads"] = [plain | {"steps": 2, "stepFn": "_train_step"}]
    pod = _jobs(cache(warmup=warmup))[0]["spec"]["template"]["spec"]
    exact = ["--script=/app/train.py", "--steps", "2", "--step-fn", "_train_step", "--", "--steps=100000"]
    [command] = [c["command"] for c in [*pod.get("initContainers", []), *pod["containers"]]]
    assert command[-len(exact) :] == exact  # the script's own args after --
    # Without steps, a workload hashes as it did before the fields existed: no Job is renamed by the upgrade.
    material = jobs._workload_material(
        parse_spec({**cache_spec(), "warmup": warmup | {"workloads": [plain]}}).warmup.workloads[0]
    )
    assert set(material) == {"name", "entrypoint", "script", "args", "env"}
    stepped = [j["metadata"]["name"] for j in _jobs(cache(warmup=warmup))]
    assert stepped != [j["metadata"]["name"] for j in _jobs(cache(warmup=warmup | {"workloads": [plain]}))]


def test_steps_auto_passes_its_step_fn_and_budget_and_a_group_runs_to_the_end():
    warmup = cache_spec()["warmup"]
    workload = {"name": "train", "script": "/app/train.py", "stepFn": "_train_step", "budget": "1m30s"}
    warmup["workloads"] = [workload]
    [command] = [c["command"] for c in _jobs(cache(warmup=warmup))[0]["spec"]["template"]["spec"]["containers"]]
    flags = ["--steps", "auto", "--step-fn", "_train_step", "--budget", "90"]
    assert command[-8:] == ["--script=/app/train.py", *flags, "--"]
    # The budget is part of what the Job compiles: a new budget is a new Job.
    shorter = warmup | {"workloads": [workload | {"budget": "1m"}]}
    assert _jobs(cache(warmup=warmup))[0]["metadata"]["name"] != _jobs(cache(warmup=shorter))[0]["metadata"]["name"]
    spec = parse_spec({**cache_spec(), "warmup": warmup})
    # Processes of a group cannot agree on a clock: without steps, a group's script runs to its end.
    assert "--steps" not in jobs._warm_command(spec, list(spec.warmup.workloads), hosts=2)
    assert jobs._warm_command(spec, list(spec.warmup.workloads))[-7:-1] == flags


def test_exact_mode_passes_the_resumed_run_settings_to_the_warmer():
    warmup = cache_spec()["warmup"]
    base = {"name": "train", "script": "/app/train.py", "steps": 2}
    commands = []
    for extra in (
        {},
        {"resume": False},
        {"resumeArgs": ["--restore", "--ckpt=/tmp/c"]},
        {"resume": True},
        {"resumeWhen": "/tmp/c"},
    ):
        pod = _jobs(cache(warmup=warmup | {"workloads": [base | extra]}))[0]["spec"]["template"]["spec"]
        [command] = [c["command"] for c in [*pod.get("initContainers", []), *pod["containers"]]]
        commands.append(command[command.index("--steps") : command.index("--")])
    # The default (a resumed run when the first run left something) is the warmer's own: nothing on the
    # command line, Job names unchanged; resume: true always runs it.
    assert commands == [
        ["--steps", "2"],
        ["--steps", "2", "--no-resume"],
        ["--steps", "2", "--resume-arg=--restore", "--resume-arg=--ckpt=/tmp/c"],
        ["--steps", "2", "--resume"],
        ["--steps", "2", "--resume-when=/tmp/c"],
    ]


def test_gcs_job_has_no_volume_but_the_url_and_service_account():
    obj = cache(storage={"gcs": {"bucket": "my-caches", "prefix": "llama", "serviceAccountName": "writer"}})
    pod = _jobs(obj)[0]["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert pod["serviceAccountName"] == "writer"
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    assert env["JAX_COMPILATION_CACHE_DIR"] == "gs://my-caches/llama"


def test_claim_is_owned_only_when_asked():
    obj = cache()
    claim = jobs.claim(obj, parse_spec(obj["spec"]))
    assert claim is not None and "ownerReferences" not in claim["metadata"]
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}

    owned = cache(storage={"pvc": {"claimName": "c", "create": {"size": "1Gi"}, "deleteWithCache": True}})
    claim = jobs.claim(owned, parse_spec(owned["spec"]))
    assert claim is not None and claim["metadata"]["ownerReferences"][0]["uid"] == "uid-1"

    brought = cache(storage={"pvc": {"claimName": "mine"}})
    assert jobs.claim(brought, parse_spec(brought["spec"])) is None


def test_a_cache_name_too_long_for_a_label_fails_naming_metadata_name():
    # issue 9: a 64-character name became a label value the API server refuses (422, retried forever).
    from compilecache.controller.api import SpecError

    obj = cache(name="c" * 64)
    spec = parse_spec(obj["spec"])
    pool = resolve_pools(spec, cluster())[0]
    with pytest.raises(SpecError) as info:
        jobs.warmup_job(obj, spec, pool)
    assert info.value.field == "metadata.name"
    with pytest.raises(SpecError):
        jobs.claim(obj, spec)


@pytest.mark.parametrize(
    ("cache_name", "pool_name"),
    [("c" * 63, "p" * 63), ("a." * 31 + "b", "p" * 63), ("a" * 53 + ".b-c", "x"), ("a" * 54 + "-b", "y" * 10)],
)
def test_every_generated_name_and_label_is_legal_at_the_length_limits(cache_name, pool_name):
    from compilecache.controller import api, expiryjob

    obj = cache(name=cache_name, warmup={**cache_spec()["warmup"], "pools": [{"name": pool_name}]})
    obj["spec"]["warmup"].pop("discover")
    spec = api.parse_cache(obj)
    (pool,) = resolve_pools(spec, cluster())
    job = jobs.warmup_job(obj, spec, pool)
    expiry = expiryjob.expiry_job(obj, spec, [job["metadata"]["name"]])
    claim = jobs.claim(obj, spec)
    for made in (job, expiry):
        name = made["metadata"]["name"]
        # A Job's name is also a pod label value (job-name): a DNS subdomain of at most 63.
        assert api.is_dns_subdomain(name) and api.is_label_value(name), name
    for made in (job, expiry, claim):
        labels = {
            **made["metadata"]["labels"],
            **made["spec"].get("template", {}).get("metadata", {}).get("labels", {}),
        }
        assert all(api.is_qualified_name(k) and api.is_label_value(v) for k, v in labels.items()), labels
