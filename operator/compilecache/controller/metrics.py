"""Prometheus metrics of the operator, served at ``/metrics`` (``prometheus_client``).

``compilecache_build_info`` (1, labelled with the operator's, Python's and kopf's versions) says
what runs. Per cache (labels ``namespace`` and ``name`` only, plus a small fixed set: phase, rule, reason):
the phase as one 0/1 gauge per phase (kube-state-metrics style), entries and bytes,
the last warm-up's duration and end, expiry deletions by rule, stuck warm-up and expiry pods
by reason, gated pods, gate timeouts and the compiles training pods requested and hit; per cache,
pool (and its ``hosts``) and ``run`` (first, resumed, verify, other), the warm-up pods' GPU-seconds.
Operator-wide: the duration of passes, API requests by verb and resource, API errors by verb and
status code, webhook admissions by outcome. No label names a pod or a Job: the series of a cache
are bounded (a pool label takes the names of its ``status.pools[]``, at most 512), and removed
(:meth:`Metrics.forget`) when the cache is gone.

This module is a leaf of the controller package (``prometheus_client`` and the standard library
only), so that every module can import :data:`METRICS` without an import circle. It knows figures,
not resources: ``metricsfeed.py`` reads a pass's recorded status and pods into a
:class:`CacheFigures` (so the pure ``plan.plan`` stays free of it). Counters that must not count
twice (a pod seen by many passes, one expiry run seen by many passes) remember what they counted,
per cache and bounded. The GPU-seconds are counted from what a pass adds to the cache's recorded
status (``metricsfeed.gpu_seconds_added``): the record is shared by the replicas and outlives a
restart, so neither a failover nor a restart counts a pod again. The metrics live in their own
``CollectorRegistry``, not the process-global one, so operators run in one test process do not collide.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import platform
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

PORT_ENV = "COMPILECACHE_METRICS_PORT"
ADDR_ENV = "COMPILECACHE_METRICS_ADDR"
DEFAULT_PORT = 8000  # prometheus_client's own default; 0 turns the endpoint off
DEFAULT_ADDR = "0.0.0.0"  # scraped from other pods, like kopf's own liveness endpoint
PATH = "/metrics"

ADMISSION_OUTCOMES = ("mutated", "gated", "unchanged", "error")
REMEMBERED_PODS = 4096  # pod uids remembered per cache, so a pod seen in many passes counts once
CACHE = ("namespace", "name")
DISTRIBUTION = "compilecache-operator"  # pyproject.toml's project name (the import name is compilecache)
UNKNOWN = "unknown"
GPU_RUNS = ("first", "resumed", "verify", "other")  # status.RUNS and status.OTHER_RUN (this module is a leaf)


def _version(distribution: str) -> str:
    """The installed version of a distribution; ``unknown`` when it runs from a source tree, uninstalled."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def build_info() -> dict[str, str]:
    """The labels of ``compilecache_build_info``: what a bug report or an alert needs to name the build."""
    return {"version": _version(DISTRIBUTION), "python": platform.python_version(), "kopf": _version("kopf")}


@dataclass(frozen=True)
class PodFigures:
    """What one pod of a cache adds to its counters: a gate timeout, a trainer's report (counted once)."""

    uid: str
    gate_timed_out: bool = False
    report: tuple[int, int] | None = None  # (compile requests, cache hits) of a finished training pod


