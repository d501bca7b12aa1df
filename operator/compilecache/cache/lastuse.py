"""Training's last use of cache entries: the compact key a trainer reports, the operator's record, the days.

``maxAge`` counts from an entry's last use by training or warm-up (Bazel's remote cache and JAX's
own LRU evict by last access, not by creation). Three programs share this format:

- a **trainer** (JAX's :mod:`compilecache.frameworks.jax.verdict`, PyTorch's
  :mod:`compilecache.frameworks.pytorch.hook`) names what it read from the cache and hit, in its
  termination message (4 KiB in all, :mod:`compilecache.training.report`): each entry by its
  :func:`use_key`, the first :data:`KEY_CHARS` hex digits of the sha256 of its name (a JAX entry's
  file name, a PyTorch generation's run id), concatenated in one string (8 bytes an entry), at most
  :data:`MAX_REPORTED` of them; past that it says how many more it used (``usedMore``). Those fall
  back to the rule that held before: the warm-up's re-production (a warm-up re-produces what the
  script compiles, so a program that large is kept by its warm-up);
- the **operator** folds the reports of finished training pods into ``status.lastUsed``
  (:func:`fold`): one ``DAY=KEYS`` item per day (``YYYY-MM-DD``, UTC; a list, which a status merge
  patch replaces whole), the keys whose last use was that day. Days are the resolution ``maxAge``
  needs. The record is bounded: days older than ``maxAge`` (plus one) are
  dropped, each key appears under its latest day only, at most :data:`MAX_RECORD` keys (the newest
  days first) and :data:`MAX_DAYS` days;
- the **expiry Job** gets the record's items as ``--used DAY=KEYS`` arguments of ``compilecache expire``
  (:func:`arguments`, each read back by :func:`parse_item`) and counts an entry whose key is in it
  as used at the end of that day (:func:`last_used`): an entry used yesterday is younger than 1d
  today.

Why the status, passed as arguments: the status is the operator's record already (a finished
pod is gone after its TTL, its report with it; the status outlives it), only the active replica
writes it and the fold is idempotent (the latest day per key: a pod folded twice, by one replica
or the next after a hand-over, changes nothing), and the expiry Job needs no API credentials and
no new object kind (a ConfigMap would need RBAC and its own owner and lifecycle). Arguments are
bounded (:data:`MAX_RECORD` keys: 16 KiB, far below a pod's and a command line's limits).

Training pods are untrusted toward the cache. A key is only a lookup: an entry's life is extended
when its own name hashes to a reported key, and nothing else happens: no key creates or deletes
anything, a key that names no entry is inert, a name like ``../x`` is never a path (only its hash
is compared). A report's size is bounded (:data:`MAX_REPORTED` keys of fixed length, hex only),
and so is the operator's work: linear in the reports' bounded size. The worst a flood of junk
keys can do is push genuine keys out of the record past :data:`MAX_RECORD`: those entries then
expire as they did before training's use counted.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime, timedelta, timezone

KEY_CHARS = 8  # 32 bits: a collision keeps one more existing entry alive, never loses one
MAX_REPORTED = 192  # keys in one trainer's report: 1536 bytes of its 4 KiB termination message
MAX_RECORD = 2048  # keys in status.lastUsed: 16 KiB
MAX_DAYS = 64  # days in status.lastUsed (maxProperties)
MAX_TRACKED = 65536  # distinct keys a trainer remembers (the count past MAX_REPORTED stops there)
DAY_SECONDS = 86400
USED = "used"  # the report's fields
USED_MORE = "usedMore"
_KEYS = re.compile(rf"(?:[0-9a-f]{{{KEY_CHARS}}})*")
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def use_key(name: str) -> str:
    """The short key a trainer reports for the entry ``name`` and the expiry compares: its name's sha256 prefix."""
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:KEY_CHARS]


def report_fields(keys: Iterable[str]) -> dict[str, object]:
    """A trainer report's ``used`` (the first :data:`MAX_REPORTED` distinct :func:`use_key` s, in order of
    first use) and ``usedMore`` (how many more it used), or nothing when it used none."""
    distinct = list(dict.fromkeys(keys))
    if not distinct:
        return {}
    fields: dict[str, object] = {USED: "".join(distinct[:MAX_REPORTED])}
    if len(distinct) > MAX_REPORTED:
        fields[USED_MORE] = len(distinct) - MAX_REPORTED
    return fields


