"""Coalesce triggers per key: at most one pass runs per key, and one more after the latest trigger.

A burst of events for one cache (eight Jobs created, each announced) must cost one
or two reconciliations, not eight queued ones, and must never park worker threads
on a lock while other caches wait for a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable


class Coalescer:
    """Runs ``fn(key)`` for triggers, never concurrently for one key, and never skipping the last trigger."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._running: set[Hashable] = set()
        self._dirty: set[Hashable] = set()

    def trigger(self, key: Hashable, fn: Callable[[Hashable], None]) -> bool:
        """Run ``fn(key)`` now, or, if a pass for ``key`` is running, make it run once more.

        Returns whether this call ran the pass(es). An exception from ``fn`` propagates to the
        caller that ran it; a trigger that arrived meanwhile still gets its pass.
        """
        with self._guard:
            if key in self._running:
                self._dirty.add(key)
                return False
            self._running.add(key)
        try:
            while True:
                with self._guard:
                    self._dirty.discard(key)
                fn(key)
                with self._guard:
                    if key not in self._dirty:
                        self._running.discard(key)
                        return True
        except BaseException:
            with self._guard:
                self._running.discard(key)
                rerun = key in self._dirty
                self._dirty.discard(key)
            if rerun:  # a trigger arrived during the failed pass: it is owed a pass of its own
                self.trigger(key, fn)
            raise


class Backoff:
    """Growing, bounded delays per key for retrying failed passes: ``first``, then ×``factor``, at most ``limit``.

    kopf does not retry event handlers, and a fixed resync period either hammers a broken
    API or leaves a transient failure standing for a whole period. The delay grows once per
    retry: passes that other triggers run (and fail) while a retry waits do not grow it.
    """

    def __init__(self, first: float = 1.0, factor: float = 2.0, limit: float = 300.0) -> None:
        self.first, self.factor, self.limit = first, factor, limit
        self._guard = threading.Lock()
        self._failures: dict[Hashable, int] = {}
        self._pending: set[Hashable] = set()

    def failed(self, key: Hashable) -> float | None:
        """Count a failure of ``key``; return how long to wait before its retry (``None``: one is pending)."""
        with self._guard:
            if key in self._pending:
                return None
            self._pending.add(key)
            count = self._failures.get(key, 0)
            self._failures[key] = count + 1
        return float(min(self.limit, self.first * self.factor ** min(count, 64)))

    def due(self, key: Hashable) -> None:
        """The retry of ``key`` starts: its next failure arms the next retry."""
        with self._guard:
            self._pending.discard(key)

    def pending(self, key: Hashable) -> bool:
        """Whether a retry of ``key`` waits."""
        with self._guard:
            return key in self._pending

    def succeeded(self, key: Hashable) -> None:
        """Forget the failures of ``key``: its next failure waits ``first`` again."""
        with self._guard:
            self._failures.pop(key, None)
            self._pending.discard(key)

    def failures(self, key: Hashable) -> int:
        """How many retries of ``key`` were armed since its last success."""
        with self._guard:
            return self._failures.get(key, 0)
