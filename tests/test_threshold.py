"""``spec.warmup.jax.minCompileTimeSecs``: one threshold for the warm-up Jobs and the training pods.

The threshold is no part of JAX's cache key (jax/_src/cache_key.py), so a trainer with another
one still hits; but it decides what is written, so a trainer that may write (``consumers.readOnly:
false``) with a lower threshold would add the tiny programs the warm-up left out, and one with a
higher threshold would skip entries the warm-up meant to write. Both come from the one spec value.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from compilecache.api import model
from compilecache.controller import admission, jobs
from compilecache.controller.api import parse_spec
from compilecache.controller.pools import resolve_pools
from compilecache.frameworks.jax.env import MIN_COMPILE_TIME, NEVER_WRITE_SECS
from specs import cache, cluster

LABELLED = {"compilecache.dev/cache": "llama"}
DEFAULT = model.Jax.model_fields["minCompileTimeSecs"].default


def training_pod() -> dict[str, Any]:
    """A pod as the API server hands it to the webhook, using the cache ``llama``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "default", "labels": dict(LABELLED)},
        "spec": {"containers": [{"name": "train", "image": "registry.example/trainer:1.2"}]},
    }


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def thresholds(llama: dict[str, Any]) -> tuple[list[str], str]:
    """The threshold in each warm-up Job's container (one Job per pool) and in the webhook's training pod."""
    spec = parse_spec(llama["spec"])
    warmers = [
        env_of(container)[MIN_COMPILE_TIME]
        for pool in resolve_pools(spec, cluster())
        for container in jobs.warmup_job(llama, spec, pool)["spec"]["template"]["spec"]["containers"]
    ]
    [trainer] = admission.mutate(training_pod(), llama).pod["spec"]["containers"]
    return warmers, env_of(trainer)[MIN_COMPILE_TIME]


@given(
    threshold=st.none() | st.integers(0, 3600) | st.floats(0, 3600, allow_nan=False, allow_infinity=False),
    read_only=st.booleans(),
)
def test_warmers_and_trainers_get_the_spec_threshold(threshold: float | None, read_only: bool) -> None:
    warmup = copy.deepcopy(cache()["spec"]["warmup"])
    if threshold is not None:
        warmup["jax"] = {"minCompileTimeSecs": threshold}
    warmers, trainer = thresholds(cache(warmup=warmup, consumers={"readOnly": read_only}))
    expected = DEFAULT if threshold is None else threshold
    assert warmers and {float(value) for value in warmers} == {float(expected)}, warmers
    if read_only:
        # A read-only trainer tries no write at all; what it reads does not depend on the threshold.
        assert float(trainer) == NEVER_WRITE_SECS
    else:
        # A trainer that may write writes exactly what a warm-up would: the same string, not just the same number.
        assert {trainer} == set(warmers)


def test_an_unset_threshold_is_the_models_default_in_both() -> None:
    """The default reaches both (the CRD's default is the model's: test_crd checks the generated schema)."""
    warmers, trainer = thresholds(cache(consumers={"readOnly": False}))
    assert {float(value) for value in [*warmers, trainer]} == {DEFAULT}
