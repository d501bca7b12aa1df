"""The operator's policy (pure): parsing, the default's refusals and grants, claims, and the admission check."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from compilecache.controller import plan, policy
from compilecache.controller.api import SpecError, parse_spec
from compilecache.controller.pools import resolve_pools
from compilecache.controller.snapshot import Cache, Snapshot
from specs import PRODUCT, cache, cache_spec, cluster
from test_spec_property import _HEALTH, examples, field_exists, manifests

NOW = "2026-01-01T00:00:00Z"
CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pools_spec(*pools: dict[str, Any], **warmup: Any) -> dict[str, Any]:
    spec = cache_spec()
    spec["warmup"] = {k: v for k, v in spec["warmup"].items() if k != "discover"} | {"pools": list(pools)} | warmup
    return spec


def fields(spec: dict[str, Any], rules: policy.Policy = policy.DEFAULT) -> list[str]:
    return [path for path, _ in policy.violations(parse_spec(spec), rules)]


# --- the default policy ------------------------------------------------------------------------------------


def test_the_default_admits_the_test_spec_and_every_example() -> None:
    assert fields(cache_spec()) == []


def test_the_attack_of_issue_19_is_refused_field_by_field() -> None:
    """The cache of the issue: any image, an admin ServiceAccount, a node by hostname, a control-plane toleration."""
    pool = {
        "name": "cp",
        "nodeSelector": {"kubernetes.io/hostname": "control-plane-0"},
        "tolerations": [CONTROL_PLANE],
    }
    spec = pools_spec(pool, image="attacker.example/anything:latest", serviceAccountName="namespace-admin")
    found = policy.violations(parse_spec(spec), policy.DEFAULT)
    assert [path for path, _ in found] == [
        "spec.warmup.image",
        "spec.warmup.serviceAccountName",
        "spec.warmup.pools[0].nodeSelector.kubernetes.io/hostname",
        "spec.warmup.pools[0].tolerations[0]",
    ]
    assert "latest" in found[0][1] and "namespace-admin" in found[1][1]


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("registry.example.com/ml/trainer:1.2.0", True),
        ("us-docker.pkg.dev/p/r/trainer@sha256:" + "0" * 64, True),
        ("localhost:5000/trainer:1", True),
        ("registry.example.com/ml/trainer:latest", False),  # mutable
        ("registry.example.com/ml/trainer", False),  # no tag is latest
        ("trainer:1.2", False),  # a short name: Docker Hub, or whatever the runtime searches
        ("attacker/anything:1", False),
        ("attacker/x.y/z:1", False),  # a '.' after the first '/' names no registry
    ],
)
def test_default_images_are_pinned_and_from_a_named_registry(image: str, allowed: bool) -> None:
    spec = cache_spec(warmup=cache_spec()["warmup"] | {"image": image})
    assert fields(spec) == ([] if allowed else ["spec.warmup.image"])


def test_default_tolerations_refuse_control_plane_node_conditions_and_everything() -> None:
    refused = [CONTROL_PLANE, {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}, {"operator": "Exists"}]
    spec = pools_spec({"name": "h100", "tolerations": [GPU_TAINT, *refused]})
    assert fields(spec) == [f"spec.warmup.pools[0].tolerations[{i}]" for i in (1, 2, 3)]


def test_discover_by_hostname_and_its_tolerations_are_checked() -> None:
    spec = cache_spec()
    spec["warmup"]["discover"] |= {"groupBy": "kubernetes.io/hostname", "tolerations": [CONTROL_PLANE]}
    assert fields(spec) == ["spec.warmup.discover.tolerations[0]", "spec.warmup.discover.groupBy"]


def test_declared_gpu_types_are_held_to_the_caps_and_selectors_before_any_node_exists() -> None:
    spec = cache_spec()
    spec["warmup"]["discover"] |= {
        "groupBy": "cloud.google.com/gke-accelerator",
        "gpuTypes": [
            {"value": "nvidia-h100-80gb", "gpusPerPod": 8},
            {"value": "nvidia-b200", "gpusPerPod": 16},
            {"value": "nvidia-l4", "gpusPerPod": 1},
        ],
    }
    assert fields(spec) == ["spec.warmup.discover.gpuTypes[1].gpusPerPod"]
    no_l4 = policy.parse({"nodeSelectors": {"allow": ["*"], "deny": ["cloud.google.com/gke-accelerator=nvidia-l4"]}})
    assert fields(spec, no_l4) == [
        "spec.warmup.discover.gpuTypes[1].gpusPerPod",
        "spec.warmup.discover.gpuTypes[2].value",
    ]


def test_service_accounts_default_only_and_gcs_writer_named() -> None:
    gcs = {"gcs": {"bucket": "my-caches", "serviceAccountName": "cache-writer"}}
    assert fields(cache_spec(storage=gcs)) == ["spec.storage.gcs.serviceAccountName"]
    allowing = policy.parse({"serviceAccounts": {"allow": ["default", "cache-*"]}})
    assert fields(cache_spec(storage=gcs), allowing) == []
    # The reader is an identity the cache picks for its training pods: held to the same list.
    with_reader = {"gcs": gcs["gcs"] | {"readerServiceAccountName": "namespace-admin"}}
    assert fields(cache_spec(storage=with_reader), allowing) == ["spec.storage.gcs.readerServiceAccountName"]
    # Unset runs as default: a policy without default refuses it, and says why.
    [(path, message)] = policy.violations(parse_spec(cache_spec()), policy.parse({"serviceAccounts": {"allow": []}}))
    assert path == "spec.warmup.serviceAccountName" and "unset runs as default" in message


def test_caps_gpus_hosts_pools_and_gate_timeout() -> None:
    spec = pools_spec(
        {"name": "big", "gpusPerPod": 16},
        *({"name": f"p{i}"} for i in range(16)),
        topologies=[{"hosts": 1}, {"hosts": 17}],
    )
    spec["consumers"] = {"gateTimeout": "100000w"}
    assert fields(spec) == [
        "spec.warmup.pools[0].gpusPerPod",
        "spec.warmup.pools",
        "spec.warmup.topologies[1].hosts",
        "spec.consumers.gateTimeout",
    ]
    no_caps = policy.parse({"maxGpusPerPod": None, "maxHosts": None, "maxPools": None, "maxGateTimeout": None})
    assert fields(spec, no_caps) == []
    assert policy.parse({"maxGpusPerPod": 0, "maxHosts": 0, "maxPools": 0, "maxGateTimeout": ""}) == no_caps


def test_pool_violations_see_discovered_pools_and_their_real_gpus() -> None:
    spec = parse_spec(cache_spec())
    pools = resolve_pools(spec, cluster())
    assert policy.pool_violations(spec, pools, policy.DEFAULT) == []
    tight = policy.parse({"maxGpusPerPod": 4, "maxPools": 1})
    found = policy.pool_violations(spec, pools, tight)
    assert [path for path, _ in found] == ["spec.warmup.discover", "spec.warmup.discover"]
    assert "8 GPUs per pod" in found[0][1] and "2 pools" in found[1][1]


def test_a_declared_pool_without_gpus_per_pod_over_the_cap_names_the_pool() -> None:
    # Its GPUs come from the nodes: the cache has no gpusPerPod field to name (a field it has, always).
    spec = parse_spec(pools_spec({"name": "h100", "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}}))
    found = policy.pool_violations(spec, resolve_pools(spec, cluster()), policy.parse({"maxGpusPerPod": 4}))
    assert [path for path, _ in found] == ["spec.warmup.pools[0]"], found


# --- parsing -------------------------------------------------------------------------------------------------


def test_unset_is_the_default_and_keys_merge_per_list() -> None:
    assert policy.from_env({}) == policy.DEFAULT
    assert policy.from_env({policy.POLICY_ENV: " "}) == policy.DEFAULT
    parsed = policy.from_env({policy.POLICY_ENV: json.dumps({"images": {"allow": ["registry.example.com/*"]}})})
    assert parsed.images == policy.Rules(allow=("registry.example.com/*",), deny=())
    assert parsed.tolerations == policy.DEFAULT.tolerations
    assert policy.parse({"maxGateTimeout": "1h"}).max_gate_timeout_seconds == 3600


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("{", "COMPILECACHE_POLICY is not JSON"),
        ("[]", "must be an object"),
        ('{"image": {}}', "policy.image is not a policy key"),
        ('{"images": {"allow": "*"}}', "policy.images.allow"),
        ('{"images": {"requirePinned": "yes"}}', "policy.images.requirePinned"),
        ('{"tolerations": {"allowed": []}}', "policy.tolerations.allowed"),
        ('{"maxHosts": -1}', "policy.maxHosts"),
        ('{"maxGateTimeout": "forever"}', "policy.maxGateTimeout"),
        ('{"claims": {"allow": ["^(unclosed"]}}', "policy.claims.allow: '^(unclosed' is not a regular expression"),
    ],
)
def test_a_bad_policy_names_its_key(raw: str, named: str) -> None:
    with pytest.raises(policy.PolicyError, match=re.escape(named)):
        policy.from_env({policy.POLICY_ENV: raw})


@given(
    allow=st.lists(st.sampled_from(["*", "a*", "*b", "ab", ""]), max_size=3),
    deny=st.lists(st.sampled_from(["*", "a*", "*b", "ab", ""]), max_size=3),
    value=st.sampled_from(["", "a", "ab", "b", "ba", "x/ab"]),
)
def test_rules_allow_then_deny(allow: list[str], deny: list[str], value: str) -> None:
    rules = policy.Rules(tuple(allow), tuple(deny))
    permitted = rules.permits(value)
    assert permitted <= policy.Rules(tuple(allow)).permits(value)  # deny only narrows
    assert not (permitted and any(p == value for p in deny))
    assert rules.permits(value) == policy.parse({"claims": {"allow": allow, "deny": deny}}).claims.permits(value)


# --- claims --------------------------------------------------------------------------------------------------


def claim(name: str = "jax-cache", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta}, "status": {"phase": "Bound"}}


@pytest.mark.parametrize(
    ("meta", "rules", "usable"),
    [
        ({}, policy.DEFAULT, False),
        ({"labels": {"compilecache.dev/cache-claim": "true"}}, policy.DEFAULT, True),
        ({"labels": {"compilecache.dev/cache": "llama"}}, policy.DEFAULT, True),  # what the operator creates
        ({"labels": {"compilecache.dev/cache": "other"}}, policy.DEFAULT, False),
        ({"ownerReferences": [{"uid": "uid-1"}]}, policy.DEFAULT, True),
        ({"ownerReferences": [{"uid": "someone-else"}]}, policy.DEFAULT, False),
        ({}, policy.parse({"claims": {"allow": ["jax-*"]}}), True),
    ],
)
def test_an_existing_claim_is_used_only_when_it_opts_in(
    meta: dict[str, Any], rules: policy.Policy, usable: bool
) -> None:
    obj = cache(storage={"pvc": {"claimName": "jax-cache"}})
    decided = plan.plan(Snapshot(Cache.read(obj), claim=claim(**meta), nodes=tuple(cluster()), policy=rules), NOW)
    if usable:
        assert decided.status["phase"] == "Warming" and decided.creates, decided.status
        return
    assert decided.status["phase"] == "Failed"
    assert decided.creates == ()  # no Job mounts it
    ready = decided.status["conditions"][0]
    assert (ready["reason"], ready["status"]) == ("ClaimNotOptedIn", "False")
    assert ready["message"].startswith("spec.storage.pvc.claimName: PersistentVolumeClaim jax-cache exists")


def test_create_does_not_make_a_foreign_claim_the_caches() -> None:
    obj = cache(storage={"pvc": {"claimName": "payroll-db-data", "create": {"size": "1Gi"}}})
    decided = plan.plan(Snapshot(Cache.read(obj), claim=claim("payroll-db-data"), nodes=tuple(cluster())), NOW)
    assert decided.status["phase"] == "Failed" and decided.creates == ()
    assert "payroll-db-data" in decided.status["message"]


# --- the controller's check (the plan) ---------------------------------------------------------------------------


def test_the_plan_fails_a_refused_spec_naming_the_field_and_creates_nothing() -> None:
    obj = cache(warmup=cache_spec()["warmup"] | {"image": "attacker.example/anything:latest"})
    decided = plan.plan(Snapshot(Cache.read(obj), nodes=tuple(cluster())), NOW)
    assert decided.status["phase"] == "Failed" and decided.creates == ()
    [ready] = decided.status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "PolicyViolation")
    assert "spec.warmup.image:" in ready["message"]
    assert any(event.type == "Warning" for event in decided.events), decided.events


def test_the_plan_fails_discovered_pools_above_the_gpu_cap() -> None:
    decided = plan.plan(
        Snapshot(Cache.read(cache()), nodes=tuple(cluster()), policy=policy.parse({"maxGpusPerPod": 4})), NOW
    )
    assert decided.status["phase"] == "Failed" and decided.creates == ()
    assert "spec.warmup.discover:" in decided.status["message"]


# --- the admission check ---------------------------------------------------------------------------------------


def test_admission_runs_the_parsers_cross_field_checks_the_crd_cannot_afford() -> None:
    spec = pools_spec({"name": "h100"})
    spec["warmup"]["workloads"][0]["pools"] = ["b200"]
    found = policy.admission_violations(cache(**spec), policy.DEFAULT)
    assert [path for path, _ in found] == ["spec.warmup.workloads[0].pools[0]"]
    assert policy.admission_violations(cache(), policy.DEFAULT) == []


def test_a_refused_gate_timeout_holds_pods_only_as_long_as_the_policy_allows() -> None:
    """issue 19: gateTimeout 100000w held pods until the cache was deleted; the cap releases them."""
    obj = cache(consumers={"gateTimeout": "100000w"})
    gated = {
        "metadata": {"name": "train-0", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"schedulingGates": [{"name": "compilecache.dev/warm"}]},
    }
    early = plan.plan(Snapshot(Cache.read(obj), pods=(gated,), nodes=tuple(cluster())), "2026-01-01T01:59:00Z")
    assert early.status["phase"] == "Failed" and "spec.consumers.gateTimeout" in early.status["message"]
    assert early.releases == ()
    late = plan.plan(Snapshot(Cache.read(obj), pods=(gated,), nodes=tuple(cluster())), "2026-01-01T02:00:00Z")
    assert [release.pod for release in late.releases] == ["train-0"]
    # The pass that raised holds them no longer either.
    failed = plan.failed(Cache.read(obj), (gated,), RuntimeError("boom"), "2026-01-01T02:00:00Z", policy.DEFAULT)
    assert [release.pod for release in failed.releases] == ["train-0"]


# --- the property: nothing the passes create is outside the policy -------------------------------------------


def outside(pod_spec: dict[str, Any], rules: policy.Policy) -> list[str]:
    """What in a created pod spec the policy does not allow (an empty list: all of it is allowed)."""
    found = []
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        image = container["image"]
        if not rules.images.permits(image) or (rules.require_pinned_images and not policy.image_pinned(image)):
            found.append(f"image {image}")
        gpus = int((container.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
        if rules.max_gpus_per_pod is not None and gpus > rules.max_gpus_per_pod:
            found.append(f"{gpus} GPUs")
    account = pod_spec.get("serviceAccountName", "default")
    if not rules.service_accounts.permits(account):
        found.append(f"ServiceAccount {account}")
    found += [
        f"toleration {t.get('key', '')}"
        for t in pod_spec.get("tolerations", [])
        if not rules.tolerations.permits(t.get("key", ""))
    ]
    found += [
        f"node {k}={v}"
        for k, v in pod_spec.get("nodeSelector", {}).items()
        if not rules.node_selectors.permits(f"{k}={v}")
    ]
    return found


# Drawing the specs is most of the cost (specgen draws ~35 for each one the CRD admits): 30 examples
# took 90 s on an idle 2-core machine and past the 300 s timeout under `make test`'s load; 15 here,
# and `make test-long` runs 300.
USUAL = st.sampled_from([True, True, True, False])


@pytest.mark.slow
@settings(derandomize=True, max_examples=15, deadline=None, suppress_health_check=_HEALTH)
@given(examples(), USUAL)
def test_any_spec_the_crd_admits_is_created_within_the_default_policy_or_fails_naming_the_field(
    example: tuple[dict[str, Any], list[dict[str, Any]]], usual: bool
) -> None:
    within_the_policy_or_refused(example, usual)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1800)
@settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=_HEALTH)
@given(examples(), USUAL)
def test_any_spec_the_crd_admits_is_within_the_policy_long_run(
    example: tuple[dict[str, Any], list[dict[str, Any]]], usual: bool
) -> None:
    within_the_policy_or_refused(example, usual)


def within_the_policy_or_refused(example: tuple[dict[str, Any], list[dict[str, Any]]], usual: bool) -> None:
    """The created Jobs are within the default policy, or the spec is refused naming a field it has."""
    cache_obj, nodes = copy.deepcopy(example)  # hypothesis keeps what it drew: change a copy
    if usual:  # a usual image, account and hold: else nearly every random spec is refused before placement
        spec = cache_obj["spec"]
        spec["warmup"] |= {"image": "registry.example.com/ml/trainer:1.2"}
        spec["warmup"].pop("serviceAccountName", None)
        (spec["storage"].get("gcs") or {}).pop("serviceAccountName", None)
        (spec.get("consumers") or {}).pop("gateTimeout", None)
    try:
        objects = manifests(cache_obj, nodes, policy.DEFAULT)
    except SpecError as error:
        assert field_exists(cache_obj, error.field), error
        event(f"refused: {error.field}")
        return
    event("created" if objects else "nothing to create")
    for job in (obj for obj in objects if obj["kind"] == "Job"):
        assert outside(job["spec"]["template"]["spec"], policy.DEFAULT) == [], job["metadata"]["name"]
        assert int(job["spec"].get("completions", 1)) <= (policy.DEFAULT.max_hosts or 0)


def test_outside_notices() -> None:
    spec = {"containers": [{"image": "trainer:1"}], "tolerations": [{"operator": "Exists"}], "serviceAccountName": "x"}
    assert outside(spec, policy.DEFAULT) == ["image trainer:1", "ServiceAccount x", "toleration "]
