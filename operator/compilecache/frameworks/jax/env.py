"""JAX's cache settings: the one source of truth for its warm-up Jobs and training processes.

Warm-up Jobs (:mod:`.spec`), training pods (by the webhook or by hand: ``compilecache env``) and
:func:`compilecache.frameworks.jax.runtime.enable` all take their settings from here: a single
differing option changes JAX's cache key, and every training step then misses.
"""

from __future__ import annotations

from collections.abc import Mapping

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG, reporting

# JAX hashes the XLA autotune sub-directory path into the cache key unless the
# XLA caches are off; with them off, a key does not depend on where the cache
# lives, so an entry compiled in a staging dir hits once published.
XLA_CACHES_OFF = "none"

CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# A trainer on a read-only cache writes nothing: JAX skips the write of any program that compiled
# in less than this (jax/_src/compiler.py _cache_write, before it even serialises the executable),
# and unlike the directory, the XLA flags or the compile options this threshold is not hashed into
# the key (jax/_src/cache_key.py get()), so the warmed entries still hit. ~31 years.
NEVER_WRITE_SECS = 1_000_000_000
# Variables of ours that JAX does not hash into a cache key: a trainer may differ from the warmer here.
NOT_IN_KEY = frozenset({MIN_COMPILE_TIME, "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", REPORT, TERMINATION_LOG})


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
        CACHE_DIR: cache_dir,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": _number(min_compile_time_secs),
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": str(int(min_entry_size_bytes)),
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": XLA_CACHES_OFF,
    }
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    return env


def trainer_env(env: Mapping[str, str], *, read_only: bool) -> dict[str, str]:
    """A JAX training process's environment: the warmer's ``env`` (same key), plus the report switch.

    ``read_only`` (a read-only mount, or trainers that must not add entries) raises the minimum
    compile time so that JAX tries no write at all: no "Error writing persistent compilation cache
    entry ... Read-only file system" warning per program that was not warmed. The key is unchanged.
    """
    result = reporting(env)
    return never_write(result) if read_only else result


def never_write(env: Mapping[str, str]) -> dict[str, str]:
    """JAX's ``env`` with a minimum compile time so high that it tries no write (the key is unchanged)."""
    return {**env, MIN_COMPILE_TIME: _number(NEVER_WRITE_SECS)}


def _number(value: float) -> str:
    # "0" and "1.5", not "0.0": the value is read back by JAX's float parser either way,
    # but identical strings keep manifests, pod specs and spec hashes stable.
    return str(int(value)) if float(value).is_integer() else repr(float(value))
