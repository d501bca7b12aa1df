"""Kubernetes quantities, human durations and cron expressions: parsing and formatting."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}  # fmt: skip
_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")

# minute hour day-of-month month day-of-week; each field a list of */N, N, N-M, N-M/S or names.
# The same grammar as the CRD's pattern for spec.schedule.
_CRON_ITEM = r"(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/\d+)?"
_CRON_FIELD = re.compile(rf"^{_CRON_ITEM}(,{_CRON_ITEM})*$")


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity (``200Gi``, ``1.5G``, ``500m``, ``1e3``) into a number.

    Raises ``ValueError`` with the offending text on anything else (e.g. ``200GB``).
    """
    if isinstance(text, bool):
        raise ValueError(f"not a quantity: {text!r}")
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
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
    return number * Decimal(10) ** int(suffix[1:])


def parse_bytes(text: str | int) -> int:
    """Parse a quantity of bytes; fractions of a byte are rounded up."""
    value = parse_quantity(text)
    if value < 0:
        raise ValueError(f"a size cannot be negative: {text!r}")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def parse_duration(text: str) -> float:
    """Parse a duration such as ``7d``, ``12h``, ``1h30m`` or ``90s`` into seconds."""
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 7d, 12h, 1h30m, 90s)")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(text))


def check_cron(text: str) -> str:
    """Return a cron expression unchanged if it has the standard five fields, else raise ``ValueError``."""
    stripped = text.strip() if isinstance(text, str) else ""
    fields = stripped.split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(field) for field in fields):
        raise ValueError(f"not a cron schedule: {text!r} (expected 5 fields, e.g. '0 3 * * *')")
    return stripped


def format_bytes(count: int) -> str:
    """Format a byte count the way Kubernetes quantities read: ``0``, ``512``, ``1.5Ki``, ``12Gi``."""
    if count < 1024:
        return str(count)
    for suffix, factor in reversed(_BINARY.items()):
        if count >= factor:
            value = count / factor
            return f"{value:.1f}{suffix}".replace(".0" + suffix, suffix)
    return str(count)  # pragma: no cover - unreachable: 1024 == Ki


_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # minute hour day-of-month month day-of-week
_CRON_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {
        name: number
        for number, name in enumerate(
            ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
        )
    },
    {name: number for number, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
)
_CRON_LOOKBACK_DAYS = 5 * 366  # long enough for "0 0 29 2 *" (a leap day: at most 8 years apart, usually 4)


def cron_slot(text: str, now: datetime.datetime) -> datetime.datetime | None:
    """The latest time at or before ``now`` (UTC, to the minute) that the 5-field schedule names.

    Standard cron semantics: when both day-of-month and day-of-week are restricted, a day
    matching either counts; day-of-week 7 is Sunday too. ``None`` if no time matches within
    five years (e.g. ``0 0 30 2 *``).
    """
    fields = check_cron(text).split()
    minutes, hours, days, months, weekdays = (_cron_values(f, i) for i, f in enumerate(fields))
    if 7 in weekdays:
        weekdays.add(0)
    any_day, any_weekday = fields[2] in ("*", "?"), fields[4] in ("*", "?")
    now = now.astimezone(datetime.UTC).replace(second=0, microsecond=0)
    for back in range(_CRON_LOOKBACK_DAYS):
        day = (now - datetime.timedelta(days=back)).date()
        weekday = (day.weekday() + 1) % 7  # cron: Sunday is 0
        day_ok = day.day in days
        weekday_ok = weekday in weekdays
        matches = day_ok and weekday_ok if any_day or any_weekday else day_ok or weekday_ok
        if day.month not in months or not matches:
            continue
        latest = (now.hour, now.minute) if back == 0 else (23, 59)
        times = [(h, m) for h in sorted(hours, reverse=True) for m in sorted(minutes, reverse=True) if (h, m) <= latest]
        if times:
            hour, minute = times[0]
            return datetime.datetime(day.year, day.month, day.day, hour, minute, tzinfo=datetime.UTC)
    return None


def _cron_values(field: str, index: int) -> set[int]:
    low, high = _CRON_RANGES[index]
    names = _CRON_NAMES[index]
    values: set[int] = set()
    for item in field.split(","):
        base, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"cron field {field!r}: step must be at least 1")
        if base in ("*", "?"):
            start, end = low, high
        else:
            first, _, last = base.partition("-")
            start = _cron_number(first, names, field)
            end = _cron_number(last, names, field) if last else (high if step_text else start)
        if not low <= start <= end <= high:
            raise ValueError(f"cron field {field!r}: values must lie in {low}-{high}")
        values.update(range(start, end + 1, step))
    return values


def _cron_number(text: str, names: dict[str, int], field: str) -> int:
    if text.isdigit():
        return int(text)
    if text.lower() in names:
        return names[text.lower()]
    raise ValueError(f"cron field {field!r}: {text!r} is not a number or name")
