"""The injected runtime in the pods the operator makes and mutates (pure: manifests in, manifests out).

With ``COMPILECACHE_RUNTIME_IMAGE``, training pods (the webhook) and warm-up and expiry pods (the Job
builder) get an ``emptyDir``, a first init container of the runtime image copying the package into
it (exec form, non-root, read-only root, no capabilities, small resources), a read-only mount in
each container that uses the cache and ``PYTHONPATH`` with it first; the Jobs run
``python3 -m compilecache.cli``. Without the variable, nothing of it: the image's own package.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.cache import units
from compilecache.controller import admission, expiryjob, jobs, policy, runtime, template
from compilecache.controller.api import SpecError, parse_spec
from compilecache.controller.pools import resolve_pools
from k8snames import KUBERNETES_VERSIONS
from specs import cache, cluster
from test_admission import LABELLED, pod

IMAGE = "registry.example.com/ml/compilecache-runtime:0.1.0"
RULES = policy.from_env({runtime.IMAGE_ENV: IMAGE, runtime.PULL_POLICY_ENV: "IfNotPresent"})
MOUNT = {"name": runtime.VOLUME, "mountPath": runtime.MOUNT_PATH, "readOnly": True}


def pythonpath(container: dict[str, Any]) -> str | None:
    return next((e.get("value") for e in container.get("env", []) if e["name"] == "PYTHONPATH"), None)


def check_init_container(pod_spec: dict[str, Any]) -> None:
    first = pod_spec["initContainers"][0]
    assert first["name"] == runtime.VOLUME and first["image"] == IMAGE and first["imagePullPolicy"] == "IfNotPresent"
    assert first["command"] == ["cp", "-R", "/opt/runtime/.", "/compilecache-runtime/"]
    assert first["volumeMounts"] == [{"name": runtime.VOLUME, "mountPath": runtime.MOUNT_PATH}]
    context = first["securityContext"]
    assert context["runAsNonRoot"] and not context["allowPrivilegeEscalation"] and context["readOnlyRootFilesystem"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert first["resources"]["limits"] == first["resources"]["requests"] == {"cpu": "100m", "memory": "64Mi"}
    assert {"name": runtime.VOLUME, "emptyDir": {}} in pod_spec["volumes"]


def test_the_operator_has_a_runtime_only_when_the_image_is_set() -> None:
    assert policy.from_env({}).runtime is None and policy.from_env({runtime.IMAGE_ENV: " "}).runtime is None
    assert RULES.runtime == runtime.Runtime(IMAGE, "IfNotPresent")
    for bad in ({runtime.IMAGE_ENV: "a b"}, {runtime.IMAGE_ENV: IMAGE, runtime.PULL_POLICY_ENV: "Sometimes"}):
        with pytest.raises(policy.PolicyError):
            policy.from_env(bad)


def test_a_training_pod_gets_the_runtime_first_and_on_pythonpath_in_each_cache_container() -> None:
    original = pod(LABELLED)
    original["spec"]["containers"][1]["env"] = [{"name": "PYTHONPATH", "value": "/app:/lib"}]
    result = admission.mutate(original, cache(), rules=RULES)
    spec = result.pod["spec"]
    check_init_container(spec)
    assert spec["initContainers"][1]["name"] == "fetch" and "volumeMounts" not in spec["initContainers"][1]
    train, sidecar = spec["containers"]
    assert MOUNT in train["volumeMounts"] and MOUNT in sidecar["volumeMounts"]
    assert pythonpath(train) == "/compilecache-runtime"
    assert pythonpath(sidecar) == "/compilecache-runtime:/app:/lib"  # the container's own, after ours
    assert result.skipped == ()
    again = admission.mutate(result.pod, cache(), rules=RULES)
    assert again.pod == result.pod, "a second mutation must change nothing"
    # What the API server then stores must be a valid Pod (init container, volume, mounts, env).
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", **result.pod}, KUBERNETES_VERSIONS[-1], strict=True
    )


def test_without_a_runtime_nothing_of_it_is_added() -> None:
    spec = admission.mutate(pod(LABELLED), cache(), rules=policy.DEFAULT).pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch"]
    assert all(pythonpath(c) is None for c in spec["containers"])
    assert all(v["name"] != runtime.VOLUME for v in spec["volumes"])


def test_the_users_own_names_win_and_are_recorded() -> None:
    own_volume = pod(LABELLED, volumes=[{"name": runtime.VOLUME, "configMap": {"name": "x"}}])
    result = admission.mutate(own_volume, cache(), rules=RULES)
    assert [c["name"] for c in result.pod["spec"]["initContainers"]] == ["fetch"]
    assert "the runtime is not injected" in result.pod["metadata"]["annotations"][admission.ANNOTATION_SKIPPED]
    from_secret = pod(LABELLED)
    from_secret["spec"]["containers"][0]["env"] = [
        {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    ]
    result = admission.mutate(from_secret, cache(), rules=RULES)
    assert result.pod["spec"]["containers"][0]["env"][0] == from_secret["spec"]["containers"][0]["env"][0]
    assert any("PYTHONPATH comes from valueFrom" in item for item in result.skipped)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["", "/app", "/compilecache-runtime", "/x:/compilecache-runtime"]), max_size=2),
)
def test_mutation_only_adds_and_is_idempotent(values: list[str]) -> None:
    original = pod(LABELLED)
    for container, value in zip(original["spec"]["containers"], values, strict=False):
        container["env"] = [{"name": "PYTHONPATH", "value": value}]
    first = admission.mutate(copy.deepcopy(original), cache(), rules=RULES).pod
    assert admission.mutate(first, cache(), rules=RULES).pod == first
    for before, after in zip(original["spec"]["containers"], first["spec"]["containers"], strict=True):
        own = pythonpath(before)
        path = pythonpath(after)
        assert path is not None and path.split(":")[0] == runtime.MOUNT_PATH
        if own:
            assert path.endswith(own)


def test_warm_up_and_expiry_jobs_run_the_injected_package_on_the_images_python() -> None:
    obj = cache()
    spec = parse_spec(obj["spec"])
    [pool, *_] = resolve_pools(spec, cluster())
    plain = jobs.warmup_job(obj, spec, pool)["spec"]["template"]["spec"]
    assert plain["containers"][0]["command"][:2] == ["compilecache", "warm"]
    pod_spec = jobs.warmup_job(obj, spec, pool, runtime=RULES.runtime)["spec"]["template"]["spec"]
    check_init_container(pod_spec)
    warm = pod_spec["containers"][0]
    assert warm["command"][:4] == ["python3", "-m", "compilecache.cli", "warm"]
    assert warm["command"][4:] == plain["containers"][0]["command"][2:]
    assert MOUNT in warm["volumeMounts"] and pythonpath(warm) == runtime.MOUNT_PATH
    expiry = expiryjob.expiry_job(obj, spec, ["w"], runtime=RULES.runtime)["spec"]["template"]["spec"]
    check_init_container(expiry)
    [container] = expiry["containers"]
    assert container["command"][:4] == ["python3", "-m", "compilecache.cli", "expire"]
    assert MOUNT in container["volumeMounts"] and pythonpath(container) == runtime.MOUNT_PATH


def qos_class(pod_spec: dict[str, Any]) -> str:
    """The pod's QoS class by Kubernetes' rule (pkg/apis/core/helper/qos: ComputePodQOS): over containers and
    init containers together, Guaranteed when each has cpu and memory limits and the summed requests of each
    resource equal its summed limits (a request left out is the limit: the API server defaults it so)."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for container in [*pod_spec.get("containers", []), *pod_spec.get("initContainers", [])]:
        resources = container.get("resources") or {}
        own_limits = {k: units.parse_quantity(v) for k, v in (resources.get("limits") or {}).items()}
        own_requests = {k: units.parse_quantity(v) for k, v in (resources.get("requests") or {}).items()}
        own_requests = {**own_limits, **own_requests}
        for kind, values in ((requests, own_requests), (limits, own_limits)):
            for name in ("cpu", "memory"):
                if values.get(name):
                    kind[name] = kind.get(name, Decimal(0)) + values[name]
        guaranteed &= {"cpu", "memory"} <= {name for name, value in own_limits.items() if value}
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


