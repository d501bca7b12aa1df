"""Bounded work for every request: every field of a CompileCache is bounded, and no value holds the operator.

Issue 28: a 32,000-dot image took 6.2 s in the policy's image pattern (Python's ``re`` backtracks),
holding the interpreter lock and so the operator's event loop. Here, for every string field the CRD
has (walked from the generated schema, not listed by hand), the longest value it admits, one past
it and a megabyte, in several fill characters, go through admission (the validating webhook's
``policy.admission_violations``), a pass (``plan.plan``) and the command lines the pass writes (the
``compilecache`` CLI's own parser), each within a second (the old code took 6 s at 32 KB and grew
with the square of the length), and past the bound each is refused naming its field.
``bench/admission_load.py`` measures the operator's event loop under the same inputs over HTTPS.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.api import bounds
from compilecache.cache import linear
from compilecache.cli.main import build_parser
from compilecache.controller import api, handlers, jobs, plan, policy
from compilecache.controller.kube import Client
from compilecache.controller.snapshot import Cache, Snapshot
from crdschema import iter_nodes, load_crd, openapi_schema
from specs import OPEN_POLICY, PRODUCT, cache, cache_spec, cluster

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = openapi_schema(load_crd(ROOT / "crds" / "compilecache.yaml"), "v1alpha1")
SPEC_SCHEMA = SCHEMA["properties"]["spec"]
NOW = "2026-11-26T10:00:00Z"
MB = 1_000_000
SECOND = 1.0  # the bound of one call; the old code took 6 s on 32 KB, these take milliseconds
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def full_spec() -> dict[str, Any]:
    """A valid spec that sets nearly every field, so that a value put anywhere meets the code that reads it."""
    image = "registry.example/trainer:1.2"
    return cache_spec(
        warmup={
            "image": image,
            "imagePullSecrets": [{"name": "regcred"}],
            "serviceAccountName": "default",
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "train",
                            "image": image,
                            "command": ["python", "train.py"],
                            "args": ["--config", "c.yaml"],
                            "env": [{"name": "MODEL", "value": "small"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "workingDir": "/app",
                        }
                    ],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                },
                "container": "train",
            },
            "workloads": [
                {
                    "name": "train",
                    "script": "train.py",
                    "args": ["--config", "c.yaml"],
                    "steps": 2,
                    "stepFn": "train_step",
                    "resumeArgs": ["--restore"],
                    "env": [{"name": "A", "value": "b"}],
                    "pools": ["h100"],
                }
            ],
            "pools": [
                {
                    "name": "h100",
                    "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [dict(TOLERATION)],
                    "gpusPerPod": 8,
                }
            ],
            "discover": {"nodeSelector": {"nvidia.com/gpu.present": "true"}, "tolerations": [dict(TOLERATION)]},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            "jax": {"xlaFlags": "--xla_gpu_autotune_level=2"},
        },
        lifecycle={"maxAge": "7d", "maxSize": "10Gi", "keepVersions": 2},
        consumers={"gateTimeout": "10m", "podSelector": {"matchLabels": {"app": "t"}}},
        schedule="0 3 * * *",
    )


def string_fields() -> list[tuple[str, dict[str, Any]]]:
    """Every string (and int-or-string) field of the spec, as crdschema names it (``warmup.workloads[].args[]``)."""
    found = []
    for path, node in iter_nodes(SPEC_SCHEMA):
        if (node.get("type") == "string" or node.get("x-kubernetes-int-or-string")) and "enum" not in node:
            found.append((path, node))
    return found


def put(spec: dict[str, Any], path: str, value: Any) -> str:
    """Set ``value`` at ``path`` (``[]``: the first item, ``{}``: the map key ``k``), making what is missing;
    return the field's JSON path as the operator names it (``spec.warmup.workloads[0].args[0]``)."""
    parts = re.findall(r"[^.\[\]{}]+|\[\]|\{\}", path)
    node: Any = spec
    named = "spec"
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        following: Any = value if last else ([] if parts[index + 1] == "[]" else {})
        if part == "[]":
            if not node:
                node.append(following)
            elif last:
                node[0] = value
            key: Any = 0
            named += "[0]"
        elif part == "{}":
            key = "k" if not node else next(iter(node))
            named += f".{key}"
            if last or key not in node:
                node[key] = following
        else:
            key = part
            named += f".{part}"
            if last or not isinstance(node.get(part), list | dict):
                node[part] = following
        if not last:
            node = node[key]
    return named


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def commands(result: plan.Plan) -> list[list[str]]:
    """The ``compilecache`` command lines of the Jobs a pass creates."""
    found = []
    for create in result.creates:
        pod = create.manifest.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*pod.get("initContainers", ()), *pod.get("containers", ())]:
            if container["command"][0] == "compilecache":
                found.append(container["command"][1:])
    return found


