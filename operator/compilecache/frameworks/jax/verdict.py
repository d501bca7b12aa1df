"""A training process's own verdict on the warmed cache: one line at exit, and one JSON result.

Loaded with no change to the training code: the package declares this module under JAX's
``jax_plugins`` entry-point group, and JAX imports it and calls :func:`initialize` when it first
initialises its backends (``jax/_src/xla_bridge.py`` ``discover_pjrt_plugins``). It does nothing
unless the process has ``COMPILECACHE_REPORT`` set (the webhook and ``compilecache env`` set it;
warm-up Jobs do not). :func:`compilecache.frameworks.jax.runtime.enable` installs it too.

Counting is JAX's own: the ``jax.monitoring`` events ``compile_requests_use_cache`` and
``cache_hits`` (misses = requests − hits; JAX's ``cache_misses`` event fires only on a write). The
names of the missed programs come from the DEBUG record JAX logs for each miss; the record is
captured by a logger filter that lets through only what the logger would have passed anyway, so
no DEBUG line reaches the console whatever logging the workload configures. Why a program missed
comes from the run manifests in the cache (read only): a key-relevant setting that differs from
the warm-up's (:mod:`compilecache.frameworks.jax.keysettings`), what differs from the program the warm-up
recorded under the same name (:func:`compilecache.frameworks.jax.keydiff.closest_difference`; this process's
side is read from the compile request that missed, :mod:`compilecache.frameworks.jax.compilehook`), a
program warmed under another key, or a program not warmed at all; an entry that was in the cache
but JAX could not read is "entry corrupt" (:func:`_entry_present`), whatever the manifests say.
Each hit is named too, from the DEBUG record JAX logs for it: the report's ``used`` keys
(:mod:`compilecache.cache.lastuse`) keep those entries alive past ``maxAge``.
Each miss also records at which step it came: the calls of the exact warm-up's step function
that had returned (:mod:`compilecache.frameworks.jax.stepcount`, installed here when the manifests name
one; left out otherwise).

Once compiling has settled (no cache request for ``COMPILECACHE_REPORT_SETTLE_SECS``, default
60, after the first: the first steps have compiled), it prints the line to stderr, so a run of
days says early whether it hit; ``0`` waits for the exit. At exit it prints the line again only
if the counts changed since, and when the termination message file exists, is writable
and still empty (the container's own message wins), writes one JSON object there (under 4096
bytes, Kubernetes' limit) for the operator to read.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache.cache import lastuse
from compilecache.cache.cacheenv import DEFAULT_TERMINATION_LOG, REPORT, TERMINATION_LOG
from compilecache.cache.entries import entry_module, entry_name
from compilecache.cache.errors import cut
from compilecache.frameworks.jax import compilehook, keysettings
from compilecache.frameworks.jax.keydiff import closest_difference, display_name, signature_of_computation
from compilecache.frameworks.jax.stepcount import StepCount, warmed_steps
from compilecache.training.report import (
    NOT_WARMED,
    SCHEMA,
    fit,
    summary_line,
    write_termination_message,
)

# The same events frameworks/jax/compiler.py counts for the warmer.
REQUESTS_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
HITS_EVENT = "/jax/compilation_cache/cache_hits"
KEY_DIFFERS = "warmed under another key: arguments, shardings, donation or program differ"
# The key matched (the entry was in the cache before the request) but JAX could not read it: a
# truncated or bit-flipped file ("incorrect data check") or an executable that does not parse.
ENTRY_CORRUPT = "entry corrupt: the key matched but the entry could not be read; the next warm replaces it"
MAX_MISSED = 10
_COMPILER_LOGGER = "jax._src.compiler"
# jax/_src/compiler.py log_persistent_cache_miss: "... MISS for '%s' with key %r".
_MISS = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']*)' with key '([^']*)'")
# jax/_src/compiler.py log_persistent_cache_hit: "Persistent compilation cache hit for '%s' with key %r".
_HIT = re.compile(r"Persistent compilation cache hit for '[^']*' with key '([^']*)'")
_TRUE = ("1", "true", "yes", "on")
SETTLE = "COMPILECACHE_REPORT_SETTLE_SECS"
DEFAULT_SETTLE_SECS = 60.0


@dataclass
class Tally:
    """What this process asked of the cache so far."""

    requests: int = 0
    hits: int = 0
    missed: list[str] = field(default_factory=list)  # the module name of each miss JAX logged, in order
    # What each missed program was lowered with (compilecache.frameworks.jax.keydiff), where it could be read.
    signatures: list[dict[str, Any] | None] = field(default_factory=list)
    # Indices into ``missed`` whose entry was in the cache when JAX asked for it: unreadable, not absent.
    corrupt: set[int] = field(default_factory=set)
    # The environment's key settings at the first miss (keysettings.from_environment): what that
    # compile's key hashed, even if the script restores XLA_FLAGS before it exits.
    environment: dict[str, Any] | None = None
    # Per miss: calls of the step function that had returned (stepcount), None where not counted.
    steps: list[int | None] = field(default_factory=list)
    # The step function(s) whose calls were counted, and the steps the warm-up ran (N or "auto").
    step_fn: str = ""
    warmed_steps: int | str | None = None
    # The use key (cache.lastuse) of each entry read from the cache and hit, in order, each once.
    used: dict[str, None] = field(default_factory=dict)


class Recorder(logging.Filter):
    """Counts JAX's cache events and captures the name of each missed program."""

    def __init__(self, settle_secs: float = 0.0) -> None:
        super().__init__()
        self.tally = Tally()
        self._lock = threading.Lock()
        self.reported = False
        self.lowered_level = False  # whether we set the compiler logger's level to DEBUG
        self.printed: tuple[int, int] | None = None  # (requests, hits) of the line printed, if any
        self.settle_secs = settle_secs
        self._last_request = 0.0
        self._settled = threading.Condition(self._lock)
        self._watcher: threading.Thread | None = None
        self.step_count: StepCount | None = None  # counting the warm-up's step function, if it recorded one
        self.warmed: dict[str, Any] = {}  # step function → the steps the warm-up ran (stepcount.warmed_steps)

    def on_event(self, event: str, **_: object) -> None:
        """A ``jax.monitoring`` listener."""
        if event == REQUESTS_EVENT:
            with self._lock:
                self.tally.requests += 1
                self._last_request = time.monotonic()
                if self.settle_secs > 0 and self._watcher is None:
                    self._watcher = threading.Thread(target=self._report_when_settled, name="compilecache-report")
                    self._watcher.daemon = True  # never keeps a finished training alive
                    self._watcher.start()
        elif event == HITS_EVENT:
            with self._lock:
                self.tally.hits += 1

    def filter(self, record: logging.LogRecord) -> bool:
        """Capture a miss record; pass on only what the logger would pass without our DEBUG level."""
        if isinstance(record.msg, str) and "cache hit for" in record.msg:
            hit = _HIT.search(record.getMessage())
            if hit:
                key = lastuse.use_key(entry_name(hit[1]))
                with self._lock:
                    if len(self.tally.used) < lastuse.MAX_TRACKED:
                        self.tally.used.setdefault(key)
        elif isinstance(record.msg, str) and "CACHE MISS" in record.msg:
            match = _MISS.search(record.getMessage())
            if match:
                signature = _missed_signature()  # on a miss only: the hot path of a hit pays nothing
                corrupt = _entry_present(match[2])
                environment = _environment() if self.tally.environment is None else None
                step = self.step_count.calls if self.step_count is not None else None
                with self._lock:
                    if corrupt:
                        self.tally.corrupt.add(len(self.tally.missed))
                    self.tally.missed.append(match[1])
                    self.tally.signatures.append(signature)
                    self.tally.steps.append(step)
                    if self.tally.environment is None:
                        self.tally.environment = environment
        if not self.lowered_level:
            return True
        # Our DEBUG level stands in for the level the logger inherited (from "jax" or the root):
        # the parent's effective level is what the user configured, now, for it.
        parent = logging.getLogger(_COMPILER_LOGGER).parent
        return record.levelno >= (parent.getEffectiveLevel() if parent else logging.WARNING)

    def _report_when_settled(self) -> None:
        with self._settled:
            while (left := self._last_request + self.settle_secs - time.monotonic()) > 0:
                self._settled.wait(left)  # a new request moves the deadline; re-check it on waking
        print_verdict(self, early=True)

    def snapshot(self) -> Tally:
        """A copy of the counts (events may still arrive from other threads)."""
        with self._lock:
            tally = self.tally
            counter = self.step_count
            counted = counter is not None and counter.counted
            step_fn = ", ".join(counter.called) if counter is not None and counted else ""
            return Tally(
                tally.requests,
                tally.hits,
                list(tally.missed),
                list(tally.signatures),
                corrupt=set(tally.corrupt),
                environment=tally.environment,
                # A step function never called through a wrapper: its steps are unknown, not 0.
                steps=list(tally.steps) if counted else [],
                step_fn=step_fn,
                warmed_steps=self.warmed.get(counter.called[0]) if counter is not None and counted else None,
                used=dict(tally.used),
            )


