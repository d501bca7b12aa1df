"""What training pods saw: their own hit/miss report, read from their termination messages (pure).

A training process that got the cache's environment writes, at exit, one JSON object
(schema ``compilecache.dev/trainer/v1``: requests, hits, misses, up to 10 missed
compiles with a reason, and a one-line summary) to its container's termination
message file, ``/dev/termination-log`` (the Kubernetes default
``terminationMessagePath``). The kubelet copies it into the pod's status, so the
operator reads it from the pods a pass lists anyway, and training pods need no API
credentials. A container may write other text there too: the last line that parses
as the schema counts. ``status.consumers`` gets the totals over the finished pods
that exist now (as its other counts); ``metrics.py`` counts each pod once.

Whoever may create a pod with the opt-in label writes its termination message: a report whose
values are of the wrong type or that ``status.consumers`` cannot hold (``bounds``: past int64, so
that no status patch is ever refused for it) is not counted, and :func:`counted` names it
(the pass posts a Warning Event ``ReportRefused`` on the cache, once per pod).

Where the trainer counted calls of the warm-up's step function, each missed item carries the
``step`` it was first missed at and the report the ``warmed_steps`` (N or ``auto``):
``lastMissReason`` then says what to change (:func:`not_warmed_fix`: ``set steps >= 18``, or raise
the budget) instead of the general advice.

A report also names the entries the trainer read and hit (``used``: short keys, at most 192, hex
only, :mod:`compilecache.cache.lastuse`); :func:`last_used` folds them, by the day each pod finished,
into ``status.lastUsed``, which the expiry Job gets as arguments, so that ``maxAge`` counts from
training's last use. A key is a lookup the expiry makes against the entries it lists: a report can
only keep existing entries longer, never name a path, create or delete anything.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache.api import bounds
from compilecache.cache import lastuse
from compilecache.controller import status
from compilecache.training.report import NOT_WARMED, SCHEMA

FINISHED_PHASES = ("Succeeded", "Failed")
REASON_CHARS = 300  # status.consumers.lastMissReason (the CRD's maxLength)
NOT_WARMED_FIX = "it runs after the warmed steps; warm whole epochs (steps: auto) or more steps"
# The trainer counted calls of the warm-up's step function (frameworks/jax/stepcount.py): ``step`` is how
# many had returned when the program first missed.
AUTO = "auto"


@dataclass(frozen=True)
class Report:
    """One training container's verdict."""

    requests: int
    hits: int
    missed: tuple[tuple[str, str], ...] = ()  # (compile name, why), at most 10
    summary: str = ""
    finished_at: str = ""
    first_step: int | None = None  # calls of the step function returned at the first miss, when counted
    step_fn: str = ""  # the step function whose calls were counted
    warmed_steps: int | str | None = None  # what the warm-up ran: N steps, or "auto" (a budget)
    used: tuple[str, ...] = ()  # the use keys of the entries it read and hit (cache.lastuse), at most 192
    used_more: int = 0  # how many more it used than it named

    @property
    def miss_reason(self) -> str:
        """One line on the first miss (``name: reason``, with what to change when the reason alone does
        not say it), or ``""`` when everything hit."""
        if not self.missed:
            return ""
        name, reason = self.missed[0]
        step = self.first_step
        if reason == NOT_WARMED:
            return f"{name}: {reason}{not_warmed_fix(step, self.step_fn, self.warmed_steps)}"
        if step:
            reason = f"{reason} (at step {step})" if reason else f"at step {step}"
        return f"{name}: {reason}" if reason else name


def not_warmed_fix(step: int | None, step_fn: str, warmed_steps: int | str | None) -> str:
    """What to change for a program the warm-up never compiled, from the step it first missed at.

    A warm-up with ``steps: N`` stops once the N-th call of the step function has returned, so a
    program first compiled after k calls is cached by ``steps >= k + 1``. Without a counted step
    (an AOT warm-up, a step function out of the trainer's reach) the advice stays general.
    """
    if step is None:
        return f": {NOT_WARMED_FIX}"
    if step == 0:
        return (
            ", compiled before the first step returned: the warm-up's run of the script never reached it "
            "(skipped under COMPILECACHE_WARMUP, or other arguments)"
        )
    at = f", first compiled at step {step} (after {step} calls of {step_fn or 'the step function'})"
    if warmed_steps == AUTO:
        return f"{at}: the warm-up's budget ran out before it; raise workloads[].budget"
    return f"{at}: set steps >= {step + 1}"