def test_the_full_spec_is_admitted_and_warms() -> None:
    """The base of the field walk is valid: a refusal below is the injected value's."""
    obj = cache(**full_spec())
    assert policy.admission_violations(obj, OPEN_POLICY) == []
    result = plan.plan(Snapshot(Cache.read(obj), nodes=tuple(cluster()), policy=OPEN_POLICY), NOW)
    assert result.status["phase"] != "Failed", result.status
    assert commands(result)


def test_every_free_form_string_list_and_map_of_the_resource_is_bounded() -> None:
    """maxLength on every string, maxItems on every list, maxProperties on every map: what no field has, the
    API server accepts up to 1.5 MiB of. The exceptions: the training template's pod spec (preserved unknown
    fields), which the operator bounds itself (``api.check_bounded``, tested below), and kopf's own
    bookkeeping in the status, which the operator does not write."""
    unbounded = []
    for path, node in iter_nodes(SCHEMA):
        if path in ("", "apiVersion", "kind", "metadata"):  # the API server's own, checked by it
            continue
        if node.get("x-kubernetes-preserve-unknown-fields"):
            if path not in ("spec.warmup.podTemplate.spec", "status.kopf"):
                unbounded.append(f"{path}: preserves unknown fields")
            continue
        if (node.get("type") == "string" or node.get("x-kubernetes-int-or-string")) and "enum" not in node:
            strings = [node, *node.get("anyOf", ())] if node.get("x-kubernetes-int-or-string") else [node]
            if not any("maxLength" in item for item in strings):
                unbounded.append(f"{path}: a string without maxLength")
        if node.get("type") == "array" and "maxItems" not in node:
            unbounded.append(f"{path}: a list without maxItems")
        if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
            unbounded.append(f"{path}: a map without maxProperties")
    assert unbounded == []


def test_the_status_is_fitted_to_its_bounds_before_it_is_patched() -> None:
    """A message quoting a pod's words can outgrow its field: the pass cuts it (``bounds.fit``), never sends
    a status the API server refuses (which would freeze it), and keeps what it says first."""
    pool = {"name": "h100", "hosts": 1, "message": "x" * MB, "reason": "R" * MB}
    status = {"message": "m" * MB, "pools": [pool], "consumers": {"lastMissReason": "train_step: " + "y" * MB}}
    assert bounds.violations(status)
    fitted = bounds.fit(status)
    assert bounds.violations(fitted) == []
    assert fitted["pools"][0]["message"].startswith("xxx") and fitted["consumers"]["lastMissReason"].startswith("train")
    assert bounds.fit({"phase": "Ready", "pools": [{"name": "a", "hosts": 1}]}) == {
        "phase": "Ready",
        "pools": [{"name": "a", "hosts": 1}],
    }


FIELDS = string_fields()