@dataclass(frozen=True)
class CacheFigures:
    """A cache's figures after a pass (``metricsfeed.figures`` reads them from its status and pods).

    ``None`` leaves a gauge as it was: the status did not say (yet).
    """

    phases: Mapping[str, bool]  # every phase, True for the current one
    stuck: Mapping[str, int]  # every reason, 0 included: a series that appears late breaks rate() and alerts
    entries: int | None = None
    bytes: int | None = None
    warmup: tuple[float, float] | None = None  # the last warm-up's (duration, end as epoch seconds)
    compile_seconds: float | None = None
    gated: int | None = None
    waiting_workloads: int | None = None  # Kueue Workloads our admission check holds for the cache (checks.py)
    unwarmed_image: int | None = None  # training pods on an image the cache never warmed (images.py)
    expired_at: str | None = None  # the last expiry run, counted once
    deleted: Mapping[str, int] = field(default_factory=dict)  # its deletions by rule label
    pods: Sequence[PodFigures] = ()
    # (pool, hosts) of the status's pools: each gets its GPU-seconds series at 0 (rate() needs them early)
    gpu_pools: Sequence[tuple[str, int]] = ()
    # GPU-seconds the pass's record added, by (pool, hosts, run): counted as they are
    gpu_seconds: Mapping[tuple[str, int, str], float] = field(default_factory=dict)


@dataclass
class _Seen:
    """What was counted for one cache: pod uids (bounded, oldest dropped) and the last expiry counted."""

    pods: OrderedDict[str, None] = field(default_factory=OrderedDict)
    timeouts: OrderedDict[str, None] = field(default_factory=OrderedDict)
    expired_at: str | None = None
    # the label values set for this cache, so that forget() removes every series it made
    phases: set[str] = field(default_factory=set)
    reasons: set[str] = field(default_factory=set)
    rules: set[str] = field(default_factory=set)
    gpu_pools: set[tuple[str, int]] = field(default_factory=set)


def _first_time(seen: OrderedDict[str, None], uid: str) -> bool:
    if uid in seen:
        return False
    seen[uid] = None
    while len(seen) > REMEMBERED_PODS:
        seen.popitem(last=False)
    return True


