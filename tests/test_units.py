import pytest

from compilecache.cache import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200Gi", 200 * 2**30),
        ("1.5G", 1_500_000_000),
        ("512", 512),
        ("1e3", 1000),
        ("100Mi", 100 * 2**20),
        (7, 7),
    ],
)
def test_bytes_parse(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["200GB", "Gi", "", "1.2.3Gi", "-5Gi", True, "ten", "1e99999999"])
def test_bytes_reject_malformed(text):
    with pytest.raises(ValueError):
        units.parse_bytes(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 604800), ("12h", 43200), ("1h30m", 5400), ("90s", 90), ("1w", 604800)]
)
def test_duration_parse(text, seconds):
    assert units.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7days", "", "d", "1.5", "-1h", "1h 30m", 7])
def test_duration_reject_malformed(text):
    with pytest.raises(ValueError):
        units.parse_duration(text)


@pytest.mark.parametrize("text", ["0 3 * * *", "*/15 * * * *", "0 0 1,15 * mon-fri", "0 3 ? * *"])
def test_cron_accepts_five_fields(text):
    assert units.check_cron(text) == text


@pytest.mark.parametrize("text", ["0 3 * *", "every day", "0 3 * * * *", "", "@daily"])
def test_cron_rejects(text):
    with pytest.raises(ValueError):
        units.check_cron(text)


@pytest.mark.parametrize(("count", "text"), [(0, "0"), (1023, "1023"), (1536, "1.5Ki"), (12 * 2**30, "12Gi")])
def test_format_bytes(count, text):
    assert units.format_bytes(count) == text


# --- issue 9 -------------------------------------------------------------------------------

import re  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.mark.parametrize(
    "text",
    [
        "60 * * * *",  # minute out of range
        "0 24 * * *",
        "0 3 * * 8",  # day-of-week out of range
        "0 3 0 * *",
        "*/0 * * * *",  # zero step
        "5-1 * * * *",  # reversed range: croniter accepts it, cron does not
        "0 0 * * sat-sun",
        "? * * * *",  # ? only in day-of-month and day-of-week
        "0 3 * * jan",  # a month name as a weekday
    ],
)
def test_cron_refuses_at_parse_time_what_cron_slot_cannot_use(text: str) -> None:
    # Before the fix these passed check_cron and raised a plain ValueError in cron_slot later
    # in the pass (issue 9: the pass then died before releasing gates).
    with pytest.raises(ValueError, match="not a cron schedule"):
        units.check_cron(text)


@pytest.mark.parametrize("text", ["0 3 * * 0-7", "0 3 * jan-mar mon-fri", "0 0 29 2 *", "0,30 */2 1-15 * *"])
def test_cron_checked_schedules_have_slots(text: str) -> None:
    units.check_cron(text)
    assert units.cron_slot(text, datetime(2026, 11, 21, 14, 34, tzinfo=UTC)) is not None


_CRON_ITEM = st.one_of(
    st.just("*"),
    st.integers(0, 70).map(str),
    st.tuples(st.integers(0, 70), st.integers(0, 70)).map(lambda r: f"{r[0]}-{r[1]}"),
)
_CRON_FIELD = st.tuples(_CRON_ITEM, st.sampled_from(["", "/0", "/1", "/5", "/61"])).map("".join)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.lists(_CRON_FIELD, min_size=5, max_size=5).map(" ".join))
def test_every_checked_schedule_has_a_slot_or_none(text: str) -> None:
    # Whatever check_cron lets through, cron_slot can evaluate: no error later in the pass.
    try:
        units.check_cron(text)
    except ValueError:
        return
    units.cron_slot(text, datetime(2026, 11, 21, 14, 34, tzinfo=UTC))


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (14 * 86400, "1209600s"),
        (12 * 86400, "1036800s"),
        (1.2096e6, "1209600s"),
        (90, "90s"),
        (1.5, "1.5s"),
        (1e-7, "0.0000001s"),
        (1e20, "100000000000000000000s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    # f"{1.2096e6:g}s" was "1.2096e+06s", which parse_duration (and so `compilecache expire`) refused.
    assert units.format_duration(seconds) == text
    assert units.parse_duration(text) == seconds


@settings(derandomize=True, max_examples=500)
@given(
    st.one_of(
        st.floats(min_value=0.001, max_value=200 * 365 * 86400.0, allow_nan=False, allow_infinity=False),
        st.integers(0, 200 * 365 * 86400),
        st.integers(0, 10**6).map(lambda ms: ms / 1000),
    )
)
def test_format_duration_round_trips(seconds: float) -> None:
    text = units.format_duration(seconds)
    assert re.fullmatch(r"([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+", text), text  # the CRD's duration pattern
    assert units.parse_duration(text) == seconds


@settings(derandomize=True, max_examples=300)
@given(st.from_regex(r"\A([0-9]{1,4}(\.[0-9]{1,3})?(ms|s|m|h|d|w)){1,3}\Z"))
def test_parsed_durations_format_back_to_the_same_seconds(text: str) -> None:
    seconds = units.parse_duration(text)
    assert units.parse_duration(units.format_duration(seconds)) == seconds


@pytest.mark.parametrize("seconds", [-1, float("inf"), float("nan"), True, "7d"])
def test_format_duration_refuses_non_durations(seconds: object) -> None:
    with pytest.raises(ValueError):
        units.format_duration(seconds)  # type: ignore[arg-type]


# apimachinery's quantity grammar, as the API server's OpenAPI publishes it for Quantity.
_API_QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$")


@pytest.mark.parametrize("text", ["NaN", "Infinity", "1_000", "1e3k", " 5"])
def test_quantities_the_api_server_refuses_are_refused(text: str) -> None:
    # Why units.parse_quantity and not kubernetes.utils.parse_quantity: the latter reads these.
    from kubernetes.utils import parse_quantity as kubernetes_parse_quantity

    kubernetes_parse_quantity(text)
    assert not _API_QUANTITY.match(text)
    with pytest.raises(ValueError):
        units.parse_quantity(text)


@settings(derandomize=True, max_examples=500)
@given(st.text(alphabet="0123456789.+-eEKMGTPinumk", min_size=1, max_size=8))
def test_parse_quantity_reads_what_the_api_grammar_reads(text: str) -> None:
    try:
        units.parse_quantity(text)
        parsed = True
    except ValueError:
        parsed = False
    assert parsed == bool(_API_QUANTITY.match(text)), text
