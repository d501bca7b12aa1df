"""What a training process calls if it prefers a call to environment variables.

``compilecache.frameworks.jax.runtime.enable()`` applies exactly the settings of
:func:`compilecache.frameworks.jax.env.trainer_env` through ``jax.config``, so a process
configured either way computes the same cache keys as the warmer, and installs the trainer's
report (:mod:`compilecache.frameworks.jax.verdict`: one line of hits and misses at exit).
"""

from __future__ import annotations

import os

from compilecache.cache.cacheenv import REPORT, TERMINATION_LOG

# XLA_FLAGS is read once, when the backend starts; it cannot go through jax.config. The report
from compilecache.frameworks.jax.env import jax_cache_env, trainer_env

# switches are ours.
_NOT_A_JAX_OPTION = frozenset({"XLA_FLAGS", REPORT, TERMINATION_LOG})


def config_updates(env: dict[str, str]) -> dict[str, str]:
    """Map our ``JAX_*`` environment variables to ``jax.config`` option names.

    JAX reads each option ``jax_foo`` from the variable ``JAX_FOO`` (see
    ``jax/_src/config.py``), so the mapping is the lower-cased name.
    """
    return {key.lower(): value for key, value in env.items() if key not in _NOT_A_JAX_OPTION}


def apply_env(env: dict[str, str]) -> None:
    """Set every ``JAX_*`` option in ``env`` through ``jax.config`` (types as JAX parses them)."""
    import jax

    for name, text in config_updates(env).items():
        current = getattr(jax.config, name)
        value: object = text
        if isinstance(current, bool):
            value = text.lower() in ("1", "true", "yes", "on")
        elif isinstance(current, int):
            value = int(text)
        elif isinstance(current, float):
            value = float(text)
        jax.config.update(name, value)


def enable(
    cache_dir: str | None = None,
    *,
    min_compile_time_secs: float = 0.0,
    min_entry_size_bytes: int = 0,
    read_only: bool = False,
    report: bool = True,
) -> dict[str, str]:
    """Point JAX's persistent cache at ``cache_dir`` with the warmer's settings.

    ``cache_dir`` None takes ``JAX_COMPILATION_CACHE_DIR`` from the environment.
    Call before the first compile. Returns the settings applied. ``XLA_FLAGS``
    must be in the environment before JAX starts (it is part of the cache key).
    ``read_only``: JAX tries no writes (same key). ``report``: print one line of
    hits and misses at exit (as ``COMPILECACHE_REPORT=1`` does without a call).
    """
    directory = cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not directory:
        raise ValueError("no cache dir: pass cache_dir or set JAX_COMPILATION_CACHE_DIR")
    env = jax_cache_env(
        directory, min_compile_time_secs=min_compile_time_secs, min_entry_size_bytes=min_entry_size_bytes
    )
    env = trainer_env(env, read_only=read_only)
    # COMPILECACHE_REPORT=0 in the environment wins over the call: a warm-up that runs the
    # training entrypoint itself must not report as a trainer.
    report = report and os.environ.get(REPORT, "").strip() != "0"
    if not report:
        del env[REPORT]
    apply_env(env)
    if report:
        from compilecache.frameworks.jax import verdict

        verdict.install()
    return env
