"""Removing a ``jax.monitoring`` listener on every JAX a training image may carry.

The warm-up runs on the training image's own JAX (the injected runtime, ``images/runtime``), so on
Python 3.10 on JAX 0.6, the newest that supports it (JAX 0.7 needs 3.11: its wheels' metadata).
``jax.monitoring.unregister_event_listener`` came after that; JAX 0.6.2 has the same removal as
``jax._src.monitoring._unregister_event_listener_by_callback`` (read in its source).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def unregister_event_listener(listener: Callable[..., Any]) -> None:
    """Remove an event listener that ``jax.monitoring.register_event_listener`` added."""
    import jax.monitoring

    public = getattr(jax.monitoring, "unregister_event_listener", None)
    if public is not None:
        public(listener)
        return
    from jax._src import monitoring

    getattr(monitoring, "_unregister_event_listener_by_callback")(listener)  # noqa: B009 (absent from the lock's stubs)
