"""Kubernetes quantities, human durations and cron expressions: parsing and formatting."""

from __future__ import annotations

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
