"""The pod mutation as pure functions: which cache a pod uses, and what it gets (no server)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG
from compilecache.controller import admission, images, jobs, policy
from compilecache.controller.api import parse_spec
from compilecache.controller.pools import resolve_pools
from compilecache.frameworks.jax.env import NOT_IN_KEY, jax_cache_env, trainer_env
from specs import cache, cluster

GCS_WRITER_ONLY = {"gcs": {"bucket": "my-caches", "prefix": "caches/llama", "serviceAccountName": "cache-writer"}}
GCS = {"gcs": {**GCS_WRITER_ONLY["gcs"], "readerServiceAccountName": "cache-reader"}}


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod as the API server hands it to a webhook: namespace set, defaults applied."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "default", "labels": labels or {}},
        "spec": {
            "serviceAccountName": "default",
            # training's container on the warm-up's image (tests/specs.py), and a sidecar
            "containers": [
                {"name": "train", "image": "registry.example/trainer:1.2"},
                {"name": "sidecar", "image": "log:1"},
            ],
            "initContainers": [{"name": "fetch", "image": "fetch:1"}],
        },
    }
    body["spec"].update(spec)
    return body


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    return obj | {"status": {"phase": "Ready"}}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


LABELLED = {"compilecache.dev/cache": "llama"}
INJECT = {"compilecache.dev/inject": "true"}  # the opt-in of pods that consumers.podSelector may choose


def test_pvc_cache_mounts_read_only_in_every_container_with_the_warmers_env() -> None:
    llama = cache()
    result = admission.mutate(pod(LABELLED), llama)
    spec = result.pod["spec"]
    volume = {"name": "compilecache", "persistentVolumeClaim": {"claimName": "jax-cache", "readOnly": True}}
    assert spec["volumes"] == [volume]
    mount = {"name": "compilecache", "mountPath": "/var/cache/compilecache", "readOnly": True}
    assert [c["volumeMounts"] for c in spec["containers"]] == [[mount], [mount]]
    assert "volumeMounts" not in spec["initContainers"][0] and "env" not in spec["initContainers"][0]
    for container in spec["containers"]:
        assert env_of(container) == trainer_env(jax_cache_env("/var/cache/compilecache"), read_only=True)
    assert result.skipped == () and admission.ANNOTATION_SKIPPED not in result.pod["metadata"].get("annotations", {})
    assert spec["serviceAccountName"] == "default"  # PVC caches need no account


def test_env_is_exactly_the_warmup_jobs_env() -> None:
    llama = cache(warmup={**cache()["spec"]["warmup"], "jax": {"xlaFlags": "--xla_foo=1", "minCompileTimeSecs": 1.5}})
    spec = parse_spec(llama["spec"])
    job = jobs.warmup_job(llama, spec, resolve_pools(spec, cluster())[0])
    job_env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    pod_env = env_of(admission.mutate(pod(LABELLED), llama).pod["spec"]["containers"][0])
    in_key = {key: value for key, value in pod_env.items() if key not in NOT_IN_KEY}
    assert in_key == {key: job_env[key] for key in in_key}
    assert set(pod_env) == {*jax_cache_env("x", xla_flags="y"), REPORT, TERMINATION_LOG}  # XLA_FLAGS included
    assert pod_env[TERMINATION_LOG] == "/dev/termination-log"  # the kubelet's default file
    custom = pod(LABELLED)
    custom["spec"]["containers"][0]["terminationMessagePath"] = "/run/why"
    custom_env = env_of(admission.mutate(custom, llama).pod["spec"]["containers"][0])
    assert custom_env[TERMINATION_LOG] == "/run/why"  # the trainer writes where this container's kubelet reads
    # The warm-up reports as a warmer, never as a trainer; a read-only trainer tries no writes.
    assert REPORT not in job_env and pod_env[REPORT] == "1"
    assert float(pod_env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) > 3600 * 24 * 365
    writable = cache(warmup=llama["spec"]["warmup"], consumers={"readOnly": False})
    writer_env = env_of(admission.mutate(pod(LABELLED), writable).pod["spec"]["containers"][0])
    assert writer_env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "1.5"  # rank 0 may add entries


def test_pod_settings_that_change_the_key_are_warned_about_and_annotated() -> None:
    warmup = {**cache()["spec"]["warmup"], "jax": {"xlaFlags": "--xla_a=1"}}
    warmup["workloads"] = [{**warmup["workloads"][0], "env": [{"name": "JAX_ENABLE_X64", "value": "1"}]}]
    llama = cache(warmup=warmup)
    own = pod(LABELLED)
    own["spec"]["containers"][0]["env"] = [
        {"name": "XLA_FLAGS", "value": "--xla_b=2"},  # the cache's own: kept, skipped as before
        {"name": "LIBTPU_INIT_ARGS", "value": "--x"},  # not in the warm-up: warned
        {"name": "JAX_ENABLE_X64", "value": "1"},  # what the warm-up ran with: fine
        {"name": "JAX_PLATFORMS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},  # unknown
    ]
    result = admission.mutate(own, llama)
    annotation = result.pod["metadata"]["annotations"][admission.ANNOTATION_SKIPPED]
    assert "env XLA_FLAGS is set by the pod" in annotation
    assert "env LIBTPU_INIT_ARGS is '--x' but the warm-up ran with unset" in annotation
    # The sidecar lacks JAX_ENABLE_X64, which the warm-up set: its programs differ too.
    assert "container sidecar: env JAX_ENABLE_X64 is unset but the warm-up ran with '1'" in annotation
    assert "container train: env JAX_ENABLE_X64" not in annotation and "JAX_PLATFORMS" not in annotation
    assert any("LIBTPU_INIT_ARGS" in warning for warning in result.warnings)


def test_a_pod_without_the_warm_up_image_is_warned_but_mutated_all_the_same() -> None:
    llama = cache()  # warmup.image registry.example/trainer:1.2; the pod runs trainer:1.2 and log:1
    other = pod(LABELLED)
    other["spec"]["containers"][0]["image"] = "trainer:1.2"
    result = admission.mutate(other, llama)
    [warning] = [w for w in result.warnings if "warm-up's image" in w]
    assert warning.startswith("CompileCache llama: no container runs the warm-up's image registry.example/trainer:1.2")
    assert "(the pod runs trainer:1.2, log:1)" in warning and "jax/jaxlib/plugin versions" in warning
    assert result.pod["spec"]["volumes"]  # a warning only: the pod still gets its cache
    assert "image" not in result.pod["metadata"].get("annotations", {}).get(admission.ANNOTATION_SKIPPED, "")
    # Nothing warms its image: it is not held for the warm-up of another (images.py).
    assert "schedulingGates" not in result.pod["spec"]
    # One container on the warm-up's image is enough: the others may be sidecars.
    same = pod(LABELLED)
    assert not [w for w in admission.mutate(same, llama).warnings if "warm-up's image" in w]
    assert admission.mutate(same, llama).pod["spec"]["schedulingGates"] == [{"name": admission.GATE}]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("trainer:1.2", "docker.io/library/trainer:1.2", True),
        ("trainer", "trainer:latest", True),
        ("org/trainer:1", "docker.io/org/trainer:1", True),
        ("reg:5000/trainer", "reg:5000/trainer:latest", True),
        ("r.io/t:1@sha256:" + "a" * 64, "r.io/t@sha256:" + "a" * 64, True),
        ("r.io/t:1", "r.io/t:2", False),
        ("r.io/t:1", "t:1", False),
        ("r.io/t:1", "r.io/t@sha256:" + "a" * 64, False),  # which digest a tag names is unknown here
        ("r.io/t:1", "r.io/t:1@sha256:" + "a" * 64, True),  # a tag pinned by digest (GitOps)
        ("r.io/t:1@sha256:" + "a" * 64, "r.io/t:1@sha256:" + "b" * 64, False),
        ("localhost/t:1", "docker.io/localhost/t:1", False),
    ],
)
def test_image_references_compare_as_the_kubelet_resolves_them(a: str, b: str, same: bool) -> None:
    assert images.same_image(a, b) is same and images.same_image(b, a) is same


def test_not_ready_gates_ready_does_not_and_gate_false_does_not() -> None:
    gated = admission.mutate(pod(LABELLED), cache()).pod
    assert gated["spec"]["schedulingGates"] == [{"name": "compilecache.dev/warm"}]
    assert "schedulingGates" not in admission.mutate(pod(LABELLED), ready(cache())).pod["spec"]
    # Degraded has settled: the pools that warmed are served, and nothing would lift a gate sooner.
    degraded = cache() | {"status": {"phase": "Degraded"}}
    assert "schedulingGates" not in admission.mutate(pod(LABELLED), degraded).pod["spec"]
    for phase in ("Pending", "Warming", "Expiring", "Failed"):
        waiting = cache() | {"status": {"phase": phase}}
        assert admission.mutate(pod(LABELLED), waiting).pod["spec"]["schedulingGates"] == [{"name": admission.GATE}]
    ungated = cache(consumers={"gate": False})
    assert "schedulingGates" not in admission.mutate(pod(LABELLED), ungated).pod["spec"]


def test_gate_joins_the_pods_own_gates() -> None:
    own = pod(LABELLED, schedulingGates=[{"name": "example.com/quota"}])
    gates = admission.mutate(own, cache()).pod["spec"]["schedulingGates"]
    assert gates == [{"name": "example.com/quota"}, {"name": "compilecache.dev/warm"}]


def test_read_write_and_init_containers_when_asked() -> None:
    llama = cache(consumers={"readOnly": False, "initContainers": True})
    spec = admission.mutate(pod(LABELLED), llama).pod["spec"]
    assert spec["volumes"][0]["persistentVolumeClaim"]["readOnly"] is False
    for container in [*spec["containers"], *spec["initContainers"]]:
        assert container["volumeMounts"][0]["readOnly"] is False
        assert env_of(container)["JAX_COMPILATION_CACHE_DIR"] == "/var/cache/compilecache"


def test_custom_mount_path_is_where_jax_looks() -> None:
    spec = admission.mutate(pod(LABELLED), cache(mountPath="/mnt/jax/")).pod["spec"]
    assert spec["containers"][0]["volumeMounts"][0]["mountPath"] == "/mnt/jax"
    assert env_of(spec["containers"][0])["JAX_COMPILATION_CACHE_DIR"] == "/mnt/jax"


@pytest.mark.parametrize(
    ("storage", "account", "expected", "warned"),
    [
        # With a reader: the reader when the pod names none, or names the writer; the pod's own otherwise.
        (GCS, None, "cache-reader", False),
        (GCS, "default", "cache-reader", False),
        (GCS, "me", "me", False),
        (GCS, "cache-writer", "cache-reader", True),
        (GCS, "trainer-writer", "cache-reader", True),  # warmup.serviceAccountName writes too
        # Without one, the writer is never handed out: the pod's own, or the namespace's default.
        (GCS_WRITER_ONLY, None, None, True),
        (GCS_WRITER_ONLY, "default", "default", True),
        (GCS_WRITER_ONLY, "me", "me", False),
        (GCS_WRITER_ONLY, "cache-writer", "default", True),
    ],
)
def test_gcs_consumers_run_as_the_reader_never_the_writer(
    storage: dict[str, Any], account: str | None, expected: str | None, warned: bool
) -> None:
    body = pod(LABELLED)
    body["spec"].pop("serviceAccountName")
    if account is not None:
        body["spec"]["serviceAccountName"] = body["spec"]["serviceAccount"] = account
    warmup = (
        {**cache()["spec"]["warmup"], "serviceAccountName": "trainer-writer"} if account == "trainer-writer" else None
    )
    llama = cache(storage=storage, **({"warmup": warmup} if warmup else {}))
    result = admission.mutate(body, llama)
    spec = result.pod["spec"]
    assert "volumes" not in spec and "volumeMounts" not in spec["containers"][0]
    assert env_of(spec["containers"][0]) == trainer_env(jax_cache_env("gs://my-caches/caches/llama"), read_only=True)
    assert spec.get("serviceAccountName") == expected
    if account is not None:
        assert spec["serviceAccount"] == expected  # the deprecated alias agrees
    assert spec.get("serviceAccountName") not in ("cache-writer", "trainer-writer")
    notes = [w for w in result.warnings if "ServiceAccount" in w]
    assert bool(notes) is warned, result.warnings
    # Admitting the result again changes nothing (the webhook may see a pod twice).
    assert admission.json_patch(result.pod, admission.mutate(result.pod, llama).pod) == []


@pytest.mark.parametrize("readiness", [cache, lambda: ready(cache()), lambda: cache(storage=GCS)])
def test_idempotent_re_admission_adds_nothing(readiness: Any) -> None:
    llama = readiness()
    once = admission.mutate(pod({"app": "x"}), llama, by_label=False).pod
    twice = admission.mutate(once, llama, by_label=True).pod
    assert twice == once
    assert admission.json_patch(once, twice) == []


def test_users_own_env_mount_and_volume_are_kept_and_recorded() -> None:
    own = pod(LABELLED)
    own["spec"]["containers"][0]["env"] = [{"name": "XLA_FLAGS", "value": "--mine"}]
    own["spec"]["containers"][1]["volumeMounts"] = [{"name": "scratch", "mountPath": "/var/cache/compilecache"}]
    result = admission.mutate(own, cache())
    train, sidecar = result.pod["spec"]["containers"]
    assert [e for e in train["env"] if e["name"] == "XLA_FLAGS"] == [{"name": "XLA_FLAGS", "value": "--mine"}]
    assert env_of(train)["JAX_COMPILATION_CACHE_DIR"] == "/var/cache/compilecache"  # the rest is added
    assert sidecar["volumeMounts"] == [{"name": "scratch", "mountPath": "/var/cache/compilecache"}]
    annotation = result.pod["metadata"]["annotations"][admission.ANNOTATION_SKIPPED]
    assert "container sidecar: mount path /var/cache/compilecache" in annotation
    # XLA_FLAGS is not in the cache's env (no xlaFlags), but the warm-up ran without it: every key differs.
    assert "container train: env XLA_FLAGS is '--mine' but the warm-up ran with unset" in annotation
    clash = pod(LABELLED)
    clash["spec"]["containers"][0]["env"] = [{"name": "JAX_COMPILATION_CACHE_DIR", "value": "/elsewhere"}]
    result = admission.mutate(clash, cache())
    assert env_of(result.pod["spec"]["containers"][0])["JAX_COMPILATION_CACHE_DIR"] == "/elsewhere"
    assert "env JAX_COMPILATION_CACHE_DIR is set by the pod" in result.skipped[0]
    assert any("JAX_COMPILATION_CACHE_DIR" in warning for warning in result.warnings)


def test_users_volume_of_our_name_is_kept_and_not_mounted() -> None:
    own = pod(LABELLED, volumes=[{"name": "compilecache", "emptyDir": {}}])
    result = admission.mutate(own, cache())
    assert result.pod["spec"]["volumes"] == [{"name": "compilecache", "emptyDir": {}}]
    assert all("volumeMounts" not in c for c in result.pod["spec"]["containers"])
    assert result.skipped == ("volume compilecache: the pod has its own volume of that name; not mounted",)
    again = admission.mutate(result.pod, cache())
    assert admission.json_patch(result.pod, again.pod) == []


def test_json_patch_applies_to_the_mutated_pod() -> None:
    original = pod(LABELLED)
    mutated = admission.mutate(original, cache()).pod
    ops = admission.json_patch(original, mutated)
    assert {op["op"] for op in ops} == {"add"}
    assert jsonpatch.apply_patch(original, ops) == mutated


def test_choose_by_label_selector_unknown_and_ambiguous() -> None:
    llama = cache(consumers={"podSelector": {"matchLabels": {"app": "llama-train"}}})
    mistral = cache(
        name="mistral",
        consumers={
            "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["m", "llama-train"]}]}
        },
    )
    other = cache(name="other", consumers={"podSelector": {}})  # matches nothing, not everything
    assert admission.choose_cache(pod(LABELLED), [llama, mistral]) == admission.Choice("llama", by_label=True)
    assert admission.choose_cache(pod({"app": "m"} | INJECT), [llama, mistral, other]) == admission.Choice("mistral")
    assert admission.choose_cache(pod({"app": "none"} | INJECT), [llama, mistral, other]) == admission.Choice(None)
    # A selector only narrows the pods that opted in: without compilecache.dev/inject=true, no cache.
    assert admission.choose_cache(pod({"app": "m"}), [llama, mistral, other]) == admission.Choice(None)
    refused = {"compilecache.dev/inject": "false"}
    assert admission.choose_cache(pod({"app": "m"} | refused), [mistral]) == admission.Choice(None)
    assert admission.choose_cache(pod(LABELLED | refused), [llama]) == admission.Choice(None)
    ambiguous = admission.choose_cache(pod({"app": "llama-train"} | INJECT), [llama, mistral])
    assert ambiguous.name is None and ambiguous.warning and "llama, mistral" in ambiguous.warning
    typo = admission.choose_cache(pod({"compilecache.dev/cache": "lama"}), [llama])
    assert typo.name is None and typo.warning and "'lama' does not exist" in typo.warning


@pytest.mark.parametrize(
    ("expression", "labels", "matches"),
    [
        ({"key": "a", "operator": "In", "values": ["1"]}, {"a": "1"}, True),
        ({"key": "a", "operator": "In", "values": ["1"]}, {}, False),
        ({"key": "a", "operator": "NotIn", "values": ["1"]}, {"a": "2"}, True),
        ({"key": "a", "operator": "NotIn", "values": ["1"]}, {"a": "1"}, False),
        ({"key": "a", "operator": "Exists"}, {"a": ""}, True),
        ({"key": "a", "operator": "DoesNotExist"}, {"a": ""}, False),
        ({"key": "a", "operator": "Gt", "values": ["1"]}, {"a": "2"}, False),
    ],
)
def test_selector_expressions(expression: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    assert admission.selector_matches({"matchExpressions": [expression]}, labels) is matches


def test_pod_chosen_by_selector_gets_the_label_so_its_gate_can_be_found() -> None:
    llama = cache(consumers={"podSelector": {"matchLabels": {"app": "llama-train"}}})
    result = admission.admit(pod({"app": "llama-train"} | INJECT), [llama], rules=policy.DEFAULT)
    assert result.pod["metadata"]["labels"] == {"app": "llama-train", **INJECT, "compilecache.dev/cache": "llama"}


def test_admit_fails_open_on_unknown_cache_and_invalid_spec() -> None:
    original = pod({"compilecache.dev/cache": "nope"})
    result = admission.admit(original, [cache()], rules=policy.DEFAULT)
    assert result.pod == original and result.warnings and "does not exist" in result.warnings[0]
    broken = cache(storage={})
    result = admission.admit(pod(LABELLED), [broken], rules=policy.DEFAULT)
    assert result.pod == pod(LABELLED) and "invalid spec" in result.warnings[0]
    assert admission.admit(pod(), [cache()], rules=policy.DEFAULT) == admission.Mutation(pod=pod())


def test_snippet_is_what_the_webhook_adds() -> None:
    llama = cache()
    snippet = admission.pod_snippet(llama)
    mutated = admission.mutate(pod(LABELLED), ready(llama)).pod["spec"]
    assert snippet["volumes"] == mutated["volumes"]
    assert snippet["volumeMounts"] == mutated["containers"][0]["volumeMounts"]
    assert snippet["env"] == mutated["containers"][0]["env"]
    text = admission.format_snippet(llama)
    assert text.startswith("# CompileCache llama")
    manifest = yaml.safe_load(text)
    assert manifest["metadata"]["labels"] == {"compilecache.dev/cache": "llama"}
    assert manifest["spec"]["containers"][0]["env"] == snippet["env"]
    gcs = admission.pod_snippet(cache(storage=GCS))
    assert gcs["serviceAccountName"] == "cache-reader" and "volumes" not in gcs
    assert "serviceAccountName" not in admission.pod_snippet(cache(storage=GCS_WRITER_ONLY))  # never the writer
    assert "never as the cache's writer" in admission.format_snippet(cache(storage=GCS_WRITER_ONLY))
    assert "never as the cache's writer" not in admission.format_snippet(cache(storage=GCS))
    assert {e["name"]: e["value"] for e in gcs["env"]}["JAX_COMPILATION_CACHE_DIR"] == "gs://my-caches/caches/llama"


def test_mutation_leaves_its_input_alone() -> None:
    original = pod(LABELLED)
    kept = copy.deepcopy(original)
    admission.mutate(original, cache())
    assert original == kept


def test_example_training_job_opts_in_and_trains_the_warmed_model() -> None:
    root = Path(__file__).resolve().parent.parent
    job = yaml.safe_load((root / "examples" / "training-job.yaml").read_text())
    llama = yaml.safe_load((root / "examples" / "cache-pvc.yaml").read_text())
    llama["metadata"]["namespace"] = "default"
    template = job["spec"]["template"]
    result = admission.admit(
        {"metadata": {"namespace": "default", **template["metadata"]}, "spec": template["spec"]},
        [llama],
        rules=policy.DEFAULT,
    )
    assert result.skipped == ()
    train = result.pod["spec"]["containers"][0]
    assert train["image"] == llama["spec"]["warmup"]["image"]
    warmed = {e["name"]: e["value"] for e in llama["spec"]["warmup"]["workloads"][0]["env"]}
    assert {key: env_of(train)[key] for key in warmed} == warmed
    assert env_of(train)["JAX_COMPILATION_CACHE_DIR"] == "/var/cache/compilecache"
    assert result.pod["spec"]["schedulingGates"] == [{"name": admission.GATE}]


@pytest.mark.parametrize("length", [63, 64, 253])
def test_selector_match_on_a_name_that_is_no_label_value_fails_open(length: int) -> None:
    # A CompileCache name may be a 253-character DNS subdomain; a label value stops at 63. The real
    # API server refuses a pod with a longer label value, so the webhook must not add one.
    name = ("a" * (length - 1) + "z")[:length]
    long = cache(consumers={"podSelector": {"matchLabels": {"app": "llama-train"}}})
    long["metadata"]["name"] = name
    result = admission.admit(pod({"app": "llama-train"} | INJECT), [long], rules=policy.DEFAULT)
    if length <= 63:
        assert result.pod["metadata"]["labels"]["compilecache.dev/cache"] == name
    else:
        assert result.pod == pod({"app": "llama-train"} | INJECT)
        assert len(result.warnings) == 1 and "not a valid label value" in result.warnings[0]


@pytest.mark.parametrize(
    ("value", "valid"),
    [("", True), ("a", True), ("a.b_c-d", True), ("x" * 63, True), ("x" * 64, False), ("-a", False), ("a.", False)],
)
def test_label_values(value: str, valid: bool) -> None:
    assert admission.is_label_value(value) is valid
