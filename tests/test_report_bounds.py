"""Reports from pods are numbers in range: what a pod writes never makes a status the API server refuses.

A training pod's verdict, a warm-up's summary and an expiry's summary are written by code the operator
does not trust (whoever may create a labelled pod; the cache author's script and image). Each is
checked against the status schema the CRD is generated from (``api/bounds.py``), refused whole
when a value is of the wrong type or out of range, and named where a user looks. The oracle for the
schema is independent of the code under test: ``tests/crdschema.py`` (jsonschema and the CRD file).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crdschema
from compilecache.api import bounds
from compilecache.controller import expiryjob, reports, status
from compilecache.controller.plan import plan
from compilecache.controller.snapshot import Cache, Snapshot
from compilecache.jobtools.warm import termination_summary
from specs import cache, cluster

ROOT = Path(__file__).resolve().parent.parent
CRD_STATUS = crdschema.openapi_schema(crdschema.load_crd(ROOT / "crds" / "compilecache.yaml"), "v1alpha1")[
    "properties"
]["status"]
T0 = "2026-01-01T00:00:00Z"


# --- the check itself against the CRD file, checked by jsonschema --------------------------------


def _values(schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for a schema node: mostly of its type (in and past its bounds), sometimes of another type."""
    kind = schema.get("type")
    other = st.one_of(st.booleans(), st.text(max_size=3), st.integers(-5, 5), st.none())
    if kind == "integer":
        typed: st.SearchStrategy[Any] = st.one_of(
            st.integers(-(2**70), 2**70), st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 3.0])
        )
    elif kind == "number":
        typed = st.one_of(st.floats(-1e6, 1e6), st.integers(0, 10**6))
    elif kind == "string":
        dates = ["2026-01-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-01-01T10:00:00.5+01:00", "yesterday"]
        typed = st.one_of(st.text(max_size=4), st.sampled_from(dates), st.sampled_from(schema.get("enum") or ["x"]))
        if "maxLength" in schema:
            typed = st.one_of(typed, st.sampled_from(["x" * schema["maxLength"], "x" * (schema["maxLength"] + 1)]))
    elif kind == "array" and depth < 3:
        typed = st.lists(_values(schema["items"], depth + 1), max_size=3)
        if "maxItems" in schema:
            typed = st.one_of(typed, st.just([{}] * (schema["maxItems"] + 1)))
    elif kind == "object" and depth < 3 and "properties" in schema:
        fields = {name: _values(child, depth + 1) for name, child in schema["properties"].items()}
        typed = st.fixed_dictionaries({}, optional=fields)
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        typed = st.dictionaries(st.text(max_size=3), _values(schema["additionalProperties"], depth + 1), max_size=3)
    else:
        typed = st.just({})
    return st.one_of(typed, typed, typed, other)


def _oracle(schema: dict[str, Any], value: Any) -> list[str]:
    """What the CRD refuses in ``value``: its OpenAPI schema (jsonschema, non-strict: the server prunes
    unknown fields) and its list-type keys; a null is pruned by the server, so it is dropped first."""
    value = _without_nulls(value)
    found = [str(v) for v in crdschema.schema_violations(_loose(schema), value)]
    return found + [str(v) for v in crdschema.list_type_violations(schema, value)]