quantities = st.tuples(st.integers(1, 64), st.integers(1, 512))


@settings(max_examples=40, deadline=None)
@given(st.lists(quantities, min_size=1, max_size=3), st.booleans())
def test_a_guaranteed_pod_stays_guaranteed(sizes: list[tuple[int, int]], with_requests: bool) -> None:
    # GPU training pods are Guaranteed for the static CPU and memory managers (exclusive cores, NUMA
    # alignment with the GPUs); an init container whose requests differ from its limits makes the pod
    # Burstable, and the kubelet then gives it no exclusive core. LimitRanges' maxLimitRequestRatio too.
    original = pod(LABELLED)
    original["spec"]["containers"] = [
        {"name": f"c{index}", "image": "trainer:1.2", "resources": {"limits": {"cpu": f"{cpu}", "memory": f"{mib}Gi"}}}
        for index, (cpu, mib) in enumerate(sizes)
    ]
    original["spec"]["initContainers"] = []
    if with_requests:
        for container in original["spec"]["containers"]:
            container["resources"]["requests"] = dict(container["resources"]["limits"])
    assert qos_class(original["spec"]) == "Guaranteed"
    mutated = admission.mutate(original, cache(), rules=RULES).pod["spec"]
    assert mutated["initContainers"][0]["name"] == runtime.VOLUME
    assert qos_class(mutated) == "Guaranteed", mutated["initContainers"][0]["resources"]
    init = mutated["initContainers"][0]["resources"]
    assert init["requests"] == init["limits"], "a LimitRange's maxLimitRequestRatio (1 and up) must hold"