def parse(message: str | None) -> Report | None:
    """The report in a termination message: the last line that is a JSON object of the schema, else ``None``.

    That line decides: one whose values are of the wrong type, or out of what ``status.consumers`` can
    hold (the model's int64), raises :class:`status.BadReport` (a pod writes its own termination message).
    """
    for line in reversed((message or "").strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        document = _json(line)
        if _of_schema(document):
            return _report(document)
    # The whole message as one document: a writer that pretty-printed it.
    document = _json(message or "")
    return _report(document) if _of_schema(document) else None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes: not a report
        return None


def _of_schema(document: Any) -> bool:
    return isinstance(document, dict) and document.get("schema") == SCHEMA


def _report(document: Mapping[str, Any]) -> Report:
    for required in ("requests", "hits"):
        if document.get(required) is None:
            raise status.BadReport(required, "missing")
    requests, hits = status.count(document["requests"], "requests"), status.count(document["hits"], "hits")
    status.within({"requests": requests, "hits": hits}, "consumers")
    items = [
        status.mapping(item, f"missed[{i}]") for i, item in enumerate(status.listed(document.get("missed"), "missed"))
    ]
    missed = tuple(
        (
            status.text(item.get("name"), f"missed[{i}].name")[:REASON_CHARS],
            status.text(item.get("reason"), f"missed[{i}].reason")[:REASON_CHARS],
        )
        for i, item in enumerate(items[:10])
    )
    warmed = document.get("warmed_steps")  # the warm-up's manifests say it: advice, dropped when odd
    try:  # a fixed-width hex string, length-capped before it is matched: bounded work whatever it holds
        used = tuple(lastuse.decode(document[lastuse.USED])) if lastuse.USED in document else ()
    except ValueError as exc:
        raise status.BadReport(lastuse.USED, str(exc)) from None
    return Report(
        requests,
        min(hits, requests),
        missed,
        status.text(document.get("summary"), "summary")[:REASON_CHARS],
        first_step=_count(items[0].get("step")) if items else None,  # advice in a message: dropped when odd
        step_fn=status.text(document.get("step_fn"), "step_fn")[:100],
        warmed_steps=warmed if warmed == AUTO or _count(warmed) is not None else None,
        used=used,
        used_more=_count(document.get(lastuse.USED_MORE)) or 0,
    )


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bounds.INT64_MAX:
        return None
    return value


def read(pod: Mapping[str, Any]) -> Report | status.BadReport | None:
    """What a finished training pod reported (its newest container with a report), why it was refused,
    or ``None``: no report (running, or it wrote none)."""
    pod_status = pod.get("status") or {}
    if pod_status.get("phase") not in FINISHED_PHASES:
        return None
    found: list[tuple[str, Report | status.BadReport]] = []
    for state in pod_status.get("containerStatuses") or []:
        terminated = (state.get("state") or {}).get("terminated") or {}
        finished = str(terminated.get("finishedAt") or "")
        try:
            report = parse(terminated.get("message"))
        except status.BadReport as exc:
            found.append((finished, exc))
            continue
        if report is not None:
            found.append((finished, dataclasses.replace(report, finished_at=finished)))
    return max(found, key=lambda item: item[0])[1] if found else None


def pod_report(pod: Mapping[str, Any]) -> Report | None:
    """The report of a finished training pod (its newest container with one), or ``None`` (refused too)."""
    report = read(pod)
    return report if isinstance(report, Report) else None


def counted(pods: Sequence[Mapping[str, Any]]) -> tuple[list[Report], list[tuple[Mapping[str, Any], str]]]:
    """The reports of the finished training pods that count, and the pods whose report was refused, with why.

    Also refused: a report that would take the totals past what ``status.consumers`` holds (oldest first count).
    """
    reports: list[Report] = []
    refused: list[tuple[Mapping[str, Any], str]] = []
    found = [(pod, read(pod)) for pod in pods]
    totals = {"requests": 0, "hits": 0}
    for pod, report in sorted(found, key=lambda item: item[1].finished_at if isinstance(item[1], Report) else ""):
        if isinstance(report, status.BadReport):
            refused.append((pod, str(report)))
        elif report is not None:
            summed = {"requests": totals["requests"] + report.requests, "hits": totals["hits"] + report.hits}
            try:
                totals = status.within(summed, "consumers")
            except status.BadReport as exc:
                refused.append((pod, f"the totals would not fit: {exc}"))
                continue
            reports.append(report)
    return reports, refused


def totals(reports: Sequence[Report]) -> dict[str, Any]:
    """``status.consumers`` hits, requests and lastMissReason of the reports that count (:func:`counted`)."""
    if not reports:
        return {}
    counts: dict[str, Any] = {
        "hits": sum(report.hits for report in reports),
        "requests": sum(report.requests for report in reports),
    }
    missing = [report for report in reports if report.miss_reason]
    if missing:
        counts["lastMissReason"] = max(missing, key=lambda report: report.finished_at).miss_reason[:REASON_CHARS]
    return counts


def last_used(
    record: Sequence[object] | None, reports: Sequence[Report], now: str, max_age_seconds: float | None
) -> list[str]:
    """``status.lastUsed``: the last record with the entries each counted report used, on the day its pod
    finished (:func:`compilecache.cache.lastuse.fold`: bounded, idempotent, so a pass may fold a pod again)."""
    today = lastuse.day_of(now) or now[:10]
    uses = [(report.finished_at, report.used) for report in reports if report.used]
    return lastuse.fold(record, uses, today, max_age_seconds)