def _loose(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-kubernetes-preserve-unknown-fields": True} if schema.get("type") == "object" else schema


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


FIELDS = ["pools[]", "cache", "consumers", "conditions[]"]


@pytest.mark.parametrize("where", FIELDS)
@settings(derandomize=True, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_check_refuses_exactly_what_the_crd_schema_refuses(where: str, data: st.DataObject) -> None:
    """``bounds`` reads the model; the oracle reads the generated CRD file with jsonschema: they agree."""
    schema = CRD_STATUS
    for part in where.split("."):
        schema = schema["properties"][part.removesuffix("[]")]
        schema = schema["items"] if part.endswith("[]") else schema
    assert bounds.field(where) == schema  # the model's schema is the CRD's (make generate keeps them equal)
    value = data.draw(_values(schema))
    if isinstance(value, float) and value.is_integer() and abs(value) > 2**53:
        return  # the server refuses these whole floats as integers; jsonschema takes them
    found = bounds.violations(value, schema, where)
    expected = _oracle(schema, value) if value is not None else []
    assert bool(found) == bool(expected), (value, found, expected)


@pytest.mark.parametrize(
    "value",
    [math.inf, -math.inf, math.nan],
    ids=["inf", "-inf", "nan"],
)
def test_a_number_that_is_not_finite_is_refused_anywhere_even_where_the_server_prunes(value: float) -> None:
    """Not JSON at all: a patch holding it is a 400 whatever the schema (jsonschema takes ``inf`` as a number)."""
    assert bounds.violations({"pools": [{"name": "a", "compileSeconds": value}]})
    assert bounds.violations({"kopf": {"x": [value]}})  # preserved unknown fields
    assert bounds.violations({"unknown": {"x": value}})  # pruned by the server, still not JSON


def test_keep_valid_sets_back_only_the_fields_the_crd_refuses() -> None:
    old = {"phase": "Warming", "consumers": {"requests": 3}}
    new = {"phase": "Ready", "consumers": {"requests": 10**30}, "cache": {"bytes": math.inf}}
    kept, found = bounds.keep_valid(new, old)
    assert kept == {"phase": "Ready", "consumers": {"requests": 3}}  # no old cache: the field is dropped
    assert sorted(found) == [
        "status.cache.bytes: inf is not finite",
        "status.consumers.requests: 1000000000000000000000000000000 is out of the int64 range",
    ]


# --- training pods' reports --------------------------------------------------------------------------


def _trainer_pod(name: str, message: str, finished: str = "2026-01-01T00:00:10Z") -> dict[str, Any]:
    terminated = {"exitCode": 0, "message": message, "finishedAt": finished}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"compilecache.dev/cache": "c"}},
        "status": {"phase": "Succeeded", "containerStatuses": [{"name": "train", "state": {"terminated": terminated}}]},
    }


def _verdict(**fields: Any) -> str:
    return json.dumps({"schema": reports.SCHEMA, "requests": 4, "hits": 3, "summary": "3/4 hit"} | fields)


HOSTILE_VERDICTS = {
    "requests": (
        _verdict(requests=10**30),
        "requests: 1000000000000000000000000000000 is out of the int64 range",
    ),
    "infinite": (_verdict(hits=1e999), "hits: inf is not a count"),
    "string": (_verdict(requests="5"), 'requests: "5" is not a count'),
    "bool": (_verdict(hits=True), "hits: True is not a count"),
    "negative": (_verdict(hits=-3), "hits: -3 is not a count"),
    "missing": (json.dumps({"schema": reports.SCHEMA, "requests": 4}), "hits: missing"),
    "missed": (_verdict(missed="all"), 'missed: "all" is not a list'),
    "missed-item": (_verdict(missed=["x"]), 'missed[0]: "x" is not an object'),
    "reason": (_verdict(missed=[{"name": "f", "reason": {"a": 1}}]), "missed[0].reason: {'a': 1} is not a string"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_VERDICTS))
def test_a_training_report_out_of_range_or_of_the_wrong_type_is_refused_and_named(case: str) -> None:
    message, said = HOSTILE_VERDICTS[case]
    good = _trainer_pod("good", _verdict(), "2026-01-01T00:00:05Z")
    bad = _trainer_pod("bad", "some output\n" + message)
    counted, refused = reports.counted([good, bad])
    assert [report.requests for report in counted] == [4]
    assert [(pod["metadata"]["name"], why.startswith(said)) for pod, why in refused] == [("bad", True)], refused
    counts = reports.totals(reports.counted([good, bad])[0])
    assert counts == {"hits": 3, "requests": 4}
    assert bounds.violations({"consumers": counts}) == []
    assert reports.pod_report(bad) is None  # the metrics do not count it either


def test_reports_whose_totals_would_pass_int64_are_refused_after_the_first() -> None:
    big = 2**62
    pods = [_trainer_pod(f"p{i}", _verdict(requests=big, hits=big), f"2026-01-01T00:00:1{i}Z") for i in range(3)]
    counted, refused = reports.counted(pods)
    assert [report.requests for report in counted] == [big]  # the second one would make 2^63: past int64
    assert [pod["metadata"]["name"] for pod, _ in refused] == ["p1", "p2"]
    assert all("the totals would not fit" in why for _, why in refused)
    assert bounds.violations({"consumers": reports.totals(reports.counted(pods)[0])}) == []


