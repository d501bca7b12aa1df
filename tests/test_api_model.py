"""The operator's validation starts with the model the CRD is generated from: what the schema says
(a list's size, a string's length) is refused by ``parse_spec`` too, naming the field's JSON path."""

from __future__ import annotations

from typing import Any

import pytest

from compilecache.api import model
from compilecache.controller.api import SpecError, model_path, parse_spec
from specs import cache_spec

WARMUP = cache_spec()["warmup"]


@pytest.mark.parametrize(
    ("warmup", "field", "words"),
    [
        ({"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]}, "spec.warmup.imagePullSecrets", "at most 16"),
        (
            {"workloads": [{"name": "a", "script": "t.py", "args": ["x"] * 257}]},
            "spec.warmup.workloads[0].args",
            "at most 256",
        ),
        (
            {"workloads": [{"name": "a", "script": "t.py", "resumeArgs": ["x" * 1025]}]},
            "spec.warmup.workloads[0].resumeArgs[0]",
            "at most 1024",
        ),
    ],
    ids=["pull-secrets", "args", "resume-arg"],
)
def test_what_only_the_schema_bounds_is_refused_naming_the_field(
    warmup: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(cache_spec(warmup={**WARMUP, **warmup}))
    assert caught.value.field == field
    assert words in caught.value.message


def test_at_the_bound_it_is_accepted() -> None:
    parse_spec(cache_spec(warmup={**WARMUP, "imagePullSecrets": [{"name": f"s{i}"} for i in range(16)]}))


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("warmup", "workloads", 0, "steps", "int"), "spec.warmup.workloads[0].steps"),  # a union's branch
        (("warmup", "resources", "requests", "cpu", "str"), "spec.warmup.resources.requests.cpu"),  # a map's key
        (("storage", "pvc", "create", "accessModes", 1), "spec.storage.pvc.create.accessModes[1]"),
        (
            ("consumers", "podSelector", "matchExpressions", 2, "operator"),
            "spec.consumers.podSelector.matchExpressions[2].operator",
        ),
    ],
)
def test_a_pydantic_location_becomes_the_json_path(loc: tuple[int | str, ...], path: str) -> None:
    assert model_path("spec", model.Spec, loc) == path


def test_what_the_parser_forgives_the_model_does_not_refuse() -> None:
    """A trailing / of mountPath and a leading / of a GCS prefix are harmless: parse_spec normalises them."""
    spec = parse_spec(
        cache_spec(
            storage={"gcs": {"bucket": "b-1", "prefix": "/caches/", "serviceAccountName": "w"}},
            mountPath="/var/cache/cc/",
        )
    )
    assert (spec.mount_path, spec.gcs and spec.gcs.prefix) == ("/var/cache/cc", "caches")


def test_the_status_a_pass_writes_fits_the_status_model() -> None:
    """The model's status (what docs/resource.md documents) holds what the operator really writes."""
    from test_stuck_pods import first_pass, next_pass, pod_of, unschedulable

    first, jobs = first_pass()
    stuck = next_pass(first, jobs, [pod_of(job, **unschedulable()) for job in jobs])
    for written in (first.status, stuck.status):
        status = model.Status.model_validate(dict(written))
        assert status.phase == written["phase"] and status.pools


def test_a_status_the_crd_refuses_the_model_refuses() -> None:
    with pytest.raises(ValueError, match="state"):
        model.Status.model_validate({"phase": "Ready", "pools": [{"name": "h100", "state": "Done"}]})