_recorder: Recorder | None = None
_install_lock = threading.Lock()


def initialize() -> None:
    """JAX's plugin hook: install the report when the process asked for it, else do nothing."""
    if os.environ.get(REPORT, "").strip().lower() in _TRUE:
        install()


def install() -> Recorder:
    """Start counting (idempotent) and report once at exit."""
    global _recorder
    with _install_lock:
        if _recorder is not None:
            return _recorder
        import jax.monitoring

        # Loaded now, not at exit: importing it then fails (concurrent.futures registers an
        # exit hook on import, refused once the interpreter shuts down).
        import compilecache.cache.store  # noqa: F401

        recorder = Recorder(settle_secs=_settle_secs())
        jax.monitoring.register_event_listener(recorder.on_event)
        logger = logging.getLogger(_COMPILER_LOGGER)
        if logger.level == logging.NOTSET:
            # JAX logs each miss at DEBUG. A level the user set on this very logger is theirs and
            # stays (misses are then counted, not named); only an inherited one is stood in for.
            logger.setLevel(logging.DEBUG)
            recorder.lowered_level = True
        logger.addFilter(recorder)
        # Which program each compile request is for: read only when it misses (see _missed_signature).
        compilehook.install()
        _count_steps(recorder)
        atexit.register(report_at_exit)
        _recorder = recorder
        return recorder