def test_a_report_nested_deeper_than_the_parser_goes_is_no_report() -> None:
    # Deeper than any recursion limit here (api.bounds raises it to 3 x 10000 where a cluster is read):
    # a termination message holds 4096 bytes, so only a parser with the default limit meets this.
    levels = 4 * bounds.JSON_DEPTH + 1
    deep = '{"schema": "compilecache.dev/trainer/v1", "requests": 1, "hits": 1, "x": ' + "[" * levels + "]" * levels
    assert reports.parse(deep + "}") is None
    assert status.parse_report(deep + "}") is None


# --- warm-up summaries ------------------------------------------------------------------------------


def _warm_pod(message: str, job: str = "j") -> dict[str, Any]:
    terminated = {"exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:00:10Z"}
    return {
        "metadata": {"name": f"{job}-x", "labels": {"job-name": job}},
        "status": {"containerStatuses": [{"name": "warm", "state": {"terminated": terminated}}]},
    }


def _summary(**fields: Any) -> str:
    base = json.loads(termination_summary({"ok": True, "entries": 2, "bytes": 2000, "targets": []}))
    return json.dumps(base | fields)


HOSTILE_SUMMARIES = {
    "compileSeconds": ('{"schema": "compilecache.dev/warm/v1", "compileSeconds": 1e999}', "compileSeconds: inf"),
    "entries": (_summary(entries=10**30), "entries: 1000000000000000000000000000000 is out of the int64"),
    "bytes": (_summary(bytes="2000"), 'bytes: "2000" is not a count'),
    "targets": (_summary(targets={"a": 1}), "targets: {'a': 1} is not a list"),
    "target": (_summary(targets=[{"name": "t", "bytes": -1}]), "targets[0].bytes: -1 is not a count"),
    "verify": (_summary(verify={"hits": 1.5, "requests": 2}), "verify.hits: 1.5 is not a count"),
    "steps": (_summary(steps={"calls": "many"}), 'steps.calls: "many" is not a count'),
    "name": (_summary(targets=[{"name": ["t"]}]), "targets[0].name: ['t'] is not a string"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SUMMARIES))
def test_a_warm_up_summary_out_of_range_is_refused_whole_and_the_pool_says_so(case: str) -> None:
    message, said = HOSTILE_SUMMARIES[case]
    with pytest.raises(status.BadReport) as refused:
        status.warm_report([_warm_pod(message)])
    assert str(refused.value).startswith(said), str(refused.value)
    obj, done, pods = _warmed(message)
    new = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster()), jobs=tuple(done), warmup_pods=tuple(pods)), T0)
    [pool] = [pool for pool in new.status["pools"] if pool.get("reason") == status.REPORT_REFUSED]
    assert pool["state"] == status.POOL_SUCCEEDED and "entries" not in pool
    assert pool["message"].startswith("the warm-up's report was refused, nothing of it is counted: " + said)
    assert bounds.violations(dict(new.status)) == []
    assert [event.reason for event in new.events if event.type == "Warning"] == [status.REPORT_REFUSED]
    # Recorded: the next pass reads no pod, keeps the refusal, and says nothing new.
    assert not status.needs_report(done[0], new.status["pools"])
    obj["status"] = dict(new.status)
    again = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster()), jobs=tuple(done)), "2026-01-01T00:01:00Z")
    assert [p for p in again.status["pools"] if p.get("reason") == status.REPORT_REFUSED] == [pool]
    assert not [event for event in again.events if event.reason == status.REPORT_REFUSED]


def _warmed(message: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A cache whose first warm-up Job succeeded with ``message`` as its pod's summary (the others run)."""
    obj = cache()
    first = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster())), T0)
    [job, *_] = [c.manifest for c in first.creates if c.resource.plural == "jobs"]
    conditions = [{"type": "Complete", "status": "True"}]
    done = job | {"status": {"startTime": T0, "completionTime": "2026-01-01T00:00:30Z", "conditions": conditions}}
    obj["status"] = dict(first.status)
    return obj, [done], [_warm_pod(message, job["metadata"]["name"])]


