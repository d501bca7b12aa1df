"""Warm only where training can run (issue 34 item 3): discovered pools against training's placement.

A discovered pool is kept exactly when one of its nodes passes training's nodeSelector, required node
affinity and tolerations (``pools.placement_problem``); the property checks that against
:func:`admits`, a plain evaluator of the raw pod spec written from the Kubernetes docs (NodeSelectorTerm:
"terms are ORed", "requirements are ANDed", "a null or empty term matches no objects"; the operators'
meanings in the NodeSelectorRequirement reference; Toleration's matching rules), not from pools.py.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compilecache.api import model
from compilecache.controller import plan, pools
from compilecache.controller.api import PLACEMENT_REQUIREMENTS_MAX, SpecError, parse_spec
from compilecache.controller.snapshot import Cache, Snapshot
from specs import OPEN_POLICY, cache, cache_spec

IMAGE = "registry.example/trainer:1.2"  # specs.cache_spec's warmup.image
PRODUCT = "nvidia.com/gpu.product"
GPU = "nvidia.com/gpu"
PRODUCTS = ("h100", "a100", "l4", "b200")  # lower-case: a pool's name is its value
KEYS = (PRODUCT, "zone", "tier", "gen")
VALUES = {PRODUCT: PRODUCTS, "zone": ("a", "b"), "tier": ("spot", "ondemand"), "gen": ("1", "2", "3", "03", "x")}
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
NOW = "2026-11-21T10:00:00Z"


# --- the independent evaluator ------------------------------------------------------------------------


def _integer(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[+-]?[0-9]+", text, re.ASCII) else None


def _expression_holds(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    have = _integer(labels[key]) if key in labels else None
    if have is None:
        return False
    return have > int(values[0]) if op == "Gt" else have < int(values[0])


def _term_matches(term: dict[str, Any], labels: dict[str, str], name: str) -> bool:
    expressions, node_fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not node_fields:
        return False
    fields_ok = all((name == f["values"][0]) == (f["operator"] == "In") for f in node_fields)
    return fields_ok and all(_expression_holds(expr, labels) for expr in expressions)


def _tolerated(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def admits(pod: dict[str, Any], labels: dict[str, str], name: str, taints: list[dict[str, Any]]) -> bool:
    """Whether a pod with spec ``pod`` may be scheduled on the node, as far as the node alone decides."""
    if any(labels.get(key) != value for key, value in (pod.get("nodeSelector") or {}).items()):
        return False
    required = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None and not any(_term_matches(t, labels, name) for t in required["nodeSelectorTerms"]):
        return False
    tolerations = list(pod.get("tolerations") or [])
    for container in pod["containers"]:  # ExtendedResourceToleration
        for resource in (container.get("resources") or {}).get("limits") or {}:
            if "/" in resource:
                tolerations.append({"key": resource, "operator": "Exists", "effect": "NoSchedule"})
    for taint in taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not any(_tolerated(t, taint) for t in tolerations):
            return False
    return True


def admits_selector(pod: dict[str, Any], selector: dict[str, str]) -> bool:
    """A pool without nodes: only requirements on the labels its selector fixes count, no name, no taint."""
    known = {key: value for key, value in (pod.get("nodeSelector") or {}).items() if key in selector}
    narrowed: dict[str, Any] = {"containers": pod["containers"], "nodeSelector": known}
    required = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = []
        for term in required["nodeSelectorTerms"]:
            if not term.get("matchExpressions") and not term.get("matchFields"):
                terms.append({})  # matches nothing, whatever is known
                continue
            kept = [expr for expr in term.get("matchExpressions") or [] if expr["key"] in selector]
            # Every requirement on an unknown label or the name is taken to hold: Exists on a fixed label does.
            terms.append({"matchExpressions": kept or [{"key": next(iter(selector)), "operator": "Exists"}]})
        narrowed["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return admits(narrowed, selector, "", [])


# --- generated clusters, discover specs and templates ----------------------------------------------------


@st.composite
def nodes(draw: st.DrawFn) -> list[dict[str, Any]]:
    result = []
    for index in range(draw(st.integers(0, 7))):
        labels = {"kubernetes.io/hostname": f"n{index}"}
        for key in KEYS:
            if key == PRODUCT or draw(st.booleans()):
                labels[key] = draw(st.sampled_from(VALUES[key]))
        taints = draw(
            st.lists(
                st.sampled_from(
                    [
                        GPU_TAINT,
                        {"key": "dedicated", "value": "train", "effect": "NoSchedule"},
                        {"key": "dedicated", "value": "infer", "effect": "NoExecute"},
                        {"key": "spot", "value": "true", "effect": "PreferNoSchedule"},
                    ]
                ),
                max_size=2,
                unique_by=lambda taint: (taint["key"], taint["effect"]),
            )
        )
        node: dict[str, Any] = {
            "metadata": {"name": f"n{index}", "labels": labels},
            "spec": {"taints": taints, "unschedulable": draw(st.booleans()) and draw(st.booleans())},
            "status": {"allocatable": {GPU: "8"}},
        }
        result.append(node)
    return result


def expressions(key: str) -> st.SearchStrategy[dict[str, Any]]:
    values = st.lists(st.sampled_from(VALUES[key]), min_size=1, max_size=3, unique=True)
    numbers = st.sampled_from(["0", "2", "3", "+2", "-1"])
    return st.one_of(
        st.builds(lambda v: {"key": key, "operator": "In", "values": v}, values),
        st.builds(lambda v: {"key": key, "operator": "NotIn", "values": v}, values),
        st.just({"key": key, "operator": "Exists"}),
        st.just({"key": key, "operator": "DoesNotExist"}),
        st.builds(lambda op, n: {"key": key, "operator": op, "values": [n]}, st.sampled_from(["Gt", "Lt"]), numbers),
    )


terms = st.builds(
    lambda exprs, names: {
        **({"matchExpressions": exprs} if exprs else {}),
        **({"matchFields": names} if names else {}),
    },
    st.lists(st.sampled_from(KEYS).flatmap(expressions), max_size=3),
    st.lists(
        st.builds(
            lambda op, n: {"key": "metadata.name", "operator": op, "values": [f"n{n}"]},
            st.sampled_from(["In", "NotIn"]),
            st.integers(0, 7),
        ),
        max_size=1,
    ),
)

TOLERATIONS = [
    {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "train"},
    {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
]


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "train", "image": IMAGE}
    if draw(st.booleans()):
        container["resources"] = {"limits": {GPU: 8}}
    pod: dict[str, Any] = {"containers": [container]}
    selector = draw(st.dictionaries(st.sampled_from(KEYS), st.just(""), max_size=2))
    if selector:
        pod["nodeSelector"] = {key: draw(st.sampled_from(VALUES[key])) for key in selector}
    if draw(st.booleans()):
        required = {"nodeSelectorTerms": draw(st.lists(terms, min_size=1, max_size=3))}
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    tolerations = draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2, unique_by=str))
    if tolerations:
        pod["tolerations"] = tolerations
    return pod


@st.composite
def discovers(draw: st.DrawFn) -> dict[str, Any]:
    discover: dict[str, Any] = {"groupBy": PRODUCT}
    if draw(st.booleans()):
        discover["nodeSelector"] = {"zone": draw(st.sampled_from(VALUES["zone"]))}
    gpu_types = draw(st.lists(st.sampled_from(PRODUCTS), max_size=2, unique=True))
    if gpu_types:
        discover["gpuTypes"] = [{"value": value, "gpusPerPod": 1} for value in gpu_types]
    return discover


def spec_with(discover: dict[str, Any], pod: dict[str, Any] | None, **warmup: Any) -> Any:
    spec = cache_spec()
    spec["warmup"]["discover"] = discover
    if pod is not None:
        spec["warmup"]["podTemplate"] = {"spec": pod}
    spec["warmup"].update(warmup)
    return parse_spec(spec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=nodes(), discover=discovers(), pod=templates(), explicit=st.sampled_from(PRODUCTS))
def test_a_discovered_pool_is_kept_exactly_when_a_node_of_it_admits_training(
    cluster: list[dict[str, Any]], discover: dict[str, Any], pod: dict[str, Any], explicit: str
) -> None:
    explicit_pool = {"name": "explicit", "nodeSelector": {PRODUCT: explicit}}
    resolved = pools.resolve(spec_with(discover, pod, pools=[explicit_pool]), cluster)

    schedulable = [node for node in cluster if not node["spec"]["unschedulable"]]
    narrowing = discover.get("nodeSelector") or {}

    def in_group(node: dict[str, Any], value: str) -> bool:
        labels = node["metadata"]["labels"]
        return labels.get(PRODUCT) == value and all(labels.get(k) == v for k, v in narrowing.items())

    groups = {
        node["metadata"]["labels"][PRODUCT]
        for node in schedulable
        if in_group(node, node["metadata"]["labels"][PRODUCT])
    }
    groups |= {gpu_type["value"] for gpu_type in discover.get("gpuTypes") or []}
    expected_kept = set()
    for value in groups:
        members = [node for node in schedulable if in_group(node, value)]
        if members:
            fits = any(
                admits(pod, node["metadata"]["labels"], node["metadata"]["name"], node["spec"]["taints"])
                for node in members
            )
        else:
            fits = admits_selector(pod, {**narrowing, PRODUCT: value})
        if fits:
            expected_kept.add(value)

    assert resolved.pools[0].name == "explicit"  # the author's choice: never left out
    assert {p.name for p in resolved.pools[1:]} == expected_kept
    assert {left.name for left in resolved.left_out} == groups - expected_kept
    for left in resolved.left_out:
        assert left.reason in (pools.NOT_SELECTED, pools.NOT_TOLERATED) and left.message
    # The status holds what the CRD allows.
    model.Status.model_validate({"leftOutPools": pools.left_out_status(resolved.left_out)})


@settings(max_examples=50, deadline=None)
@given(cluster=nodes(), discover=discovers())
def test_without_a_template_every_discovered_pool_is_kept(
    cluster: list[dict[str, Any]], discover: dict[str, Any]
) -> None:
    resolved = pools.resolve(spec_with(discover, None), cluster)
    assert resolved.left_out == []


# --- hand cases: each operator, taints, pools without nodes ---------------------------------------------


def node(name: str, product: str, taints: list[dict[str, Any]] | None = None, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {PRODUCT: product, **labels}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {GPU: "8"}},
    }


# One H100 node (gen 3) and one A100 node (gen 2, label "x" for tier): which pools does training keep?
CLUSTER = [node("h-0", "h100", gen="3", tier="spot"), node("a-0", "a100", gen="2", tier="x")]


def kept(pod: dict[str, Any], cluster: list[dict[str, Any]] = CLUSTER, **discover: Any) -> list[str]:
    resolved = pools.resolve(spec_with({"groupBy": PRODUCT, **discover}, pod), cluster)
    return [p.name for p in resolved.pools]


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def pod_with(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "train", "image": IMAGE}], **fields}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ({"matchExpressions": [expr(PRODUCT, "In", "h100", "b200")]}, ["h100"]),
        ({"matchExpressions": [expr(PRODUCT, "NotIn", "h100")]}, ["a100"]),
        ({"matchExpressions": [expr("zone", "NotIn", "a")]}, ["a100", "h100"]),  # no such label: NotIn holds
        ({"matchExpressions": [expr("tier", "Exists")]}, ["a100", "h100"]),
        ({"matchExpressions": [expr("zone", "Exists")]}, []),
        ({"matchExpressions": [expr("zone", "DoesNotExist")]}, ["a100", "h100"]),
        ({"matchExpressions": [expr("gen", "DoesNotExist")]}, []),
        ({"matchExpressions": [expr("gen", "Gt", "2")]}, ["h100"]),
        ({"matchExpressions": [expr("gen", "Gt", "+2")]}, ["h100"]),  # Go's ParseInt reads a sign
        ({"matchExpressions": [expr("gen", "Lt", "3")]}, ["a100"]),
        ({"matchExpressions": [expr("gen", "Lt", "-5")]}, []),
        ({"matchExpressions": [expr("tier", "Gt", "0")]}, []),  # labels spot and x are no integers
        ({"matchExpressions": [expr("zone", "Lt", "9")]}, []),  # no label: Gt and Lt fail
        ({"matchFields": [expr("metadata.name", "In", "a-0")]}, ["a100"]),
        ({"matchFields": [expr("metadata.name", "NotIn", "a-0")]}, ["h100"]),
        ({"matchExpressions": [expr("gen", "Exists"), expr(PRODUCT, "In", "a100")]}, ["a100"]),  # ANDed
        ({}, []),  # an empty term matches no node
    ],
)
def test_each_operator_of_a_required_node_affinity_term(term: dict[str, Any], expected: list[str]) -> None:
    assert kept(pod_with(affinity=affinity(term))) == expected


def test_terms_are_ored_and_an_empty_one_adds_nothing() -> None:
    h100 = {"matchExpressions": [expr(PRODUCT, "In", "h100")]}
    a100 = {"matchFields": [expr("metadata.name", "In", "a-0")]}
    assert kept(pod_with(affinity=affinity({}, h100))) == ["h100"]
    assert kept(pod_with(affinity=affinity(h100, a100))) == ["a100", "h100"]


def test_node_selector_and_affinity_must_both_hold() -> None:
    pod = pod_with(nodeSelector={"gen": "2"}, affinity=affinity({"matchExpressions": [expr(PRODUCT, "In", "h100")]}))
    assert kept(pod) == []
    assert kept(pod_with(nodeSelector={"gen": "3"})) == ["h100"]


def test_the_message_names_the_node_and_what_it_lacks() -> None:
    resolved = pools.resolve(spec_with({"groupBy": PRODUCT}, pod_with(nodeSelector={PRODUCT: "h100"})), CLUSTER)
    [left] = resolved.left_out
    assert (left.name, left.reason) == ("a100", pools.NOT_SELECTED)
    assert left.message == f"node a-0: training's nodeSelector {PRODUCT}=h100 does not match ({PRODUCT}=a100)"
    pod = pod_with(affinity=affinity({"matchExpressions": [expr("zone", "In", "a", "b")]}, {}))
    [_, left] = pools.resolve(spec_with({"groupBy": PRODUCT}, pod), CLUSTER).left_out
    assert left.message == (
        "node h-0: training's required node affinity matches no node: term 0 needs zone In [a, b] (no zone label); "
        "term 1 has no requirement, which matches no node"
    )


def test_one_node_that_admits_training_keeps_its_pool() -> None:
    cluster = [node("h-0", "h100", zone="a"), node("h-1", "h100", zone="b")]
    assert kept(pod_with(nodeSelector={"zone": "b"}), cluster) == ["h100"]
    assert kept(pod_with(nodeSelector={"zone": "c"}), cluster) == []


TRAIN_TAINT = {"key": "dedicated", "value": "train", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("taint", "pod", "expected"),
    [
        (TRAIN_TAINT, pod_with(), []),
        (TRAIN_TAINT, pod_with(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "train"}]), ["h100"]),
        (TRAIN_TAINT, pod_with(tolerations=[{"key": "dedicated", "value": "infer"}]), []),
        (TRAIN_TAINT, pod_with(tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]), []),
        (TRAIN_TAINT, pod_with(tolerations=[{"operator": "Exists"}]), ["h100"]),
        ({**TRAIN_TAINT, "effect": "NoExecute"}, pod_with(), []),
        ({**TRAIN_TAINT, "effect": "PreferNoSchedule"}, pod_with(), ["h100"]),  # only scores nodes
        # A pod that requests the GPUs tolerates their NoSchedule taint (ExtendedResourceToleration) ...
        (GPU_TAINT, {"containers": [{"name": "t", "image": IMAGE, "resources": {"limits": {GPU: 8}}}]}, ["h100"]),
        (GPU_TAINT, {"containers": [{"name": "t", "image": IMAGE}]}, []),
        # ... only NoSchedule, as that plugin adds it; an init container's request counts too.
        (
            {**GPU_TAINT, "effect": "NoExecute"},
            {"containers": [{"name": "t", "image": IMAGE, "resources": {"requests": {GPU: 8}, "limits": {GPU: 8}}}]},
            [],
        ),
        (
            GPU_TAINT,
            {
                "containers": [{"name": "t", "image": IMAGE}],
                "initContainers": [{"name": "i", "resources": {"requests": {GPU: 1}}}],
            },
            ["h100"],
        ),
    ],
)
def test_untolerated_taints_leave_a_pool_out(taint: dict[str, Any], pod: dict[str, Any], expected: list[str]) -> None:
    resolved = pools.resolve(spec_with({"groupBy": PRODUCT}, pod), [node("h-0", "h100", [taint])])
    assert [p.name for p in resolved.pools] == expected
    if not expected:
        [left] = resolved.left_out
        assert left.reason == pools.NOT_TOLERATED
        assert f"node h-0 has taint {taint['key']}={taint['value']}:{taint['effect']}" in left.message


def test_a_pool_without_nodes_is_judged_by_its_selectors_labels() -> None:
    discover = {"gpuTypes": [{"value": "b200", "gpusPerPod": 8}, {"value": "l4", "gpusPerPod": 1}]}
    # zone is not in the selector: the node an autoscaler brings may carry it; the product is fixed.
    pod = pod_with(nodeSelector={PRODUCT: "b200", "zone": "a"})
    resolved = pools.resolve(spec_with({"groupBy": PRODUCT, **discover}, pod), [])
    assert [p.name for p in resolved.pools] == ["b200"]
    [left] = resolved.left_out
    assert left.name == "l4" and "no node yet" in left.message and f"{PRODUCT}=l4" in left.message
    pod = pod_with(affinity=affinity({"matchExpressions": [expr(PRODUCT, "NotIn", "b200"), expr("gen", "Gt", "4")]}))
    assert kept(pod, [], **discover) == ["l4"]


def test_explicit_pools_are_kept_whatever_training_selects() -> None:
    explicit = [{"name": "mine", "nodeSelector": {PRODUCT: "a100"}}]
    resolved = pools.resolve(
        spec_with({"groupBy": PRODUCT}, pod_with(nodeSelector={PRODUCT: "h100"}), pools=explicit), CLUSTER
    )
    assert [p.name for p in resolved.pools] == ["mine", "h100"]
    assert [left.name for left in resolved.left_out] == ["a100"]


def test_a_workload_that_names_a_left_out_pool_is_no_unknown_pool() -> None:
    spec = cache_spec()
    spec["warmup"]["discover"] = {"groupBy": PRODUCT}
    spec["warmup"]["workloads"][0]["pools"] = ["a100"]
    spec["warmup"]["podTemplate"] = {"spec": pod_with(nodeSelector={PRODUCT: "h100"})}
    resolved = pools.resolve(parse_spec(spec), CLUSTER)
    assert resolved.pools == [] and [left.name for left in resolved.left_out] == ["a100"]


# --- parsing the placement --------------------------------------------------------------------------------


PLACEMENT = "spec.warmup.podTemplate.spec"


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"nodeSelector": {PRODUCT: 3}}, f"{PLACEMENT}.nodeSelector.{PRODUCT}"),
        ({"nodeSelector": {"bad key!": "x"}}, f"{PLACEMENT}.nodeSelector.bad key!"),
        ({"affinity": affinity()}, "nodeSelectorTerms"),
        ({"affinity": affinity({"matchExpressions": [expr(PRODUCT, "Near", "x")]})}, "matchExpressions[0].operator"),
        ({"affinity": affinity({"matchExpressions": [expr("gen", "Gt", "two")]})}, "matchExpressions[0].values"),
        ({"affinity": affinity({"matchExpressions": [expr("gen", "Gt", "1", "2")]})}, "matchExpressions[0].values"),
        ({"affinity": affinity({"matchExpressions": [expr("gen", "Lt", "9223372036854775808")]})}, "[0].values"),
        ({"affinity": affinity({"matchExpressions": [expr("gen", "Exists", "1")]})}, "matchExpressions[0].values"),
        ({"affinity": affinity({"matchExpressions": [expr("gen", "In")]})}, "matchExpressions[0].values"),
        ({"affinity": affinity({"matchExpressions": [expr("gen", "In", "a b")]})}, "matchExpressions[0].values[0]"),
        ({"affinity": affinity({"matchFields": [expr("spec.unschedulable", "In", "x")]})}, "matchFields[0].key"),
        ({"affinity": affinity({"matchFields": [expr("metadata.name", "In", "a", "b")]})}, "matchFields[0].values"),
        ({"affinity": affinity({"matchFields": [expr("metadata.name", "Exists")]})}, "matchFields[0].operator"),
        ({"affinity": affinity("term")}, "nodeSelectorTerms[0]"),
        ({"tolerations": ["x"]}, f"{PLACEMENT}.tolerations[0]"),
        ({"tolerations": [{"key": "k", "value": 1}]}, f"{PLACEMENT}.tolerations[0].value"),
        ({"tolerations": [{"operator": "Exists"}] * 65}, f"{PLACEMENT}.tolerations"),
        (
            {"affinity": affinity({"matchExpressions": [expr("gen", "Exists")] * (PLACEMENT_REQUIREMENTS_MAX + 1)})},
            f"matchExpressions[{PLACEMENT_REQUIREMENTS_MAX}]",
        ),
    ],
)
def test_a_placement_the_scheduler_could_not_read_is_refused_naming_the_field(
    fields: dict[str, Any], where: str
) -> None:
    with pytest.raises(SpecError) as info:
        spec_with({"groupBy": PRODUCT}, pod_with(**fields))
    assert where in info.value.field, info.value


def test_a_placement_is_parsed_into_the_template() -> None:
    pod = pod_with(
        nodeSelector={"zone": "a"},
        affinity=affinity(
            {"matchExpressions": [expr("gen", "Gt", "+2")], "matchFields": [expr("metadata.name", "In", "n")]}
        ),
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        initContainers=[{"name": "i", "resources": {"limits": {"example.com/fpga": 1, "cpu": 1}}}],
    )
    placement = spec_with({"groupBy": PRODUCT}, pod).warmup.pod_template.placement
    assert placement.node_selector == {"zone": "a"}
    assert placement.node_terms is not None
    [[gen, name]] = placement.node_terms
    assert (gen.key, gen.operator, gen.bound, gen.node_name) == ("gen", "Gt", 2, False)
    assert (name.key, name.values, name.node_name) == ("metadata.name", frozenset({"n"}), True)
    assert placement.tolerations == ({"key": "dedicated", "operator": "Exists"},)
    assert placement.extended_resources == {"example.com/fpga"}
    assert spec_with({"groupBy": PRODUCT}, pod_with()).warmup.pod_template.placement.node_terms is None


# --- the pass: status.leftOutPools ----------------------------------------------------------------------


def passed(pod: dict[str, Any]) -> dict[str, Any]:
    obj = cache()
    obj["spec"]["warmup"]["discover"] = {"groupBy": PRODUCT}
    obj["spec"]["warmup"]["podTemplate"] = {"spec": pod}
    result = plan.plan(Snapshot(Cache.read(obj), policy=OPEN_POLICY, nodes=tuple(CLUSTER)), NOW)
    return dict(result.status)


def test_the_status_names_the_left_out_pools_and_says_why() -> None:
    new = passed(pod_with(nodeSelector={PRODUCT: "h100"}))
    assert [pool["name"] for pool in new["pools"]] == ["h100"]
    assert new["leftOutPools"] == [
        {
            "name": "a100",
            "reason": "TrainingSelectsOtherNodes",
            "message": f"node a-0: training's nodeSelector {PRODUCT}=h100 does not match ({PRODUCT}=a100)",
        }
    ]
    model.Status.model_validate(new)


def test_a_template_that_rules_out_every_pool_keeps_the_cache_pending_saying_so() -> None:
    new = passed(pod_with(nodeSelector={PRODUCT: "b200"}))
    assert new["phase"] == "Pending" and not new["pools"]
    assert new["message"] == (
        "training's pod template rules out every discovered pool (a100, h100): see status.leftOutPools"
    )
    assert [left["name"] for left in new["leftOutPools"]] == ["a100", "h100"]


def test_a_pass_that_leaves_nothing_out_drops_the_field() -> None:
    obj = cache()
    obj["spec"]["warmup"]["discover"] = {"groupBy": PRODUCT}
    obj["status"] = {"leftOutPools": [{"name": "a100", "reason": "TrainingSelectsOtherNodes"}]}
    result = plan.plan(Snapshot(Cache.read(obj), policy=OPEN_POLICY, nodes=tuple(CLUSTER)), NOW)
    assert "leftOutPools" not in result.status


def test_the_check_is_linear_in_nodes() -> None:
    """Many nodes × the most requirements a placement may hold: one pass's pools resolve in bounded time."""
    count = PLACEMENT_REQUIREMENTS_MAX - 2  # and an Exists, and the nodeSelector's entry: the most allowed
    term = {"matchExpressions": [expr("zone", "NotIn", "z")] * count + [expr("zone", "Exists")]}
    pod = pod_with(nodeSelector={"tier": "spot"}, affinity=affinity(term))
    cluster = [node(f"n-{index}", PRODUCTS[index % 4], tier="spot") for index in range(2000)]
    start = time.perf_counter()
    resolved = pools.resolve(spec_with({"groupBy": PRODUCT}, pod), cluster)
    elapsed = time.perf_counter() - start
    assert len(resolved.left_out) == 4  # every node is checked against every requirement: none has a zone
    assert elapsed < 20, f"{elapsed:.1f} s for 2000 nodes × {PLACEMENT_REQUIREMENTS_MAX} requirements"