def _count_steps(recorder: Recorder) -> None:
    """Count calls of the step function the warm-up recorded, if it recorded one (never raises)."""
    try:
        import jax

        cache_dir = getattr(jax.config, "jax_compilation_cache_dir", None)
        manifests = _read_manifests(str(cache_dir))[0] if cache_dir else []
        recorder.warmed = warmed_steps(manifests)
        if recorder.warmed:  # AOT targets only: no step function, no step to tell
            counter = StepCount(recorder.warmed)
            counter.install()
            recorder.step_count = counter
    except Exception as error:  # the counts and reasons stand without the steps
        print(f"compilecache: steps not counted ({type(error).__name__}: {error})", file=sys.stderr, flush=True)


def report_at_exit() -> None:
    """Print the verdict (unless printed already with these counts) and write the termination message."""
    recorder = _recorder
    if recorder is None or recorder.reported:
        return
    recorder.reported = True
    result = print_verdict(recorder, early=False)
    if result is not None:
        write_termination_message(result, os.environ.get(TERMINATION_LOG, DEFAULT_TERMINATION_LOG))


_PRINTING = threading.Lock()


def print_verdict(recorder: Recorder, *, early: bool) -> dict[str, Any] | None:
    """Print the one line to stderr, once per distinct count; the result, or None on an error (never raises)."""
    try:
        tally = recorder.snapshot()
        result = current_verdict(tally)
        with _PRINTING:  # the settle watcher and the exit may both get here
            if recorder.printed != (tally.requests, tally.hits) and not (early and recorder.printed):
                print(result["summary"], file=sys.stderr, flush=True)
                # Only once the whole line is out: whoever reads `printed` (a test's script) may
                # write next, and would otherwise cut into the line on a busy machine.
                recorder.printed = (tally.requests, tally.hits)
        return result
    except Exception as error:  # a report must never turn a clean run into a traceback
        print(f"compilecache: no report ({type(error).__name__}: {error})", file=sys.stderr, flush=True)
        return None


def _settle_secs() -> float:
    try:
        return max(0.0, float(os.environ.get(SETTLE, DEFAULT_SETTLE_SECS)))
    except ValueError:
        return DEFAULT_SETTLE_SECS