# --- expiry summaries -------------------------------------------------------------------------------

SUMMARY = {
    "schema": "compilecache.dev/expiry/v1",
    "ok": True,
    "at": "2026-01-01T00:05:00Z",
    "after": {"entries": 3, "bytes": 3000},
    "deleted": {"maxAge": 1},
    "versions": [{"jax": "0.10.2", "backend": "gpu", "entries": 3}],
}
HOSTILE_EXPIRIES = {
    "bytes": ({"after": {"entries": 3, "bytes": 10**30}}, "after.bytes: 1000000000000000000000000000000 is out"),
    "entries": ({"after": {"entries": "3"}}, 'after.entries: "3" is not a count'),
    "deleted": ({"deleted": {"maxAge": 1e999}}, "deleted.maxAge: inf is not a count"),
    "deleted-type": ({"deleted": ["maxAge"]}, "deleted: ['maxAge'] is not an object"),
    "version": ({"versions": ["0.10.2"]}, 'versions[0]: "0.10.2" is not an object'),
    "version-entries": ({"versions": [{"entries": 2**64}]}, "cache.versions[0].entries: 18446744073709551616 is out"),
    "at": ({"at": "yesterday"}, 'cache.lastExpired: "yesterday" is not an RFC 3339 date-time'),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_EXPIRIES))
def test_an_expiry_summary_out_of_range_is_refused_and_the_cache_keeps_its_counts(case: str) -> None:
    fields, said = HOSTILE_EXPIRIES[case]
    message = json.dumps(SUMMARY | fields)
    with pytest.raises(status.BadReport) as refused:
        expiryjob.parse_summary(message)
    assert str(refused.value).startswith(said), str(refused.value)
    job = {"metadata": {"name": "e"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    terminated = {"exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:05:00Z"}
    pod = {
        "metadata": {"name": "e-x"},
        "status": {"containerStatuses": [{"name": "expire", "state": {"terminated": terminated}}]},
    }
    outcome = expiryjob.outcome(job, [pod])
    assert (outcome.phase, outcome.reason, outcome.summary) == (status.READY, status.REPORT_REFUSED, None)
    assert outcome.message.startswith("warmed and expired; its summary was refused, nothing of it is counted: " + said)
    counts = expiryjob.cache_status(outcome.summary, {"entries": 5, "bytes": 50}, None, None)
    assert counts == {"entries": 5, "bytes": 50}
    assert json.loads(message) and expiryjob.parse_summary(json.dumps(SUMMARY)) == SUMMARY  # a sound one passes


# --- any text at all: the status a pass would patch stays within the CRD ----------------------------

JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**80), 2**80),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=5),
    ),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
KEYS = ["entries", "bytes", "compileSeconds", "verify", "targets", "targetsOmitted", "steps", "process", "error"]
FIELDS_OF = {
    "warm": KEYS,
    "trainer": ["requests", "hits", "missed", "summary", "step_fn", "warmed_steps"],
    "expiry": ["after", "deleted", "versions", "at", "error", "before"],
}
SCHEMAS = {"warm": status.WARM_SCHEMA, "trainer": reports.SCHEMA, "expiry": "compilecache.dev/expiry/v1"}


@st.composite
def _hostile(draw: st.DrawFn, kind: str) -> str:
    known = {
        key: JSON | st.sampled_from([10**30, 2**63, math.inf, -1, "1", [1], {"hits": 2**64}]) for key in FIELDS_OF[kind]
    }
    document = draw(st.fixed_dictionaries({"schema": st.just(SCHEMAS[kind])}, optional=known))
    if draw(st.booleans()):  # the trainer's verdict: the shape it really has, with one value changed
        document |= {"requests": draw(JSON), "hits": draw(st.integers(0, 10))}
    return json.dumps(document)


