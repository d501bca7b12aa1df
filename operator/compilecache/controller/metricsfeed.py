"""Reads a cache's recorded status and pods into the figures ``metrics.py`` sets (the metrics' input side).

``metrics.py`` is a leaf that knows only figures; the reading of resources lives here, beside the
modules that own each piece: the phases and pool states (``status``), the stuck-pod reasons
(``podstate``), the gate's release annotation (``gates``), the trainers' reports (``reports``) and
the expiry rules (``cache.expiry``). ``reconcile`` calls :func:`observe_cache` after each pass, so
the pure ``plan.plan`` stays free of metrics.
"""

from __future__ import annotations

import calendar
import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compilecache.cache import expiry
from compilecache.controller import gates, podstate, reports, status
from compilecache.controller.metrics import CacheFigures, Metrics, PodFigures

OTHER_RULE = "other"  # the label of an expiry rule this operator does not know (a newer expiry image)


def _time(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC time as Kubernetes writes it, or ``None``."""
    if not value:
        return None
    try:
        return float(calendar.timegm(time.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def last_warmup(pools: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """The last warm-up's (duration in seconds, end as epoch seconds) over its succeeded pools.

    From the first pool's start to the last pool's end: what a team waits for a new spec.
    """
    spans = [
        (start, end)
        for pool in pools
        if pool.get("state") == status.POOL_SUCCEEDED
        and (start := _time(pool.get("startedAt"))) is not None
        and (end := _time(pool.get("finishedAt"))) is not None
    ]
    if not spans:
        return None
    first, last = min(start for start, _ in spans), max(end for _, end in spans)
    return max(0.0, last - first), last


def pod_figures(pod: Mapping[str, Any]) -> PodFigures:
    """What one pod adds to the cache's counters: released by gateTimeout, and its trainer's report."""
    meta = pod.get("metadata") or {}
    released = str((meta.get("annotations") or {}).get(gates.ANNOTATION_RELEASED) or "")
    report = reports.pod_report(pod)
    return PodFigures(
        uid=podstate.pod_uid(pod),
        gate_timed_out=released.startswith(gates.GATE_TIMEOUT),
        report=None if report is None else (report.requests, report.hits),
    )


def gpu_seconds_added(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[tuple[str, int, str], float]:
    """The GPU-seconds a pass's record added to the cache's, by (pool, hosts, run): what the metric counts.

    A pool's ``gpuSeconds`` belong to its Job (``status.pool_cost``): a new Job's are new, and a record of
    the same Job only grows (more of its pods seen), so only the growth is new. Counting the difference
    of two records, not the pods a process saw, is what keeps a pod counted once when another replica
    takes over or the operator restarts: the record is theirs too.
    """
    old = {status.key(pool): pool for pool in before.get("pools") or []}
    added: dict[tuple[str, int, str], float] = {}
    for pool in after.get("pools") or []:
        new = status.mapping_or_empty(pool.get("gpuSeconds"))
        if not new:
            continue
        previous = old.get(status.key(pool)) or {}
        same = previous.get("job") == pool.get("job")
        counted = status.mapping_or_empty(previous.get("gpuSeconds")) if same else {}
        name, hosts = status.key(pool)
        for run in (*status.RUNS, status.OTHER_RUN):
            grown = _seconds(new.get(run)) - _seconds(counted.get(run))
            if grown > 0:
                added[(name, hosts, run)] = grown
    return added


def _seconds(value: Any) -> float:
    """A recorded number of GPU-seconds (the CRD's: a finite number, at least 0), else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return max(0.0, float(value))


def figures(recorded: Mapping[str, Any], pods: Iterable[Mapping[str, Any]] = ()) -> CacheFigures:
    """The cache's figures from the status a pass recorded and the pods it read (no GPU-seconds counted:
    those are what a record adds, :func:`observe_cache`)."""
    phase = recorded.get("phase")
    cache = recorded.get("cache") or {}
    pools = recorded.get("pools") or []
    warmup = last_warmup(pools)
    seconds = [float(pool.get("compileSeconds") or 0) for pool in pools if "compileSeconds" in pool]
    stuck = status.stuck_reasons(recorded)
    consumers = recorded.get("consumers") or {}
    deleted: dict[str, int] = {}
    for rule, count in (cache.get("lastDeleted") or {}).items():
        label = rule if rule in expiry.RULES else OTHER_RULE
        deleted[label] = deleted.get(label, 0) + int(count or 0)
    return CacheFigures(
        phases={each: each == phase for each in status.PHASES},
        stuck={reason: stuck.count(reason) for reason in podstate.REASONS},  # a fixed set: every series exists
        entries=int(cache.get("entries") or 0) if "entries" in cache else None,
        bytes=int(cache.get("bytes") or 0) if "entries" in cache else None,
        warmup=warmup,
        compile_seconds=sum(seconds) if warmup is not None and seconds else None,
        gated=int(consumers.get("gated") or 0) if "gated" in consumers else None,
        waiting_workloads=int(consumers.get("workloads") or 0) if "workloads" in consumers else None,
        # Absent from counted consumers when there are none: the gauge then reads 0.
        unwarmed_image=int(consumers.get("unwarmedImage") or 0) if "gated" in consumers else None,
        expired_at=cache.get("lastExpired") or None,
        deleted=deleted,
        pods=[pod_figures(pod) for pod in pods],
        gpu_pools=[status.key(pool) for pool in pools],
    )


def observe_cache(
    metrics: Metrics,
    namespace: str,
    name: str,
    recorded: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> None:
    """Set the cache's series in ``metrics`` from the status a pass made and the pods it read.

    ``before`` and ``after``: the record as the pass found it and as it left it (``before`` again when its
    write failed), whose difference the GPU-seconds counter counts; without them it counts nothing.
    """
    found = figures(recorded, pods)
    if before is not None:
        found = dataclasses.replace(found, gpu_seconds=gpu_seconds_added(before, after or before))
    metrics.observe_cache(namespace, name, found)