def effective(container: dict[str, Any], name: str) -> str | None:
    """The value the kubelet gives a variable: its env is read in order into a map, the last entry
    winning (pkg/kubelet makeEnvironmentVariables: ``tmpEnv[envVar.Name] = runtimeVal``)."""
    values = [item.get("value") for item in container.get("env") or [] if item.get("name") == name]
    return values[-1] if values else None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["/a", "/b:/c", "", "/compilecache-runtime"]), min_size=2, max_size=3))
def test_a_pythonpath_set_twice_gets_the_runtime_in_the_value_that_counts(values: list[str]) -> None:
    # The API server takes a name twice in env (with a warning); the kubelet keeps the last one.
    original = pod(LABELLED)
    original["spec"]["containers"][0]["env"] = [{"name": "PYTHONPATH", "value": value} for value in values]
    result = admission.mutate(original, cache(), rules=RULES)
    train = result.pod["spec"]["containers"][0]
    path = effective(train, "PYTHONPATH")
    assert path is not None and path.split(":")[0] == runtime.MOUNT_PATH, train["env"]
    assert path.endswith(values[-1]), "the container's own value stays, after ours"
    assert admission.mutate(result.pod, cache(), rules=RULES).pod == result.pod


TRAINING = {"name": "train", "image": "registry.example/trainer:1.2"}


@pytest.mark.parametrize(
    ("container", "volumes", "why"),
    [
        (
            {**TRAINING, "env": [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]},
            [],
            "env PYTHONPATH comes from valueFrom",
        ),
        (
            {**TRAINING, "volumeMounts": [{"name": "lib", "mountPath": runtime.MOUNT_PATH}]},
            [{"name": "lib", "configMap": {"name": "lib"}}],
            f"mount path {runtime.MOUNT_PATH} is taken",
        ),
        (
            {**TRAINING, "volumeMounts": [{"name": "lib", "mountPath": runtime.MOUNT_PATH + "/"}]},
            [{"name": "lib", "configMap": {"name": "lib"}}],
            f"mount path {runtime.MOUNT_PATH} is taken",
        ),
        (
            {**TRAINING, "volumeMounts": [{"name": runtime.VOLUME, "mountPath": "/lib"}]},
            [{"name": runtime.VOLUME, "configMap": {"name": "lib"}}],
            f"volume {runtime.VOLUME}: the pod has its own",
        ),
    ],
)
def test_a_template_in_the_runtimes_way_is_refused_not_a_warm_up_that_cannot_start(
    container: dict[str, Any], volumes: list[dict[str, Any]], why: str
) -> None:
    # The warm-up's container takes training's env, volumes and mounts (podTemplate): where those leave
    # the runtime out, python3 -m compilecache.cli finds no compilecache (or the template's own), so the
    # Job fails for a reason no status names. The spec is refused instead, naming the template's field.
    obj = cache()
    obj["spec"]["warmup"]["podTemplate"] = {"spec": {"containers": [container], "volumes": volumes}}
    spec = template.resolve(parse_spec(obj["spec"]), None)
    [pool, *_] = resolve_pools(spec, cluster())
    jobs.warmup_job(obj, spec, pool)  # without a runtime the template is fine
    with pytest.raises(SpecError) as caught:
        jobs.warmup_job(obj, spec, pool, runtime=RULES.runtime)
    assert caught.value.field == "spec.warmup.podTemplate.spec" and why in str(caught.value)


def starts(pod_spec: dict[str, Any], container: dict[str, Any], image_uid: int) -> bool:
    """Whether the kubelet starts ``container`` by its non-root check (pkg/kubelet/kuberuntime
    verifyRunAsNonRoot on the effective context: the container's fields over the pod's)."""
    context = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    if not context.get("runAsNonRoot"):
        return True
    uid = context.get("runAsUser")
    return (uid if uid is not None else image_uid) != 0


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([None, 0, 1000]), st.sampled_from([None, False, True]))
def test_the_runtime_starts_in_a_pod_that_runs_as_root(run_as_user: int | None, non_root: bool | None) -> None:
    # NGC images run as root, and pods say so (runAsUser: 0): the kubelet refused our init container
    # ("container's runAsUser breaks non-root policy"), so the training pod never left Init.
    original = pod(LABELLED)
    pairs = (("runAsUser", run_as_user), ("runAsNonRoot", non_root))
    context = {key: value for key, value in pairs if value is not None}
    if context:
        original["spec"]["securityContext"] = context
    mutated = admission.mutate(original, cache(), rules=RULES).pod["spec"]
    ours = mutated["initContainers"][0]
    dockerfile = (Path(__file__).parents[1] / "images" / "runtime" / "Dockerfile").read_text()
    assert f"ARG UID={runtime.UID}\n" in dockerfile, "the image's user is the one the operator names"
    assert ours["name"] == runtime.VOLUME and starts(mutated, ours, runtime.UID), ours["securityContext"]
    if run_as_user != 0:  # left to the image's USER or the platform (OpenShift's SCC assigns one)
        assert "runAsUser" not in ours["securityContext"]
    assert admission.mutate(mutated | {"metadata": original["metadata"]}, cache(), rules=RULES).skipped == ()
