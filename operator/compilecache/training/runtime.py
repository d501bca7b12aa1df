"""``compilecache.training.runtime.enable()``: JAX's training runtime at the path users import it from.

The documented call for a JAX training process that prefers a call to environment variables
(docs/training.md). It is JAX's own (:mod:`compilecache.frameworks.jax.runtime`), re-exported
here so that code written against this path keeps working; tests/test_layout.py lists it as a
public face of the JAX framework, the one kind of module outside a framework's folder that
imports it.
"""

from __future__ import annotations

from compilecache.frameworks.jax.runtime import apply_env, config_updates, enable

__all__ = ["apply_env", "config_updates", "enable"]
