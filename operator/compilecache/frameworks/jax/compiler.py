"""Compile targets in this process and attribute JAX's cache events to each.

JAX reports cache activity globally (``jax.monitoring`` events and log lines);
both fire in the thread that compiles, so a thread-local "current target"
attributes them even when ``--jobs`` compiles several targets at once.
JAX is imported inside functions: the caller sets the cache options first.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compilecache.cache.errors import WarmError, one_line
from compilecache.frameworks.jax import listeners
from compilecache.frameworks.jax.target import Target

if TYPE_CHECKING:
    from compilecache.frameworks.jax.progress import Progress

REQUESTS_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
HITS_EVENT = "/jax/compilation_cache/cache_hits"
SETUP_TARGET = "(setup)"

# Loggers whose DEBUG lines name the cache key of each request, and (cache_key)
# the hash of each key component, so a miss can say *what* differed.
_KEY_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache", "jax._src.cache_key")
# JAX only warns when it cannot write an entry (jax/_src/compiler.py _cache_write), with the
# OSError or GCS error in the text: the warmer fails the run on it, naming the cause.
WRITE_FAILED = "Error writing persistent compilation cache entry"
_WITH_KEY = re.compile(r"with key '([^']+)'")
_COMPONENT = re.compile(r"^get_cache_key hash of serialized (.+): ([0-9a-f]{64})$")


@dataclass
class TargetRun:
    """What happened while one target (or a workload's setup) compiled."""

    workload: str
    name: str
    compile_seconds: float = 0.0
    requests: int = 0
    hits: int = 0
    keys_hit: list[str] = field(default_factory=list)
    keys_missed: list[str] = field(default_factory=list)
    keys_written: list[str] = field(default_factory=list)
    key_components: dict[str, str] = field(default_factory=dict)
    miss_log: list[str] = field(default_factory=list)
    # What was lowered (compilecache.frameworks.jax.keydiff), to name what differs on a miss.
    signature: dict[str, Any] = field(default_factory=dict)
    # Whether this compile used training's side (Target.training_args/training_fn).
    checks_training: bool = False
    # Whether verify lowered training's own jit (Target.training_fn): only then is donation training's.
    lowers_training_fn: bool = False
    # Exact mode: every program the entrypoint compiled, module name → its distinct signatures.
    signatures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Exact mode: the step function counted and the steps asked (N or "auto"); a trainer counts the
    # same function's calls to say at which step it missed, and the status what to change.
    step_fn: str = ""
    steps: int | str | None = None

    def add_signature(self, module: str, signature: dict[str, Any]) -> None:
        """Record one compiled program's signature (each distinct one once)."""
        known = self.signatures.setdefault(module, [])
        if signature not in known:
            known.append(signature)

    @property
    def misses(self) -> int:
        """Requests that did not hit (JAX's ``cache_misses`` event fires only on writes)."""
        return self.requests - self.hits

    @property
    def hit(self) -> bool:
        """Every cache request of this target hit (and there was at least one)."""
        return self.requests > 0 and self.hits == self.requests


class CacheEvents:
    """Counts cache requests/hits and captures cache keys per target, per thread."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._saved: dict[str, tuple[int, logging.Filter]] = {}
        self._warnings = warnings.catch_warnings()
        self.write_errors: list[str] = []  # JAX's warnings of entries it could not write, one line each

    def __enter__(self) -> CacheEvents:
        import jax.monitoring

        jax.monitoring.register_event_listener(self._on_event)
        self._warnings.__enter__()  # restores the filters and showwarning at exit
        warnings.filterwarnings("always", message=WRITE_FAILED)
        shown = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if str(message).startswith(WRITE_FAILED):
                with self._lock:  # the run's own error says it: not shown twice
                    self.write_errors.append(" ".join(str(message).split()))
                return
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        for name in _KEY_LOGGERS:
            logger = logging.getLogger(name)
            # DEBUG is where JAX logs the key of every hit, miss and write. A filter on the logger
            # reads each record and passes on only what the logging the workload configured would
            # have shown (absl or basicConfig handlers on the root would print every DEBUG line
            # that propagates: a handler of ours could not stop that).
            capture = _Capture(self, passes=logger.getEffectiveLevel())
            self._saved[name] = (logger.level, capture)
            logger.addFilter(capture)
            logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:

        listeners.unregister_event_listener(self._on_event)
        for name, (level, capture) in self._saved.items():
            logger = logging.getLogger(name)
            logger.removeFilter(capture)
            logger.setLevel(level)
        self._saved.clear()
        self._warnings.__exit__(None, None, None)

    @contextmanager
    def attribute_to(self, run: TargetRun) -> Iterator[TargetRun]:
        """Attribute the cache activity of this thread to ``run`` inside the block."""
        previous = getattr(self._local, "run", None)
        self._local.run = run
        try:
            yield run
        finally:
            self._local.run = previous

    def current(self) -> TargetRun | None:
        """The run this thread's events go to, if any."""
        run: TargetRun | None = getattr(self._local, "run", None)
        return run

    def _on_event(self, event: str, **_: object) -> None:
        run = self.current()
        if run is None:
            return
        with self._lock:
            if event == REQUESTS_EVENT:
                run.requests += 1
            elif event == HITS_EVENT:
                run.hits += 1

    def on_log(self, record: logging.LogRecord) -> None:
        """Route one JAX log record to the current target."""
        run = self.current()
        if run is None:
            return
        message = record.getMessage()
        with self._lock:
            component = _COMPONENT.match(message)
            if component:
                run.key_components[component[1]] = component[2]
                return
            key = _WITH_KEY.search(message)
            if key is None:
                return
            if message.startswith("Writing "):
                run.keys_written.append(key[1])
            elif "CACHE MISS" in message:
                run.keys_missed.append(key[1])
                run.miss_log.append(message)
            elif "cache hit" in message:
                run.keys_hit.append(key[1])


class _Capture(logging.Filter):
    """Hands every record to :meth:`CacheEvents.on_log`; lets through only those at or above ``passes``."""

    def __init__(self, events: CacheEvents, *, passes: int) -> None:
        super().__init__()
        self._events = events
        self._passes = passes

    def filter(self, record: logging.LogRecord) -> bool:
        self._events.on_log(record)
        return record.levelno >= self._passes


def lower_and_compile(target: Target, args: Sequence[Any], *, training: bool = False) -> dict[str, Any]:
    """``fn.lower(*args, **kwargs).compile()``: what the warmer and verify both do.

    With ``training`` the target's ``training_fn`` (if any) is lowered instead of
    ``fn``. Returns the lowered program's signature (empty if it cannot be read:
    explaining a miss must never fail a warm-up).
    """
    from compilecache.frameworks.jax.keydiff import signature_of

    fn = target.training_fn if training and target.training_fn is not None else target.fn
    lowered = fn.lower(*args, **dict(target.kwargs))
    lowered.compile()
    try:
        return signature_of(lowered, args, target.kwargs)
    except Exception:  # private JAX internals may move; the compile itself succeeded
        return {}


def target_args(target: Target, *, training: bool) -> Sequence[Any]:
    """``args``, or with ``training`` the arrays ``training_args()`` builds (if given)."""
    if training and target.training_args is not None:
        return target.training_args()
    return target.args


def compile_targets(
    items: Sequence[tuple[str, Target]],
    events: CacheEvents,
    *,
    jobs: int = 1,
    training: bool = False,
    progress: Progress | None = None,
) -> list[TargetRun]:
    """Compile every target, ``jobs`` at a time, and return one run per target in order.

    Threads, not processes: XLA compiles outside the GIL, and a process per
    target would import JAX and re-run the workload each time (measured
    slower; see bench/coldwarm.py). The first failure is raised as a
    :class:`WarmError` naming the target.
    """
    runs = [TargetRun(workload, target.name) for workload, target in items]

    def one(index: int) -> None:
        workload, target = items[index]
        run = runs[index]
        try:
            # Building training's real inputs may compile (an initialiser): not
            # this target's program, so outside its attribution.
            args = target_args(target, training=training)
        except Exception as error:
            raise WarmError(
                f"target {target.name!r} of workload {workload}: training_args raised {one_line(error)}"
            ) from error
        run.checks_training = target.checks_training
        run.lowers_training_fn = training and target.training_fn is not None
        if progress is not None:
            progress.begin(index, f"{workload} {target.name}", index + 1, len(items))
        with events.attribute_to(run):
            start = time.perf_counter()
            try:
                run.signature = lower_and_compile(target, args, training=training)
            except Exception as error:
                raise WarmError(
                    f"target {target.name!r} of workload {workload} failed to compile: {one_line(error)}"
                ) from error
            run.compile_seconds = time.perf_counter() - start
        if progress is not None:
            outcome = "hit" if run.hit else f"{run.misses}/{run.requests} compiled"
            progress.end(index, outcome=outcome, keys_written=run.keys_written, seconds=run.compile_seconds)

    _run_all(one, len(items), jobs)
    return runs


class WriteFailed(WarmError):
    """JAX could not write entries (a full disk, a quota): the place and JAX's cause, and the runs,
    whose entries written in place (GCS) the warmer takes back."""

    def __init__(self, cache_dir: str, errors: Sequence[str], runs: Sequence[TargetRun]) -> None:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"JAX could not write into {cache_dir}: {errors[0]}{more}")
        self.runs = list(runs)


