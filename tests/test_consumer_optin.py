"""Issue 19, items 3-4: a podSelector only narrows the pods that opted in, the operator's own pods
are never consumers, and on GCS a training pod never gets the writer's ServiceAccount (no server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.controller import admission, api, expiryjob, jobs, policy
from compilecache.controller.api import SpecError, parse_cache, parse_spec
from compilecache.controller.pools import resolve_pools
from crdschema import eval_rule, load_crd, openapi_schema, validate
from specs import cache, cluster

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = openapi_schema(load_crd(ROOT / "crds" / "compilecache.yaml"), "v1alpha1")
SELECTOR_RULE = SCHEMA["properties"]["spec"]["properties"]["consumers"]["properties"]["podSelector"][
    "x-kubernetes-validations"
][0]["rule"]
INJECT = {admission.LABEL_INJECT: "true"}

# Few keys and values, so that drawn selectors and drawn pods meet often.
_KEYS = st.sampled_from(["app", "team", "x", "app.kubernetes.io/instance", admission.LABEL_INJECT])
_VALUES = st.sampled_from(["", "a", "b", "true", "false", "llama"])
_REQUIREMENT = st.one_of(
    st.fixed_dictionaries(
        {"key": _KEYS, "operator": st.sampled_from(["In", "NotIn"]), "values": st.lists(_VALUES, min_size=1)}
    ),
    st.fixed_dictionaries({"key": _KEYS, "operator": st.sampled_from(["Exists", "DoesNotExist"])}),
)
SELECTORS = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(_KEYS, _VALUES, max_size=2),
        "matchExpressions": st.lists(_REQUIREMENT, max_size=3),
    },
)
POD_LABELS = st.dictionaries(
    st.one_of(_KEYS, st.sampled_from([jobs.LABEL_CACHE, jobs.LABEL_ROLE])), _VALUES, max_size=4
)


def pod(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "labels": dict(labels)},
        "spec": {"containers": [{"name": "main", "image": "db:1"}]},
    }


def consumer_cache(selector: dict[str, Any], name: str = "llama") -> dict[str, Any]:
    return cache(name=name, consumers={"podSelector": selector})


def gated(mutation: admission.Mutation) -> bool:
    return any(gate.get("name") == admission.GATE for gate in mutation.pod["spec"].get("schedulingGates") or [])


@settings(max_examples=400, deadline=None)
@given(selector=SELECTORS, labels=POD_LABELS)
def test_no_admitted_selector_gates_a_pod_without_the_opt_in(selector: dict[str, Any], labels: dict[str, str]) -> None:
    cached = consumer_cache(selector)
    try:
        parse_cache(cached)
    except SpecError as exc:
        # Refused by validation: the CRD's CEL rule refuses exactly the same selectors.
        assert exc.field == "spec.consumers.podSelector"
        assert api.selector_problem(selector) is not None
        assert eval_rule(SELECTOR_RULE, selector) is False
        return
    assert eval_rule(SELECTOR_RULE, selector) is True
    # An admitted selector narrows: it never matches a pod that has no labels at all.
    assert admission.selector_matches(selector, {}) is False
    result = admission.admit(pod(labels), [cached], rules=policy.DEFAULT)
    opted_in = labels.get(jobs.LABEL_CACHE) == "llama" or labels.get(admission.LABEL_INJECT) == "true"
    if gated(result) or result.pod != pod(labels):
        assert opted_in, f"{labels} became a consumer without opting in"
        assert jobs.LABEL_ROLE not in labels, f"{labels}: an operator pod became a consumer"
        assert labels.get(admission.LABEL_INJECT) != "false"


@settings(max_examples=200, deadline=None)
@given(selector=SELECTORS)
def test_selector_problem_is_the_crds_rule(selector: dict[str, Any]) -> None:
    assert (api.selector_problem(selector) is None) is eval_rule(SELECTOR_RULE, selector)


@pytest.mark.parametrize(
    "selector",
    [
        {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]},  # the adversarial pass's selector
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]},
        {
            "matchExpressions": [
                {"key": "x", "operator": "DoesNotExist"},
                {"key": "y", "operator": "NotIn", "values": ["a"]},
            ]
        },
        {},
        {"matchLabels": {}},
    ],
)
def test_selectors_that_cannot_narrow_are_refused_naming_the_field(selector: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as raised:
        parse_cache(consumer_cache(selector))
    assert raised.value.field == "spec.consumers.podSelector"
    violations = validate(SCHEMA, consumer_cache(selector))
    assert [v.path for v in violations] == ["spec.consumers.podSelector"], violations


def test_an_unrelated_pod_in_the_namespace_is_never_held() -> None:
    # The adversarial pass: a database pod, no opt-in, in an injection-enabled namespace.
    database = pod({"app": "postgres"})
    for selector in (
        {"matchLabels": {"app": "postgres"}},
        {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
    ):
        assert admission.admit(database, [consumer_cache(selector)], rules=policy.DEFAULT) == admission.Mutation(
            pod=database
        )


def operator_pods() -> list[dict[str, Any]]:
    """The pod templates of a real warm-up Job and a real expiry Job of the cache ``llama``."""
    llama = cache()
    spec = parse_spec(llama["spec"])
    warmup = jobs.warmup_job(llama, spec, resolve_pools(spec, cluster())[0])
    expiry = expiryjob.expiry_job(llama, spec, [warmup["metadata"]["name"]])
    return [
        {"metadata": {"namespace": "default", **job["spec"]["template"]["metadata"]}, **job["spec"]["template"]}
        for job in (warmup, expiry)
    ]


@pytest.mark.parametrize("index", [0, 1], ids=["warmup", "expiry"])
def test_the_operators_own_pods_are_never_consumers(index: int) -> None:
    own = operator_pods()[index]
    labels = own["metadata"]["labels"]
    assert jobs.LABEL_ROLE in labels and admission.is_operator_pod(labels)
    # A selector on a label the operator itself sets (the case), even if the pod somehow opted in.
    selector = {"matchLabels": {"app.kubernetes.io/instance": "llama"}}
    assert admission.selector_matches(selector, labels)
    for extra in ({}, INJECT, {jobs.LABEL_CACHE: "llama"}):
        candidate = {**own, "metadata": {**own["metadata"], "labels": {**labels, **extra}}}
        assert admission.choose_cache(candidate, [consumer_cache(selector)]) == admission.Choice(None)
        assert admission.admit(candidate, [consumer_cache(selector)], rules=policy.DEFAULT).pod == candidate


GCS = {"gcs": {"bucket": "b-1", "serviceAccountName": "cache-writer", "readerServiceAccountName": "cache-reader"}}


@pytest.mark.parametrize(
    ("storage", "warmup_account"),
    [
        ({"gcs": {**GCS["gcs"], "readerServiceAccountName": "cache-writer"}}, None),
        (GCS, "cache-reader"),
    ],
)
def test_the_reader_cannot_be_a_writer(storage: dict[str, Any], warmup_account: str | None) -> None:
    llama = cache(storage=storage)
    if warmup_account:
        llama["spec"]["warmup"]["serviceAccountName"] = warmup_account
    with pytest.raises(SpecError) as raised:
        parse_cache(llama)
    assert raised.value.field == "spec.storage.gcs.readerServiceAccountName"
    assert [v.kind for v in validate(SCHEMA, llama)] == ["cel"]  # the CRD refuses it too


def test_a_reader_that_is_no_writer_is_admitted_and_the_writers_stay_on_the_jobs() -> None:
    llama = cache(storage=GCS)
    assert not validate(SCHEMA, llama)
    spec = parse_cache(llama)
    assert spec.gcs is not None and spec.gcs.reader_service_account_name == "cache-reader"
    warmup = jobs.warmup_job(llama, spec, resolve_pools(spec, cluster())[0])
    expiry = expiryjob.expiry_job(llama, spec, [warmup["metadata"]["name"]])
    for job in (warmup, expiry):
        assert job["spec"]["template"]["spec"]["serviceAccountName"] == "cache-writer"
    accounts = policy.parse({"serviceAccounts": {"allow": ["cache-writer", "cache-reader"]}})
    trainer = admission.admit(pod({jobs.LABEL_CACHE: "llama"}), [llama], rules=accounts).pod
    assert trainer["spec"]["serviceAccountName"] == "cache-reader"
