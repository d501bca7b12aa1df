"""Kubernetes quantities, human durations and cron expressions: parsing and formatting.

Quantities are parsed here rather than with ``kubernetes.utils.parse_quantity``: that one hands
the number to Python's ``Decimal``, so it also reads ``NaN``, ``Infinity``, ``1_000`` and
``1e3k``, which the API server refuses (apimachinery's ``resource.ParseQuantity``); a spec the
operator accepted would then fail at the API with a 422. ``_QUANTITY`` is apimachinery's grammar.
Cron expressions are read by croniter, with the two checks it lacks (five fields, no reversed
range) added here.

The texts come from cache authors (durations, sizes, schedules): each is first matched in linear
time (``cache/linear.py``); Python's ``re`` then only reads the parts of a text already known to
fit its grammar.
"""

from __future__ import annotations

import datetime
import re
from decimal import Decimal, InvalidOperation

from compilecache.cache import linear

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}  # fmt: skip
_QUANTITY_SYNTAX = r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?"
_IS_QUANTITY = linear.regex(_QUANTITY_SYNTAX)
_QUANTITY = re.compile(_QUANTITY_SYNTAX)

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_IS_DURATION = linear.regex(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")

# minute hour day-of-month month day-of-week; each field a list of */N, N, N-M, N-M/S or names.
# The same grammar as the CRD's pattern for spec.schedule.
_CRON_ITEM = r"(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/\d+)?"
_IS_CRON_FIELD = linear.regex(rf"{_CRON_ITEM}(,{_CRON_ITEM})*")


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity (``200Gi``, ``1.5G``, ``500m``, ``1e3``) into a number.

    Raises ``ValueError`` with the offending text on anything else (e.g. ``200GB``).
    """
    if isinstance(text, bool):
        raise ValueError(f"not a quantity: {text!r}")
    if isinstance(text, int | float):
        return Decimal(str(text))
    # No strip: the API server does not.
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) and _IS_QUANTITY(text) else None
    if match is None:
        raise ValueError(f"not a quantity: {text!r} (expected e.g. 100Gi, 500M, 1.5Ti)")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"not a quantity: {text!r}") from exc
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    try:
        return number * Decimal(10) ** int(suffix[1:])
    except ArithmeticError as exc:  # decimal.Overflow on 1e9999999: past any real quantity
        raise ValueError(f"not a quantity: {text!r} (out of range)") from exc


def parse_bytes(text: str | int) -> int:
    """Parse a quantity of bytes; fractions of a byte are rounded up."""
    value = parse_quantity(text)
    if value < 0:
        raise ValueError(f"a size cannot be negative: {text!r}")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def parse_duration(text: str) -> float:
    """Parse a duration such as ``7d``, ``12h``, ``1h30m`` or ``90s`` into seconds."""
    if not isinstance(text, str) or not _IS_DURATION(text.strip()):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 7d, 12h, 1h30m, 90s)")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(text))


def check_cron(text: str) -> str:
    """Return a 5-field cron expression, stripped, if croniter reads it; else raise ``ValueError``.

    Everything :func:`cron_slot` would refuse later is refused here, at parse time: out-of-range
    values (``60 * * * *``, ``0 3 * * 8``), zero steps (``*/0``), reversed ranges (``5-1``, which
    croniter silently accepts), names in the wrong field.
    """
    # Here, not at the top: the expiry command imports this module on a training image's Python,
    # which has no croniter (only the operator reads schedules).
    from croniter import CroniterError, croniter

    stripped = text.strip() if isinstance(text, str) else ""
    fields = stripped.split()
    if len(fields) != 5 or not all(_IS_CRON_FIELD(field) for field in fields):
        raise ValueError(f"not a cron schedule: {text!r} (expected 5 fields, e.g. '0 3 * * *')")
    for index, field in enumerate(fields):
        for item in field.split(","):
            first, dash, last = item.partition("/")[0].partition("-")
            if dash and _cron_number(first, index) > _cron_number(last, index):
                raise ValueError(f"not a cron schedule: {text!r}: range {first}-{last} runs backwards")
    try:
        croniter(stripped)
    except (CroniterError, ValueError, KeyError) as exc:
        raise ValueError(f"not a cron schedule: {text!r}: {exc}") from None
    return stripped


def _cron_number(text: str, index: int) -> int:
    # Range ends are numbers or (month, day-of-week) names; croniter checks which field takes names.
    if text.isdigit():
        return int(text)
    names = _CRON_MONTHS if index == 3 else _CRON_WEEKDAYS if index == 4 else {}
    if text.lower() not in names:
        raise ValueError(f"not a cron schedule: {text!r} is not a number or a name of this field")
    return names[text.lower()]


_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_CRON_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, 1)}
_CRON_WEEKDAYS = {name: number for number, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}


def cron_slot(text: str, now: datetime.datetime) -> datetime.datetime | None:
    """The latest time at or before ``now`` (UTC, to the minute) that the 5-field schedule names.

    Standard cron semantics (croniter's): when both day-of-month and day-of-week are
    restricted, a day matching either counts; day-of-week 7 is Sunday too. ``None`` if no
    time ever matches (e.g. ``0 0 30 2 *``).
    """
    from croniter import CroniterBadDateError, croniter

    schedule = check_cron(text)
    # croniter's get_prev is strictly before its start: start a minute after now's minute.
    start = now.astimezone(datetime.timezone.utc).replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
    try:
        found = croniter(schedule, start).get_prev(datetime.datetime)
    except CroniterBadDateError:
        return None
    return found.astimezone(datetime.timezone.utc)


def format_duration(seconds: float) -> str:
    """Format seconds as a duration :func:`parse_duration` reads back to the same float.

    Plain decimal seconds (``1209600s`` for 14d), never an exponent: ``f"{x:g}s"`` gave
    ``1.2096e+06s``, which no duration parser reads. Whole seconds keep the form the expiry
    Jobs always had (``604800s``), so existing Job names and commands do not change.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < float("inf"):
        raise ValueError(f"not a duration in seconds: {seconds!r}")
    if seconds == int(seconds) and seconds < 2**53:
        return f"{int(seconds)}s"
    # repr() is the shortest text that reads back as the same float; 'f' spells out its exponent.
    return f"{format(Decimal(repr(float(seconds))), 'f')}s"


def format_bytes(count: int) -> str:
    """Format a byte count the way Kubernetes quantities read: ``0``, ``512``, ``1.5Ki``, ``12Gi``."""
    if count < 1024:
        return str(count)
    for suffix, factor in reversed(_BINARY.items()):
        if count >= factor:
            value = count / factor
            return f"{value:.1f}{suffix}".replace(".0" + suffix, suffix)
    return str(count)  # pragma: no cover - unreachable: 1024 == Ki