class Metrics:
    """The operator's metrics in their own registry; thread-safe (passes run on several workers)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge(
            "compilecache_build_info",
            "Always 1; the labels name the operator's, Python's and kopf's versions.",
            ["version", "python", "kopf"],
            registry=r,
        )
        self.build_info.labels(**build_info()).set(1.0)
        self.phase = Gauge(
            "compilecache_cache_phase",
            "1 for the cache's current phase, 0 for the others.",
            [*CACHE, "phase"],
            registry=r,
        )
        self.entries = Gauge("compilecache_cache_entries", "Compiled executables in the cache.", CACHE, registry=r)
        self.bytes = Gauge("compilecache_cache_bytes", "Bytes the cache holds.", CACHE, registry=r)
        self.warmup_duration = Gauge(
            "compilecache_warmup_last_duration_seconds",
            "From the first pool's start to the last pool's end of the last warm-up that succeeded.",
            CACHE,
            registry=r,
        )
        self.warmup_time = Gauge(
            "compilecache_warmup_last_finished_timestamp_seconds",
            "When the last warm-up finished (Unix time).",
            CACHE,
            registry=r,
        )
        self.compile_seconds = Gauge(
            "compilecache_warmup_last_compile_seconds",
            "Seconds the last warm-up spent compiling, over its pools (from the warm reports).",
            CACHE,
            registry=r,
        )
        self.expiry_deleted = Counter(
            "compilecache_expiry_deleted_entries",
            "Entries expiry deleted, by rule.",
            [*CACHE, "rule"],
            registry=r,
        )
        self.stuck = Gauge(
            "compilecache_stuck_pods",
            "Warm-up and expiry pods of the cache stuck now, by reason (Unschedulable, ImagePullBackOff, ...).",
            [*CACHE, "reason"],
            registry=r,
        )
        self.gated = Gauge(
            "compilecache_consumers_gated_pods", "Training pods held by the gate now.", CACHE, registry=r
        )
        self.waiting_workloads = Gauge(
            "compilecache_consumers_waiting_workloads",
            "Kueue Workloads whose admission check waits for the cache now (quota held, no pod yet).",
            CACHE,
            registry=r,
        )
        self.unwarmed_image = Gauge(
            "compilecache_consumers_unwarmed_image_pods",
            "Training pods of the cache on an image it never warmed and does not warm now (they compile cold).",
            CACHE,
            registry=r,
        )
        self.gate_timeouts = Counter(
            "compilecache_gate_timeouts",
            "Training pods, and Kueue Workloads of the admission check, released by gateTimeout before the cache "
            "was ready.",
            CACHE,
            registry=r,
        )
        self.training_requests = Counter(
            "compilecache_training_compile_requests",
            "Compiles finished training pods asked the cache for (their own report).",
            CACHE,
            registry=r,
        )
        self.training_hits = Counter(
            "compilecache_training_cache_hits", "Compiles finished training pods found in the cache.", CACHE, registry=r
        )
        self.gpu_seconds = Counter(
            "compilecache_warmup_gpu_seconds",
            "GPUs x seconds of the cache's finished warm-up pods (retried pods included; not a multi-host group "
            "started over in a new Job: docs/cost.md), by pool, hosts and run "
            "(first, resumed, verify; other: start-up, publishing, and runs an older warm-up did not time). "
            "Counted when the status records them, so each pod once across replicas and restarts; expiry "
            "pods use no GPU.",
            [*CACHE, "pool", "hosts", "run"],
            registry=r,
        )
        self.reconcile = Histogram(
            "compilecache_reconcile_duration_seconds",
            "Duration of one pass over a cache.",
            ["result"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.api_requests = Counter(
            "compilecache_api_requests",
            "Kubernetes API calls the operator's passes, webhook and watchdog made, by verb (get, list, create, "
            "patch, delete) and resource[/subresource]. kopf's own watches are not counted.",
            ["verb", "resource"],
            registry=r,
        )
        self.api_errors = Counter(
            "compilecache_api_errors",
            "Kubernetes API calls that failed, by verb and HTTP status (0: no answer).",
            ["verb", "code"],
            registry=r,
        )
        self.admissions = Counter(
            "compilecache_webhook_admissions", "Pods the webhook admitted, by outcome.", ["outcome"], registry=r
        )
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], _Seen] = {}

    # --- per cache, from a pass's status and pods

    def observe_cache(self, namespace: str, name: str, figures: CacheFigures) -> None:
        """Set the cache's series from its figures after a pass."""
        key = (namespace, name)
        for phase, current in figures.phases.items():
            self.phase.labels(namespace, name, phase).set(1.0 if current else 0.0)
        if figures.entries is not None:
            self.entries.labels(*key).set(float(figures.entries))
        if figures.bytes is not None:
            self.bytes.labels(*key).set(float(figures.bytes))
        if figures.warmup is not None:
            self.warmup_duration.labels(*key).set(figures.warmup[0])
            self.warmup_time.labels(*key).set(figures.warmup[1])
        if figures.compile_seconds is not None:
            self.compile_seconds.labels(*key).set(figures.compile_seconds)
        for reason, count in figures.stuck.items():
            self.stuck.labels(namespace, name, reason).set(float(count))
        if figures.gated is not None:
            self.gated.labels(*key).set(float(figures.gated))
        if figures.waiting_workloads is not None:
            self.waiting_workloads.labels(*key).set(float(figures.waiting_workloads))
        if figures.unwarmed_image is not None:
            self.unwarmed_image.labels(*key).set(float(figures.unwarmed_image))
        # Counters start at 0 for every cache (a series that appears late breaks rate() and alerts).
        for counter in (self.gate_timeouts, self.training_requests, self.training_hits):
            counter.labels(*key)
        with self._lock:
            seen = self._seen.setdefault(key, _Seen())
            seen.phases.update(figures.phases)
            seen.reasons.update(figures.stuck)
            for pool, hosts in figures.gpu_pools:
                seen.gpu_pools.add((pool, hosts))
                for run in GPU_RUNS:
                    self.gpu_seconds.labels(namespace, name, pool, str(hosts), run)
            for (pool, hosts, run), seconds in figures.gpu_seconds.items():
                if run in GPU_RUNS and seconds > 0:
                    seen.gpu_pools.add((pool, hosts))
                    self.gpu_seconds.labels(namespace, name, pool, str(hosts), run).inc(seconds)
            if figures.expired_at and figures.expired_at != seen.expired_at:
                seen.expired_at = figures.expired_at
                for rule, count in figures.deleted.items():
                    seen.rules.add(rule)
                    self.expiry_deleted.labels(namespace, name, rule).inc(max(0, count))
            for pod in figures.pods:
                if pod.gate_timed_out and _first_time(seen.timeouts, pod.uid):
                    self.gate_timeouts.labels(*key).inc()
                if pod.report is not None and _first_time(seen.pods, pod.uid):
                    self.training_requests.labels(*key).inc(pod.report[0])
                    self.training_hits.labels(*key).inc(pod.report[1])

    def count_gate_timeouts(self, namespace: str, name: str, uids: Iterable[str]) -> None:
        """Count pods just released by gateTimeout (their patch took; read before the annotation is read back)."""
        key = (namespace, name)
        with self._lock:
            seen = self._seen.setdefault(key, _Seen())
            for uid in uids:
                if _first_time(seen.timeouts, uid):
                    self.gate_timeouts.labels(*key).inc()

    def forget(self, namespace: str, name: str) -> None:
        """Remove every series of a cache that is gone (and what was remembered for it)."""
        key = (namespace, name)
        with self._lock:
            seen = self._seen.pop(key, None)
        if seen is None:  # nothing was set for it in this process
            return
        for phase in seen.phases:
            _remove(self.phase, namespace, name, phase)
        for metric in (
            self.entries,
            self.bytes,
            self.warmup_duration,
            self.warmup_time,
            self.compile_seconds,
            self.gated,
            self.waiting_workloads,
            self.unwarmed_image,
            self.gate_timeouts,
            self.training_requests,
            self.training_hits,
        ):
            _remove(metric, namespace, name)
        for reason in seen.reasons:
            _remove(self.stuck, namespace, name, reason)
        for rule in seen.rules:
            _remove(self.expiry_deleted, namespace, name, rule)
        for pool, hosts in seen.gpu_pools:
            for run in GPU_RUNS:
                _remove(self.gpu_seconds, namespace, name, pool, str(hosts), run)

    # --- operator-wide

    def api_request(self, verb: str, resource: str) -> None:
        """Count one API call as the API server names it: ``verb`` and ``resource[/subresource]``."""
        self.api_requests.labels(verb, resource).inc()

    def api_error(self, verb: str, code: int) -> None:
        """Count a failed API call (``code`` 0: no answer, or not made because the operator is stopping)."""
        self.api_errors.labels(verb.lower(), str(code)).inc()

    def admission(self, outcome: str) -> None:
        """Count one pod the webhook answered for."""
        self.admissions.labels(outcome if outcome in ADMISSION_OUTCOMES else "error").inc()