def effective_jobs(jobs: int, cpus: int | None = None) -> int:
    """``--jobs`` capped at half the CPU cores.

    XLA's CPU compiler already keeps ~1.5 cores busy per compile: measured on
    2 cores, 2 compile threads were 0.78x of sequential, so on small machines
    extra threads only add contention and we stay sequential.
    """
    return max(1, min(jobs, (cpus if cpus is not None else os.cpu_count() or 1) // 2))


def _run_all(fn: Callable[[int], None], count: int, jobs: int) -> None:
    jobs = effective_jobs(jobs)
    if jobs <= 1 or count <= 1:
        for index in range(count):
            fn(index)
        return
    with ThreadPoolExecutor(max_workers=min(jobs, count), thread_name_prefix="compile") as pool:
        for future in [pool.submit(fn, index) for index in range(count)]:
            future.result()


def environment_facts() -> dict[str, Any]:
    """jax/jaxlib versions, backend, device kind and count: what the cache key depends on."""
    from compilecache.frameworks.jax import keysettings

    settings = keysettings.current()
    # The top-level fields are what expiry ranks builds by (keepVersions, per platform);
    # `settings` is everything a trainer compares to say why it missed (keysettings).
    return {"settings": settings} | {key: settings[key] for key in keysettings.PLATFORM}


def run_to_dict(run: TargetRun) -> dict[str, Any]:
    """A :class:`TargetRun` as JSON-able data."""
    return {
        "workload": run.workload,
        "name": run.name,
        "compile_seconds": run.compile_seconds,
        "requests": run.requests,
        "hits": run.hits,
        "keys_hit": run.keys_hit,
        "keys_missed": run.keys_missed,
        "keys_written": run.keys_written,
        "key_components": run.key_components,
        "miss_log": run.miss_log,
        "signature": run.signature,
        "checks_training": run.checks_training,
        "lowers_training_fn": run.lowers_training_fn,
        "signatures": run.signatures,
        "step_fn": run.step_fn,
        "steps": run.steps,
    }


def run_from_dict(data: Mapping[str, Any]) -> TargetRun:
    """Inverse of :func:`run_to_dict`."""
    return TargetRun(**{key: data[key] for key in run_to_dict(TargetRun("", "")) if key in data})
