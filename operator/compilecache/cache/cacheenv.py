"""The one source of truth for the JAX cache settings.

Warm-up Jobs, training pods (by the webhook or by hand) and
:func:`compilecache.runtime.enable` all take their settings from here: a single
differing option changes JAX's cache key, and every training step then misses.
"""

from __future__ import annotations

from collections.abc import Mapping

# JAX hashes the XLA autotune sub-directory path into the cache key unless the
# XLA caches are off; with them off, a key does not depend on where the cache
# lives, so an entry compiled in a staging dir hits once published.
XLA_CACHES_OFF = "none"


def jax_cache_env(
    cache_dir: str,
    *,
    min_compile_time_secs: float = 0.0,
    min_entry_size_bytes: int = 0,
    xla_flags: str | None = None,
) -> dict[str, str]:
    """Return the environment that points JAX at ``cache_dir`` with our settings.

    ``cache_dir`` is a local path (a mounted PVC) or a ``gs://bucket/prefix``.
    The result contains only JAX's (and XLA's) own variables, so a training
    process needs nothing of ours to hit what the warmer wrote.
    """
    env = {
        "JAX_COMPILATION_CACHE_DIR": cache_dir,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": _number(min_compile_time_secs),
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": str(int(min_entry_size_bytes)),
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": XLA_CACHES_OFF,
    }
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    return env


def format_env(env: Mapping[str, str]) -> str:
    """Render an environment as ``KEY=VALUE`` lines, sorted, for shells and humans."""
    return "".join(f"{key}={value}\n" for key, value in sorted(env.items()))


def _number(value: float) -> str:
    # "0" and "1.5", not "0.0": the value is read back by JAX's float parser either way,
    # but identical strings keep manifests, pod specs and spec hashes stable.
    return str(int(value)) if float(value).is_integer() else repr(float(value))