def _remove(metric: Any, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set for this cache
        metric.remove(*labels)


METRICS = Metrics()  # the operator's; a pass, the API client and the webhook update it


def port_from_env(environ: Mapping[str, str]) -> tuple[str, int]:
    """``(addr, port)`` from ``COMPILECACHE_METRICS_ADDR``/``_PORT``; port 0 means no endpoint.

    Raises ``ValueError`` naming the variable for a port that is not 0-65535.
    """
    text = (environ.get(PORT_ENV) or str(DEFAULT_PORT)).strip()
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise ValueError(f"{PORT_ENV} must be a port number (0 turns metrics off), got {text!r}")
    return (environ.get(ADDR_ENV) or DEFAULT_ADDR).strip(), int(text)


def serve(addr: str, port: int, metrics: Metrics = METRICS) -> Any | None:
    """Serve ``/metrics`` in a thread; return the server (``shutdown()`` stops it), ``None`` if off or refused.

    A port that cannot be bound is logged, not fatal: the caches must be reconciled without metrics too.
    """
    if port == 0:
        return None
    try:
        server, _thread = start_http_server(port, addr, registry=metrics.registry)
    except OSError as exc:
        logger.error("Cannot serve metrics at %s:%d: %s", addr, port, exc)
        return None
    logger.info("Serving metrics at http://%s:%d%s.", addr, port, PATH)
    return server
