"""Progress lines of a warm-up in the pod log: what compiles now, how long it took, and totals.

A warm-up compiles for minutes on a GPU; without these lines ``kubectl logs`` shows nothing until
the end, and a slow compile looks like a hang. :class:`Progress` prints a line when an item starts
(``[2/5] compiling examples.workloads.transformer:targets train_step``), one when it ends (compile
seconds, entries and bytes written), a heartbeat while one runs (``still compiling ...: 95 s``,
every ``$COMPILECACHE_PROGRESS_SECONDS``, default 30) and totals at the end.

Two users: :func:`compilecache.frameworks.jax.compiler.compile_targets` (AOT targets, one item per
target, also under ``--jobs``) and the exact mode's child (:func:`script_progress`, one item per
compile JAX reports through ``jax.monitoring``: the cache request opens it, the backend-compile
duration closes it with the function's name). Lines go to stdout, flushed: the pod log.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from compilecache.frameworks.jax import listeners

PERIOD_ENV = "COMPILECACHE_PROGRESS_SECONDS"
# Issue: "a heartbeat at least every 30 s": a pod's log then never goes quiet for longer.
DEFAULT_PERIOD = 30.0
# What JAX records around every compile, hit or not (jax/_src/dispatch.py BACKEND_COMPILE_EVENT,
# with fun_name), and at every request to the persistent cache (jax/_src/compiler.py).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
REQUESTS_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
# Lowering ends just before the backend compile starts, with the function's name (dispatch.py).
LOWERED_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def period_from_env(environ: dict[str, str] | None = None) -> float:
    """The heartbeat period in seconds; a value that is not a positive number gives the default."""
    text = (os.environ if environ is None else environ).get(PERIOD_ENV, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_PERIOD
    return value if value > 0 else DEFAULT_PERIOD


@dataclass
class _Open:
    label: str
    place: str  # "[2/5] " or ""
    started: float


class Progress:
    """Start, end and heartbeat lines of the items being compiled; thread-safe.

    ``entry_bytes``: the size of written entries from their cache keys (``None``: not known, e.g.
    on GCS, where it would cost a request).
    """

    def __init__(
        self,
        out: TextIO | None = None,
        period: float | None = None,
        entry_bytes: Callable[[Sequence[str]], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self.period = period_from_env() if period is None else period
        self.entry_bytes = entry_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[object, _Open] = {}
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.items = 0
        self.seconds = 0.0
        self.entries = 0
        self.bytes = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the heartbeat."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)

    def say(self, line: str) -> None:
        """One line, flushed at once (a pod log is read while the warm-up runs)."""
        out = self._out or sys.stdout
        with self._lock:
            out.write(line + "\n")
            out.flush()

    def begin(self, key: object, label: str, index: int | None = None, total: int | None = None) -> None:
        """An item starts: ``[index/total] compiling label``."""
        place = f"[{index}/{total}] " if index is not None and total is not None else ""
        with self._lock:
            self._open[key] = _Open(label, place, self._clock())
            if self._beat is None:
                self._beat = threading.Thread(target=self._heartbeat, name="progress", daemon=True)
                self._beat.start()
        self.say(f"{place}compiling {label}")

    def end(
        self,
        key: object,
        *,
        label: str | None = None,
        outcome: str = "",
        keys_written: Sequence[str] = (),
        seconds: float | None = None,
        counted: bool = True,
    ) -> None:
        """An item ended: seconds, outcome, entries and bytes written; ``counted`` in the totals."""
        with self._lock:
            opened = self._open.pop(key, None)
        took = seconds if seconds is not None else (self._clock() - opened.started if opened else 0.0)
        size = self.entry_bytes(keys_written) if self.entry_bytes and keys_written else None
        with self._lock:
            self.items += counted
            self.seconds += took if counted else 0.0
            self.entries += len(keys_written) if counted else 0
            self.bytes += (size or 0) if counted else 0
        parts = [f"{took:.2f}s"] + ([outcome] if outcome else [])
        parts.append(f"{len(keys_written)} {'entry' if len(keys_written) == 1 else 'entries'} written")
        if size is not None:
            parts[-1] += f" ({size} bytes)"
        place = opened.place if opened else ""
        self.say(f"{place}done {label or (opened.label if opened else 'a compile')}: {', '.join(parts)}")

    def totals(self, noun: str) -> str:
        """``5 targets in 12.34s: 7 entries (123456 bytes) written``."""
        size = f" ({self.bytes} bytes)" if self.entry_bytes else ""
        return f"{self.items} {noun} in {self.seconds:.2f}s: {self.entries} entries{size} written"

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.period):
            now = self._clock()
            with self._lock:
                running = list(self._open.values())
            for item in running:
                self.say(f"{item.place}still compiling {item.label}: {now - item.started:.0f} s")


def local_entry_bytes(cache_dir: str) -> Callable[[Sequence[str]], int | None] | None:
    """Sizes of written entries in a local cache folder; ``None`` for ``gs://`` (a request each)."""
    if "://" in cache_dir:
        return None
    from compilecache.cache.entries import entry_name

    def size(keys: Sequence[str]) -> int | None:
        total = 0
        for key in keys:
            with contextlib.suppress(OSError):  # not there (yet): progress must never fail a warm-up
                total += (Path(cache_dir) / entry_name(key)).stat().st_size
        return total

    return size


@contextmanager
def script_progress(script: str, run: Any, progress: Progress | None = None) -> Iterator[Progress]:
    """Progress of the exact mode's child: one item per compile JAX reports, named by JAX.

    ``run``: the script's :class:`~compilecache.frameworks.jax.compiler.TargetRun` (its hits and written
    keys so far say whether a compile hit and what it wrote). Cheap: two listeners, no logging.
    """
    import jax.monitoring

    progress = progress or Progress(entry_bytes=local_entry_bytes(os.environ.get("JAX_COMPILATION_CACHE_DIR", "")))
    local = threading.local()
    count = [0]

    def on_event(event: str, **_: str | int) -> None:
        if event == REQUESTS_EVENT:
            count[0] += 1
            local.seen = (run.hits, len(run.keys_written))
            progress.begin(threading.get_ident(), f"{getattr(local, 'name', 'a program')} ({script}, #{count[0]})")

    def on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == LOWERED_EVENT:
            local.name = str(kwargs.get("fun_name") or "a program")
        if event != BACKEND_COMPILE_EVENT:
            return
        hits, written = getattr(local, "seen", (run.hits, len(run.keys_written)))
        local.seen = (run.hits, len(run.keys_written))
        # The hit event and the write's log line came inside this compile, in this thread.
        outcome = "hit" if run.hits > hits else "compiled"
        name = str(kwargs.get("fun_name") or "a program")
        progress.end(
            threading.get_ident(),
            label=f"{name} ({script}, #{count[0]})",
            outcome=outcome,
            keys_written=run.keys_written[written:],
            seconds=duration_secs,
        )

    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        yield progress
    finally:
        listeners.unregister_event_listener(on_event)
        # Present in the JAX this image runs (0.10); the child exits next anyway, so an older
        # JAX without it only keeps a listener that prints nothing more.
        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(on_duration)
        progress.close()
        progress.say(f"{script}: {progress.totals('compiles')}")