def decode(text: object, limit: int = MAX_REPORTED) -> list[str]:
    """The keys of a ``used`` string; ``ValueError`` for anything but at most ``limit`` keys of lowercase hex."""
    if not isinstance(text, str):
        raise ValueError("must be a string")
    if len(text) > limit * KEY_CHARS:
        raise ValueError(f"more than {limit} keys")
    if _KEYS.fullmatch(text) is None:  # linear: a fixed-width repetition
        raise ValueError(f"must be keys of {KEY_CHARS} lowercase hex digits, concatenated")
    return [text[i : i + KEY_CHARS] for i in range(0, len(text), KEY_CHARS)]


def day_of(timestamp: str) -> str | None:
    """``2026-05-01`` of an RFC 3339 time (as Kubernetes writes them, UTC), or ``None`` when it is none."""
    day = timestamp[:10]
    if _DAY.fullmatch(day) is None:
        return None
    try:
        date.fromisoformat(day)
    except ValueError:
        return None
    return day


def fold(
    record: Sequence[object] | None,
    uses: Iterable[tuple[str, Iterable[str]]],
    today: str,
    max_age_seconds: float | None,
) -> list[str]:
    """The new ``status.lastUsed``: the old ``record`` and ``uses`` ((day, keys) per report), bounded.

    A day after ``today`` counts as today (a clock ahead cannot make a use outlive the window); days
    older than the window (``maxAge`` plus one day, at most :data:`MAX_DAYS`) are dropped; a key is
    kept under its latest day; past :data:`MAX_RECORD` keys, those of the oldest days go first. A
    malformed item of the old record is dropped (the operator wrote it; a bug must not spread).
    """
    window = MAX_DAYS if max_age_seconds is None else min(MAX_DAYS, int(max_age_seconds // DAY_SECONDS) + 2)
    first = (date.fromisoformat(today) - timedelta(days=window - 1)).isoformat()
    latest: dict[str, str] = {}

    def add(day: str | None, keys: Iterable[str]) -> None:
        if day is None or day < first:
            return
        day = min(day, today)
        for key in keys:
            if latest.get(key, "") < day:
                latest[key] = day

    for item in list(record or [])[: MAX_DAYS + 1]:
        try:
            add(*parse_item(item))
        except ValueError:
            continue
    for day, keys in uses:
        add(day_of(day), keys)
    by_day: dict[str, list[str]] = {}
    for key, day in latest.items():
        by_day.setdefault(day, []).append(key)
    kept: list[str] = []
    room = MAX_RECORD
    for day in sorted(by_day, reverse=True)[:MAX_DAYS]:
        keys = sorted(by_day[day])[:room]
        if not keys:
            break
        kept.append(f"{day}={''.join(keys)}")
        room -= len(keys)
    return sorted(kept)


def arguments(record: Sequence[object] | None) -> list[str]:
    """``--used DAY=KEYS`` for each well-formed item of a ``status.lastUsed``, at most :data:`MAX_DAYS`."""
    found: list[str] = []
    for item in list(record or [])[:MAX_DAYS]:
        try:
            parse_item(item)
        except ValueError:
            continue
        found += ["--used", str(item)]
    return found


def parse_item(item: object) -> tuple[str, list[str]]:
    """``(day, keys)`` of one ``DAY=KEYS`` (an item of ``status.lastUsed``, a ``--used`` value);
    ``ValueError`` naming what is wrong."""
    if not isinstance(item, str) or len(item) > 11 + MAX_RECORD * KEY_CHARS:
        raise ValueError("expected DAY=KEYS, a string of at most one record's keys")
    day, sep, keys = item.partition("=")
    if not sep or day_of(day) != day:
        raise ValueError(f"expected DAY=KEYS with DAY as YYYY-MM-DD, got {item[:40]!r}")
    return day, decode(keys, MAX_RECORD)


def last_used(days: Iterable[tuple[str, Iterable[str]]]) -> dict[str, float]:
    """Key → when it was last used, in POSIX seconds: the end of its latest day (days are the resolution)."""
    found: dict[str, float] = {}
    for day, keys in days:
        end = datetime.combine(date.fromisoformat(day), datetime.min.time(), timezone.utc).timestamp() + DAY_SECONDS
        for key in keys:
            found[key] = max(found.get(key, 0.0), end)
    return found


def used_at(names: Iterable[str], used: Mapping[str, float]) -> Iterator[tuple[str, float]]:
    """``(name, last use)`` for each name whose key is in ``used`` (one hash and one lookup a name)."""
    if not used:
        return
    for name in names:
        at = used.get(use_key(name))
        if at is not None:
            yield name, at