@settings(derandomize=True, max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(warm=_hostile("warm"), trainer=_hostile("trainer"), expiry=_hostile("expiry"))
def test_whatever_pods_write_the_status_a_pass_records_is_one_the_crd_accepts(
    warm: str, trainer: str, expiry: str
) -> None:
    obj, done, pods = _warmed(warm)
    snapshot = Snapshot(Cache.read(obj), nodes=tuple(cluster()), jobs=tuple(done), warmup_pods=tuple(pods))
    new = dict(plan(snapshot, T0).status)
    new["consumers"] = reports.totals(reports.counted([_trainer_pod("t", trainer)])[0])
    assert bounds.violations(new) == []
    assert _oracle(CRD_STATUS, {key: value for key, value in new.items() if key != "kopf"}) == []
    job = {"metadata": {"name": "e"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    terminated = {"exitCode": 0, "message": expiry, "finishedAt": "2026-01-01T00:05:00Z"}
    pod = {
        "metadata": {"name": "e-x"},
        "status": {"containerStatuses": [{"name": "expire", "state": {"terminated": terminated}}]},
    }
    outcome = expiryjob.outcome(job, [pod])
    cache_status = expiryjob.cache_status(outcome.summary, {}, None, outcome.finished_at)
    assert bounds.violations({"cache": cache_status, "message": outcome.message}) == []


T0 = "2026-01-01T00:00:00Z"
TERMINATION_MESSAGE_MAX = 4096  # what the kubelet keeps of a container's termination message
HUGE = 10**400  # JSON's integers have no bound; Python's float() stops near 1.8e308


# --- a report's integer past a float's range is refused, not a failed pass (review of issue 28) ---


def test_a_warm_up_summary_with_seconds_past_a_floats_range_is_refused_not_a_failed_pass() -> None:
    """``status.number`` checks ``value < inf`` (true for any int) then calls ``float()``: OverflowError.

    The warm-up runs in the cache author's image and script, which write its termination message.
    The pass raises, ``plan.failed`` marks the cache Failed ("the operator's pass failed, retrying"),
    and every later pass reads the same pod again (``needs_report``): the status is frozen, which is
    the issue's suspected case (a) and item 5 ("refused, named, and never reaches a status patch").
    """
    message = json.dumps(
        {"schema": status.WARM_SCHEMA, "ok": True, "entries": 1, "bytes": 1, "compileSeconds": HUGE, "targets": []}
    )
    assert len(message) < TERMINATION_MESSAGE_MAX  # the kubelet delivers it whole
    obj: dict[str, Any] = cache()
    first = plan(Snapshot(Cache.read(obj), nodes=tuple(cluster())), T0)
    job = next(create.manifest for create in first.creates if create.resource.plural == "jobs")
    conditions = [{"type": "Complete", "status": "True"}]
    done = dict(job) | {"status": {"startTime": T0, "completionTime": "2026-01-01T00:00:30Z", "conditions": conditions}}
    obj["status"] = dict(first.status)
    snapshot = Snapshot(
        Cache.read(obj),
        nodes=tuple(cluster()),
        jobs=(done,),
        warmup_pods=(_warm_pod(message, job["metadata"]["name"]),),
    )
    new = plan(snapshot, T0)  # raised OverflowError: int too large to convert to float
    refused = [pool for pool in new.status["pools"] if pool.get("reason") == status.REPORT_REFUSED]
    assert refused and "compileSeconds" in refused[0]["message"], new.status["pools"]


def test_an_expiry_summary_with_bytes_past_a_floats_range_is_refused_not_a_failed_pass() -> None:
    """``expiryjob.cache_status`` formats ``after.bytes`` (``units.format_bytes``: ``count / factor``) before
    ``status.within`` checks its range: OverflowError escapes ``outcome``, which catches only BadReport."""
    summary = {
        "schema": "compilecache.dev/expiry/v1",
        "ok": True,
        "at": "2026-01-01T00:05:00Z",
        "after": {"entries": 1, "bytes": HUGE},
    }
    message = json.dumps(summary)
    assert len(message) < TERMINATION_MESSAGE_MAX
    job = {"metadata": {"name": "e"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    terminated = {"exitCode": 0, "message": message, "finishedAt": "2026-01-01T00:05:00Z"}
    pod = {
        "metadata": {"name": "e-x"},
        "status": {"containerStatuses": [{"name": "expire", "state": {"terminated": terminated}}]},
    }
    outcome = expiryjob.outcome(job, [pod])  # raised OverflowError: integer division result too large
    assert (outcome.phase, outcome.reason, outcome.summary) == (status.READY, status.REPORT_REFUSED, None)
    assert "after.bytes" in outcome.message, outcome.message
