"""The one source of truth for the cache settings of each framework.

Warm-up Jobs, training pods (by the webhook or by hand) and
:func:`compilecache.frameworks.jax.runtime.enable` all take their settings from here: a single
differing option changes JAX's cache key, and every training step then misses.
PyTorch's settings follow the same rule for ``torch.compile``; they live with its
implementation (:mod:`compilecache.frameworks.pytorch.env`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

# JAX hashes the XLA autotune sub-directory path into the cache key unless the
# XLA caches are off; with them off, a key does not depend on where the cache
# lives, so an entry compiled in a staging dir hits once published.
XLA_CACHES_OFF = "none"

CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Ours, not JAX's: a training process with this set reports its hits and misses once, at exit
# (compilecache.frameworks.jax.verdict, loaded through JAX's plugin discovery). Warm-up Jobs never get it: their
# termination message is the warmer's report.
REPORT = "COMPILECACHE_REPORT"
# Where the trainer writes its one JSON result at exit (Kubernetes' default terminationMessagePath).
TERMINATION_LOG = "COMPILECACHE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# A trainer on a read-only cache writes nothing: JAX skips the write of any program that compiled
# in less than this (jax/_src/compiler.py _cache_write, before it even serialises the executable),
# and unlike the directory, the XLA flags or the compile options this threshold is not hashed into
# the key (jax/_src/cache_key.py get()), so the warmed entries still hit. ~31 years.
NEVER_WRITE_SECS = 1_000_000_000
# Variables of ours that JAX does not hash into a cache key: a trainer may differ from the warmer here.
NOT_IN_KEY = frozenset({MIN_COMPILE_TIME, "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", REPORT, TERMINATION_LOG})
FORMATS = ("shell", "dotenv", "json", "yaml")

# A multi-host warm-up's process group, as the operator sets it in each pod and `compilecache warm`
# reads it (and a training script may: examples/train.py). JAX itself reads the coordinator.
GROUP_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
GROUP_PROCESSES = "COMPILECACHE_NUM_PROCESSES"
GROUP_PROCESS_ID = "COMPILECACHE_PROCESS_ID"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # Kubernetes sets it in every pod of an Indexed Job
# One `compilecache warm` in a group uses the coordinator's port and the next three (its own groups).
GROUP_PORTS = 4


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
    """A training process's environment: the warmer's ``env`` (same key), plus the report switch.

    ``read_only`` (a read-only mount, or trainers that must not add entries) raises the minimum
    compile time so that JAX tries no write at all: no "Error writing persistent compilation cache
    entry ... Read-only file system" warning per program that was not warmed. The key is unchanged.
    """
    # Where the report goes: the kubelet's default terminationMessagePath (the webhook sets a pod's own).
    result = {**env, REPORT: "1", TERMINATION_LOG: DEFAULT_TERMINATION_LOG}
    return never_write(result) if read_only else result


def never_write(env: Mapping[str, str]) -> dict[str, str]:
    """JAX's ``env`` with a minimum compile time so high that it tries no write (the key is unchanged)."""
    return {**env, MIN_COMPILE_TIME: _number(NEVER_WRITE_SECS)}


def format_env(env: Mapping[str, str], fmt: str = "shell") -> str:
    """Render an environment, sorted by name, in one of :data:`FORMATS`.

    ``shell``: ``export KEY='value'`` lines, quoted by :func:`shlex.quote`, for ``eval "$(...)"``
    and ``. FILE`` (exported, so the training process the shell starts sees them). ``dotenv``:
    ``KEY=value`` lines, unquoted (docker ``--env-file`` and kubectl ``--from-env-file`` take the
    rest of the line verbatim). ``json``: one object. ``yaml``: a container's ``env:`` list.
    """
    items = sorted(env.items())
    if fmt == "shell":
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in items)
    if fmt == "dotenv":
        if any("\n" in value for _, value in items):
            raise ValueError("a value contains a newline, which a dotenv line cannot carry")
        return "".join(f"{key}={value}\n" for key, value in items)
    if fmt == "json":
        import json

        return json.dumps(dict(items), indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        body = {"env": [{"name": key, "value": value} for key, value in items]}
        return str(yaml.safe_dump(body, sort_keys=False))
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def _number(value: float) -> str:
    # "0" and "1.5", not "0.0": the value is read back by JAX's float parser either way,
    # but identical strings keep manifests, pod specs and spec hashes stable.
    return str(int(value)) if float(value).is_integer() else repr(float(value))
