"""``compilecache expire`` reads durations with the operator's own parser, and no other.

The expiry Job's command carries ``spec.lifecycle.maxAge`` rendered by the controller; the
in-Job tool must read every duration ``units.parse_duration`` reads, to the same seconds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.cache import units
from compilecache.cache.errors import WarmError
from compilecache.cache.expiry import Policy
from compilecache.cli.main import build_parser
from compilecache.jobtools.expirecmd import policy_from_args

_NUMBERS = st.integers(0, 10**9).map(str) | st.tuples(st.integers(0, 10**6), st.integers(0, 999)).map(
    lambda whole_frac: f"{whole_frac[0]}.{whole_frac[1]}"
)
# Any text of the duration grammar: one or more <number><unit> parts, units in any order.
DURATIONS = st.lists(st.tuples(_NUMBERS, st.sampled_from(["ms", "s", "m", "h", "d", "w"])), min_size=1, max_size=4).map(
    lambda parts: "".join(number + unit for number, unit in parts)
)


def policy(*flags: str) -> Policy:
    return policy_from_args(build_parser().parse_args(["expire", "--cache-dir", "/c", *flags]))


@settings(derandomize=True, max_examples=300, deadline=None)
@given(DURATIONS)
def test_every_duration_the_operator_reads_is_read_the_same(text: str) -> None:
    seconds = units.parse_duration(text)
    read = policy("--max-age", text, "--grace", text, "--staging-grace", text)
    assert read.max_age_seconds == read.grace_seconds == read.staging_grace_seconds == seconds


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_what_the_operator_refuses_expire_refuses(text: str) -> None:
    try:
        units.parse_duration(text)
    except ValueError:
        with pytest.raises(WarmError, match="--max-age: not a duration"):
            policy("--max-age=" + text)
    else:
        assert policy("--max-age=" + text).max_age_seconds == units.parse_duration(text)