@pytest.mark.parametrize(("path", "node"), FIELDS, ids=[path for path, _ in FIELDS])
def test_the_longest_value_and_past_it_cost_milliseconds_and_past_it_is_refused_naming_the_field(
    path: str, node: dict[str, Any]
) -> None:
    bound = int(node.get("maxLength") or next(item["maxLength"] for item in node["anyOf"] if "maxLength" in item))
    parser = build_parser()
    for fill in ("a", ".", "-", "/", "0"):
        short = full_spec()
        put(short, path, fill)
        short_refused = policy.admission_violations(cache(**short), OPEN_POLICY)
        for size in (bound, bound + 1, MB):
            spec = full_spec()
            field = put(spec, path, fill * size)
            obj = cache(**spec)
            refused, seconds = timed(lambda obj=obj: policy.admission_violations(obj, OPEN_POLICY))
            assert seconds < SECOND, (field, fill, size, seconds)
            snapshot = Snapshot(Cache.read(obj), nodes=tuple(cluster()), policy=OPEN_POLICY)
            result, seconds = timed(lambda snapshot=snapshot: plan.plan(snapshot, NOW))
            assert seconds < SECOND, (field, fill, size, seconds)
            if size > bound:
                assert refused, (field, fill, size)
                assert result.status["phase"] == "Failed"
                if not short_refused:  # refused for this value, not for what put() made around it
                    assert refused[0][0].startswith(field), (field, refused)
            for argv in commands(result):  # what the Job would run, as its container's CLI reads it
                _, seconds = timed(lambda argv=argv: parser.parse_known_args(argv))
                assert seconds < SECOND, (field, argv[:3], seconds)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("warmup.pools[].nodeSelector", {"k" * MB: "v"}),
        ("warmup.discover.nodeSelector", {("a." * (MB // 2)) + "/k": "v"}),
        ("consumers.podSelector.matchLabels", {"a" * MB: "v"}),
        ("warmup.resources.limits", {"example.com/" + "g" * MB: "1"}),
    ],
)
def test_a_megabyte_map_key_is_refused_in_milliseconds(where: str, value: dict[str, str]) -> None:
    spec = full_spec()
    field = put(spec, where, value)
    refused, seconds = timed(lambda: policy.admission_violations(cache(**spec), OPEN_POLICY))
    assert seconds < SECOND and refused and refused[0][0].startswith(field), (refused, seconds)


def _nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        inner = {"x": inner}
    return inner


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda pod: pod.__setitem__("affinity", _nested(api.TEMPLATE_MAX_DEPTH)), "nests deeper than"),
        (lambda pod: pod.__setitem__("affinity", _nested(5000)), "nests deeper than"),
        (lambda pod: pod["containers"][0]["env"].append({"name": "B", "value": "x" * MB}), "more than 256 KiB of JSON"),
        (lambda pod: pod.__setitem__("tolerations", [{"key": "k"}] * 100_000), "more than 256 KiB of JSON"),
    ],
    ids=["just-too-deep", "5000-deep", "a-megabyte-value", "a-long-list"],
)
def test_a_training_template_is_bounded_in_size_and_depth(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    """The pod spec of a template is free-form; a deep or large one is refused before anything reads it, and
    the walk that refuses it stops at the bound (a 5000-deep one costs what a 33-deep one does)."""
    obj = cache(**full_spec())
    change(obj["spec"]["warmup"]["podTemplate"]["spec"])  # after cache(): its deepcopy would recurse 5000 deep
    refused, seconds = timed(lambda: policy.admission_violations(obj, OPEN_POLICY))
    assert seconds < SECOND, seconds
    assert refused and refused[0][0].startswith("spec.warmup.podTemplate.spec"), refused
    assert message in refused[0][1]


def test_a_template_as_deep_and_large_as_a_real_one_is_taken() -> None:
    spec = full_spec()
    spec["warmup"]["podTemplate"]["spec"]["affinity"] = _nested(api.TEMPLATE_MAX_DEPTH - 3)
    spec["warmup"]["podTemplate"]["spec"]["containers"][0]["env"] += [
        {"name": f"V{index}", "value": "x" * 1000} for index in range(200)
    ]
    assert policy.admission_violations(cache(**spec), OPEN_POLICY) == []


# --- patterns in linear time -----------------------------------------------------------------------------


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(st.text(alphabet="ab-!][*?/.\\^&~|", max_size=10), st.text(alphabet="ab-!]/.\\^&~|[", max_size=8))
def test_a_glob_matches_exactly_what_fnmatch_matches(pattern: str, value: str) -> None:
    assert linear.glob(pattern)(value) == fnmatchcase(value, pattern)


def test_the_default_image_pattern_is_linear_where_python_re_was_quadratic() -> None:
    """The value of issue 28 (and 30 times it): Python's re took 6.2 s on 32,000 dots."""
    for size in (32_000, MB):
        _, seconds = timed(lambda size=size: policy.DEFAULT.images.permits("." * size))
        assert seconds < SECOND, (size, seconds)
    assert policy.DEFAULT.images.permits("registry.example/trainer:1.2")
    assert not policy.DEFAULT.images.permits("trainer:1.2")


def test_a_policy_pattern_that_needs_backtracking_stops_the_operator_with_the_key() -> None:
    with pytest.raises(policy.PolicyError, match=r"policy.images.allow: .*backreferences"):
        policy.parse({"images": {"allow": [r"^(a+)\1$"]}})
    with pytest.raises(policy.PolicyError, match=r"policy.secrets.deny: .*look-around"):
        policy.parse({"secrets": {"deny": [r"^(?=a)"]}})


def test_a_pattern_matches_the_whole_value_and_never_past_a_newline() -> None:
    """Python's ``$`` matched before a trailing newline, so "abc\\n" was a DNS label to the model and the
    parser; the API server's RE2 says no, and so does the operator now."""
    assert not linear.regex("[a-z]+$")("abc\n")
    assert not api.is_dns_label("abc\n")
    with pytest.raises(api.SpecError, match=r"spec\.storage\.pvc\.claimName"):
        api.parse_spec(cache_spec(storage={"pvc": {"claimName": "jax-cache\n"}}))


# --- empty objects and lists count against the template's bound (review of issue 28) ---


def test_a_megabyte_training_template_of_empty_objects_is_refused_at_admission() -> None:
    """``api.check_bounded`` charges keys and strings only: ``{}`` and ``[]`` cost nothing, so a
    ``podTemplate.spec`` (free-form in the CRD) of ~1 MB of them is admitted. Measured with
    ``bench/admission_load.py``'s harness on the real operator: 240k empty lists (an AdmissionReview
    just under aiohttp's 1 MiB) are *allowed*, answered in 0.95 s, and stall kopf's event loop
    337 ms (67x a benign cache's), against "a 1 MB value in any field ... refused ... in under a
    second" and "never blocked for more than 100 ms"; every pass then walks it again."""
    warmup = cache()["spec"]["warmup"]
    template = {"containers": [{"name": "train", "image": warmup["image"]}], "affinity": {"x": [{}] * 250_000}}
    obj = cache(warmup=warmup | {"podTemplate": {"spec": template}})
    assert len(json.dumps(obj)) > 1_000_000
    started = time.perf_counter()
    found = policy.admission_violations(obj, policy.DEFAULT)
    elapsed = time.perf_counter() - started
    assert any(path.startswith("spec.warmup.podTemplate.spec") for path, _ in found), found
    assert elapsed < 1.0, f"{elapsed:.2f} s"


# --- one labelled pod cannot hold the operator's event loop (review of issue 28) ---


@pytest.mark.emulator
def test_one_training_pod_cannot_hold_the_operators_event_loop(kube_env: Any) -> None:
    """``handlers.mutate_pods`` runs in kopf's thread pool, but it hands kopf a function (``_become``) and
    kopf builds the JSON patch on its event loop (``serve_admission_request`` -> ``Patch.as_json_patch``:
    a deepcopy of the pod, the function, ``jsonpatch.JsonPatch.from_diff`` over the whole pod). The
    mutation adds the cache's env to every container, so the patch grows with the containers: a pod
    of 20,000 one-line containers (a 670 KB AdmissionReview, under aiohttp's 1 MiB) gets a 16.9 MB
    patch. Measured on the real operator (``compilecache operator`` with its TLS webhook, the
    harness of ``bench/admission_load.py``, /healthz polled every 5 ms): the loop stood still
    2.2-3.4 s per such pod (a benign pod: 2-3 ms). Anyone who may create a pod with the opt-in label
    can send it; the mutating webhook runs before the pod's own validation."""
    body = {"apiVersion": "compilecache.dev/v1alpha1", "kind": "CompileCache", "metadata": {"name": "llama"}}
    kube_env.create("compilecache.dev/v1alpha1/compilecaches", body | {"spec": cache_spec()}, "default")
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "default", "labels": {jobs.LABEL_CACHE: "llama"}},
        "spec": {"containers": [{"name": f"c{index}", "image": "x"} for index in range(20_000)]},
    }
    client = Client.from_environment()
    try:
        memo = kopf.Memo(client=client, policy=policy.DEFAULT)
        patch = kopf.Patch(body=kopf.Body(cast(kopf.RawBody, pod)))
        mutate = cast(Any, handlers.mutate_pods)  # kopf's decorator types it as a WebhookFn of every kwarg
        mutate(body=kopf.Body(cast(kopf.RawBody, pod)), patch=patch, warnings=[], memo=memo)  # kopf's thread pool
    finally:
        client.close()
    started = time.perf_counter()
    ops = patch.as_json_patch()  # what kopf then runs on its event loop
    on_the_loop = time.perf_counter() - started
    assert on_the_loop < 0.1, f"{on_the_loop:.2f} s on the event loop for a patch of {len(json.dumps(ops))} bytes"
