"""Which program a compile request is for: the lowering JAX is compiling, seen from inside the request.

JAX's cache events (``jax.monitoring``) and its miss log name a program only by its module name and
a hash. To say *what* differs on a miss, the warm-up (exact mode: :mod:`compilecache.frameworks.jax.scriptrun`)
and the trainer (:mod:`compilecache.frameworks.jax.verdict`) need the arguments of the program being compiled. In
jax 0.10 every ``jax.jit`` call that compiles, and every ``lowered.compile()``, goes through
``pxla.MeshComputation.compile``, which calls ``compiler.compile_or_get_cached`` (the persistent
cache lookup: its request, hit and miss events and log lines) in the same thread. :func:`install`
wraps that method once: during the call, :func:`current` is the computation in that thread. That
costs a thread-local store per compile; reading its signature
(:func:`compilecache.frameworks.jax.keydiff.signature_of_computation`) is left to the caller, which the
trainer does only on a miss.

The method is private JAX: where it is missing (another JAX version), :func:`install` says so by
returning False and nothing is wrapped; counting and the other miss reasons work without it.
Imports JAX only inside functions (this module belongs to the cache format the operator imports).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()
_lock = threading.Lock()
_listeners: list[Callable[[Any], None]] = []
_installed = False


def install(after_compile: Callable[[Any], None] | None = None) -> bool:
    """Wrap ``MeshComputation.compile`` (once); ``after_compile(computation)`` runs after each compile.

    Returns whether the hook is in place.
    """
    global _installed
    with _lock:
        if after_compile is not None and after_compile not in _listeners:
            _listeners.append(after_compile)
        if _installed:
            return True
        try:
            from jax._src.interpreters import pxla

            original = pxla.MeshComputation.compile
        except (ImportError, AttributeError):
            return False

        @functools.wraps(original)
        def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
            previous = getattr(_local, "computation", None)
            _local.computation = self
            try:
                executable = original(self, *args, **kwargs)
            finally:
                _local.computation = previous
            for listener in list(_listeners):
                listener(self)
            return executable

        # Only in processes that asked for it (a warm-up's script child, a reporting trainer);
        # the method JAX calls is still its own, so the program and its key are unchanged.
        pxla.MeshComputation.compile = compile  # type: ignore[method-assign]
        _installed = True
        return True


def remove_listener(after_compile: Callable[[Any], None]) -> None:
    """Stop calling ``after_compile`` (the wrapper itself stays: it is a thread-local store)."""
    with _lock:
        if after_compile in _listeners:
            _listeners.remove(after_compile)


def current() -> Any:
    """The computation this thread is compiling now (inside a cache request), or None."""
    return getattr(_local, "computation", None)
