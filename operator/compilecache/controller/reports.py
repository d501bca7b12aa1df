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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA = "compilecache.dev/trainer/v1"
FINISHED_PHASES = ("Succeeded", "Failed")
REASON_CHARS = 300  # status.consumers.lastMissReason (the CRD's maxLength)
NOT_WARMED = "not warmed"  # compilecache.training.verdict.NOT_WARMED (that module imports JAX's side; this one never)
NOT_WARMED_FIX = "it runs after the warmed steps; warm whole epochs (steps: auto) or more steps"


@dataclass(frozen=True)
class Report:
    """One training container's verdict."""

    requests: int
    hits: int
    missed: tuple[tuple[str, str], ...] = ()  # (compile name, why), at most 10
    summary: str = ""
    finished_at: str = ""

    @property
    def miss_reason(self) -> str:
        """One line on the first miss (``name: reason``, with what to change when the reason alone does
        not say it), or ``""`` when everything hit."""
        if not self.missed:
            return ""
        name, reason = self.missed[0]
        if reason == NOT_WARMED:
            # The trainer cannot tell at which step (JAX runs a jitted step from C++, uncounted): the
            # program ran after the warmed steps (an epoch-end evaluation, a gather every k steps).
            return f"{name}: {reason}: {NOT_WARMED_FIX}"
        return f"{name}: {reason}" if reason else name


def parse(message: str | None) -> Report | None:
    """The report in a termination message: the last line that is a JSON object of the schema, else ``None``."""
    for line in reversed((message or "").strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            document = json.loads(line)
        except ValueError:
            continue
        report = _report(document)
        if report is not None:
            return report
    # The whole message as one document: a writer that pretty-printed it.
    try:
        return _report(json.loads(message or ""))
    except ValueError:
        return None


def _report(document: Any) -> Report | None:
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return None
    requests, hits = _count(document.get("requests")), _count(document.get("hits"))
    if requests is None or hits is None:
        return None
    missed = tuple(
        (str(item.get("name") or "")[:REASON_CHARS], str(item.get("reason") or "")[:REASON_CHARS])
        for item in (document.get("missed") or [])[:10]
        if isinstance(item, dict)
    )
    return Report(requests, min(hits, requests), missed, str(document.get("summary") or "")[:REASON_CHARS])


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def pod_report(pod: Mapping[str, Any]) -> Report | None:
    """The report of a finished training pod (its newest container with one), or ``None``."""
    pod_status = pod.get("status") or {}
    if pod_status.get("phase") not in FINISHED_PHASES:
        return None
    found: list[Report] = []
    for state in pod_status.get("containerStatuses") or []:
        terminated = (state.get("state") or {}).get("terminated") or {}
        report = parse(terminated.get("message"))
        if report is not None:
            found.append(Report(**{**report.__dict__, "finished_at": str(terminated.get("finishedAt") or "")}))
    return max(found, key=lambda report: report.finished_at) if found else None


def consumer_counts(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``status.consumers`` hits, requests and lastMissReason over the finished training pods that exist now."""
    reports = [report for pod in pods if (report := pod_report(pod)) is not None]
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