def current_verdict(tally: Tally | None = None) -> dict[str, Any]:
    """The verdict so far: this process's counts against the cache's run manifests."""
    if tally is None:
        tally = _recorder.snapshot() if _recorder is not None else Tally()
    import jax

    cache_dir = getattr(jax.config, "jax_compilation_cache_dir", None)
    manifests, unreadable = _read_manifests(str(cache_dir)) if cache_dir and tally.missed else ([], None)
    return verdict(tally, keysettings.current() | (tally.environment or {}), manifests, unreadable)


def verdict(
    tally: Tally, here: Mapping[str, Any], manifests: Sequence[Mapping[str, Any]], unreadable: str | None = None
) -> dict[str, Any]:
    """The JSON result (pure): counts, up to 10 missed programs with a reason, and the one line.

    ``unreadable``: why the cache's manifests could not be read, if they could not. Where the step
    function's calls were counted (``tally.steps``), each missed item carries ``step``: the calls
    that had returned when it missed (0: before the first step returned), and the line says it
    for a program first missed after the first step: ``eval_step (not warmed, first compiled at step 17)``.
    """
    signatures = tally.signatures + [None] * (len(tally.missed) - len(tally.signatures))
    steps = tally.steps + [None] * (len(tally.missed) - len(tally.steps))
    missed = [
        (
            _one_line(display_name(name)),
            ENTRY_CORRUPT
            if index in tally.corrupt
            else _one_line(miss_reason(name, here, manifests, signature, unreadable)),
            step,
        )
        for index, (name, signature, step) in enumerate(zip(tally.missed, signatures, steps, strict=True))
    ]
    first_step: dict[tuple[str, str], int] = {}
    for name, reason, step in missed:
        if step is not None:
            first_step.setdefault((name, reason), step)
    # The line names each function once per reason, with the step its first miss came at.
    reasons = [(name, _at_step(reason, first_step.get((name, reason)))) for name, reason, _ in missed]
    misses = tally.requests - tally.hits
    unnamed = max(0, misses - len(reasons))
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "requests": tally.requests,
        "hits": tally.hits,
        "misses": misses,
        "missed": [
            {"name": cut(name, 200), "reason": cut(reason, 300), **({} if step is None else {"step": step})}
            for name, reason, step in _first(missed)
        ],
        "summary": summary_line(tally.requests, tally.hits, reasons, unnamed),
    }
    result |= lastuse.report_fields(tally.used)  # what it read and hit: its use keeps them (maxAge)
    if tally.step_fn:  # what the steps count, and what the warm-up ran: the status says what to change
        result["step_fn"] = cut(tally.step_fn, 100)
        result["warmed_steps"] = tally.warmed_steps
    return fit(result)


def _at_step(reason: str, step: int | None) -> str:
    """``not warmed, first compiled at step 17``; a miss before the first step returned reads as before."""
    return reason if not step else f"{reason}, first compiled at step {step}"


def miss_reason(
    module: str,
    here: Mapping[str, Any],
    manifests: Sequence[Mapping[str, Any]],
    signature: Mapping[str, Any] | None = None,
    unreadable: str | None = None,
) -> str:
    """Why ``module`` missed: a differing setting, what differs from the program the warm-up compiled
    under that name (``arg 0 (.step): int32[] weak_type=True vs False``), another key, or not warmed.

    ``signature``: what this process lowered (:func:`compilecache.frameworks.jax.keydiff.signature_of_computation`);
    the warm-up's are the manifests' exact-mode ``signatures``. With ``unreadable`` (the manifests
    could not be read) it cannot tell, and says why, instead of blaming the warm-up: e.g. a ``gs://``
    cache read from an image without gcsfs.
    """
    if unreadable is not None:
        return f"reason unknown: the cache's manifests could not be read ({unreadable})"
    prefix = f"{module}-"
    warmed = [m for m in manifests if any(name.startswith(prefix) for name in _entry_names(m))]
    if not warmed:
        return NOT_WARMED
    newest = max(warmed, key=lambda m: str(m.get("finished_at") or m.get("run_id") or ""))
    differing = keysettings.differences(here, keysettings.from_manifest(newest))
    if differing:
        return differing[0]
    recorded = [sig for m in warmed for sig in _recorded_signatures(m, module)]
    if signature and recorded:
        name = display_name(module)
        found = closest_difference(name, recorded, signature)
        if found is not None:  # the summary names the function already: the reason starts at the argument
            return found.removeprefix(f"{name} ").removeprefix(f"{name}: ")
    return KEY_DIFFERS


