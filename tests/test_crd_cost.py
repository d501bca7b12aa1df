"""The CRD's CEL rules fit the API server's cost budget (issue 9: a 1.36 server refused the CRD).

tests/celcost.py re-creates Kubernetes' static cost estimate; it is calibrated here on the
rule the real server refused ("estimated rule cost exceeds budget by factor of 1.7x"), then
applied to every rule of the CRD as shipped. bench/crd_costs.py prints the same figures.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from celcost import (
    CRD_TOTAL_LIMIT,
    PER_RULE_LIMIT,
    Unbounded,
    Unsupported,
    estimate,
    iter_rule_sites,
    rule_costs,
    unbounded_reads,
)
from crdschema import load_crd, openapi_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = openapi_schema(load_crd(ROOT / "crds" / "compilecache.yaml"), "v1alpha1")
WARMUP = SCHEMA["properties"]["spec"]["properties"]["warmup"]

# spec.warmup's x-kubernetes-validations[1] as of c93747b, which a real 1.36 API server refused
# with "estimated rule cost exceeds budget by factor of 1.7x".
REFUSED_RULE = (
    "has(self.discover) || self.workloads.all(w, !has(w.pools) || "
    "w.pools.all(p, has(self.pools) && self.pools.exists(q, q.name == p)))"
)


def test_the_estimate_matches_the_real_api_server() -> None:
    # The limits it iterated (128 workloads x 64 pools x 64 pools, names of 63) are unchanged.
    cost = estimate(REFUSED_RULE, WARMUP)
    assert cost > PER_RULE_LIMIT
    assert f"{cost / PER_RULE_LIMIT:.1f}x" == "1.7x"  # validation.go getCostErrorMessage's format


def test_every_rule_fits_its_budget() -> None:
    costs = rule_costs(SCHEMA)
    assert costs, "no rule found: the walk is broken"
    over = [f"{c.path}: {c.rule} costs {c.total} ({c.factor:.1f}x)" for c in costs if c.total > PER_RULE_LIMIT]
    assert over == []
    assert sum(c.total for c in costs) <= CRD_TOTAL_LIMIT


def test_every_rule_sits_under_bounded_lists_and_maps() -> None:
    assert [path for path, _, _ in iter_rule_sites(SCHEMA)]  # raises Unbounded otherwise


def test_every_string_list_and_map_a_rule_reads_is_bounded() -> None:
    assert unbounded_reads(SCHEMA) == []


# --- the estimator can fail ----------------------------------------------------------------


def test_cost_grows_with_the_bounds_a_rule_iterates() -> None:
    wider = copy.deepcopy(WARMUP)
    wider["properties"]["workloads"]["maxItems"] *= 2
    assert estimate(REFUSED_RULE, wider) > 2 * estimate(REFUSED_RULE, WARMUP) - 10
    longer = copy.deepcopy(WARMUP)
    # Equality costs by the shorter side: both names must grow.
    longer["properties"]["pools"]["items"]["properties"]["name"]["maxLength"] = 253
    longer["properties"]["workloads"]["items"]["properties"]["pools"]["items"]["maxLength"] = 253
    assert estimate(REFUSED_RULE, longer) > estimate(REFUSED_RULE, WARMUP)


def test_a_rule_under_an_unbounded_list_is_reported() -> None:
    schema = copy.deepcopy(SCHEMA)
    del schema["properties"]["spec"]["properties"]["warmup"]["properties"]["pools"]["maxItems"]
    with pytest.raises(Unbounded, match=r"spec\.warmup\.pools\[\]\.tolerations\[\]"):
        list(iter_rule_sites(schema))


def test_a_rule_reading_an_unbounded_string_is_reported() -> None:
    schema = copy.deepcopy(SCHEMA)
    workloads = schema["properties"]["spec"]["properties"]["warmup"]["properties"]["workloads"]
    del workloads["items"]["properties"]["env"]["items"]["properties"]["name"]["maxLength"]
    assert any("reads a string without maxLength" in found for found in unbounded_reads(schema))


def test_an_unknown_form_is_refused_not_guessed() -> None:
    with pytest.raises(Unsupported):
        estimate("self.workloads.map(w, w.name).size() > 0", WARMUP)