def _read_manifests(cache_dir: str) -> tuple[list[Mapping[str, Any]], str | None]:
    """The cache's run manifests, and why they could not be read (``None`` when they could)."""
    try:
        from compilecache.cache.manifests import JAX_SCHEMA
        from compilecache.cache.store import open_store

        manifests = open_store(cache_dir).read_manifests()
        documents, problems = manifests.of(JAX_SCHEMA), manifests.problems
    except Exception as exc:  # no gcsfs or etils, no permission, a broken link: the counts stand
        hint = " (gs:// caches need the [gcs] extra: gcsfs and etils)" if isinstance(exc, ImportError) else ""
        return [], f"{type(exc).__name__}: {cut(str(exc), 200)}{hint}"
    if not documents and problems:  # none could be read: no reason can be told
        return [], cut(problems[0], 200)
    return documents, None


def _entry_names(manifest: Mapping[str, Any]) -> Iterable[str]:
    for entry in manifest.get("entries") or []:
        if isinstance(entry, Mapping):
            yield str(entry.get("file", ""))
    for hit in manifest.get("hits") or []:
        if isinstance(hit, Mapping):
            yield str(hit.get("file", ""))
    for target in manifest.get("targets") or []:
        if isinstance(target, Mapping):
            yield from (str(key) for key in target.get("cache_keys") or [])


def _recorded_signatures(manifest: Mapping[str, Any], module: str) -> Iterable[Mapping[str, Any]]:
    """What a warm-up recorded it lowered as ``module``: the exact mode's per-program signatures, and an
    AOT target's own signature when one of its keys is the module's."""
    for target in manifest.get("targets") or []:
        if not isinstance(target, Mapping):
            continue
        if isinstance(target.get("signatures"), Mapping):
            for signature in target["signatures"].get(module) or []:
                if isinstance(signature, Mapping):
                    yield signature
        single = target.get("signature")
        keys = [str(key) for key in target.get("cache_keys") or []]
        if isinstance(single, Mapping) and single and any(entry_module(entry_name(key)) == module for key in keys):
            # Settings were compared first (keysettings); static args are not seen at the compile request.
            yield {**single, "settings": {}, "static": {}}


def _entry_present(cache_key: str) -> bool:
    """Whether the entry for ``cache_key`` is in a local cache dir (never raises).

    JAX logs the miss before it compiles and writes (``compiler.py`` ``compile_or_get_cached``), and
    logs it for a key whose entry exists only when reading it failed (``_cache_read`` warns "Error
    reading persistent compilation cache entry", then the lookup counts as a miss): one ``stat`` on a
    miss tells a corrupt entry from an absent one. A ``gs://`` cache is not asked (a remote call on
    the training thread); its corrupt entries read as another key.
    """
    try:
        import jax

        cache_dir = str(getattr(jax.config, "jax_compilation_cache_dir", None) or "")
        if not cache_dir or "://" in cache_dir:
            return False
        return os.path.isfile(os.path.join(cache_dir, entry_name(cache_key)))
    except Exception:  # the count and the name stand without the cause
        return False


def _missed_signature() -> dict[str, Any] | None:
    """The signature of the program this thread's cache request missed, or None (never raises)."""
    computation = compilehook.current()
    if computation is None:
        return None
    try:
        return signature_of_computation(computation)[1]
    except Exception:  # private JAX fields may move: the miss is still counted and named
        return None


def _environment() -> dict[str, Any] | None:
    """This process's environment key settings now, inside a missed compile, or None (never raises)."""
    try:
        return keysettings.from_environment()
    except Exception:  # a report never breaks a compile: the settings are then read at exit
        return None


def _first(missed: Sequence[tuple[str, str, int | None]]) -> list[tuple[str, str, int | None]]:
    # The informative reasons first, each (name, reason) once with its first step, at most MAX_MISSED.
    unique: dict[tuple[str, str], int | None] = {}
    for name, reason, step in missed:
        unique.setdefault((name, reason), step)
    items = [(name, reason, step) for (name, reason), step in unique.items()]
    return sorted(items, key=lambda item: item[1] == NOT_WARMED)[:MAX_MISSED]


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "?"
