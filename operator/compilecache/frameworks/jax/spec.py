"""What a ``spec.framework: jax`` cache means in the operator pod: commands, environments, checks.

The operator-side half of JAX's :class:`~compilecache.frameworks.interface.Framework`: pure
functions of a parsed spec, importing no JAX (the operator pod has none). Warm-up Jobs and
training pods get the same cache settings (:func:`cache_env`), so their keys agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compilecache.frameworks.interface import STEPS_AUTO, Problem
from compilecache.frameworks.jax.env import jax_cache_env, never_write

if TYPE_CHECKING:
    from compilecache.controller.api import CacheSpec, Workload

# What a pod may set that changes JAX's cache key or the compiled program, hence every key, beyond
# the cache's own settings: XLA_FLAGS and LIBTPU_INIT_ARGS are hashed (jax/_src/cache_key.py
# _hash_xla_flags); the others change the lowered program or the compile options.
KEY_VARIABLES = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "JAX_USE_SHARDY_PARTITIONER",
    "JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY",
    "JAX_PLATFORMS",
)
KEY_HINT = "JAX's cache keys differ and compiles miss (set it in spec.warmup: jax.xlaFlags or a workload's env)"
IMAGE_KEY_PARTS = "the jax/jaxlib/plugin versions"


def warm_command(spec: CacheSpec, workloads: Sequence[Workload], hosts: int, outputs: Sequence[str]) -> list[str]:
    """``compilecache warm``: the AOT entrypoints of a pool in one container, or one script."""
    command = ["compilecache", "warm", "--cache-dir", spec.cache_dir]
    command += ["--jobs", str(spec.warmup.jobs), "--verify" if spec.warmup.verify else "--no-verify", *outputs]
    for workload in workloads:
        if workload.script is not None:
            # With '=': a script path is a cache author's string, and one starting with '-' must not read as a flag.
            command += [f"--script={workload.script}"]
            steps = steps_flags(workload, hosts)
            command += steps
            if steps:  # the exact mode stops the script: it may also warm a run resumed from its checkpoint
                # Unset: the warmer's own rule (when the first run left something a restart reads).
                command += {None: [], True: ["--resume"], False: ["--no-resume"]}[workload.resume]
                # With '=': an argument such as --restore must not read as a flag of the warmer.
                command += [f"--resume-arg={arg}" for arg in workload.resume_args]
                command += [f"--resume-when={workload.resume_when}"] if workload.resume_when is not None else []
            command += ["--", *workload.args]
        else:
            command += ["--workload", str(workload.entrypoint)]
    return command


def steps_flags(workload: Workload, hosts: int) -> list[str]:
    """How far a script runs: its ``steps``, else whole epochs within a budget (``--steps auto``).

    A multi-host group stops at a count only (its processes cannot agree on a clock), so there a
    script without ``steps`` runs to its end, as before ``auto`` existed.
    """
    steps = workload.steps if workload.steps is not None else (STEPS_AUTO if hosts == 1 else None)
    if steps is None:
        return []
    flags = ["--steps", str(steps)]
    flags += ["--step-fn", workload.step_fn] if workload.step_fn else []
    if steps == STEPS_AUTO and workload.budget_seconds is not None:
        flags += ["--budget", f"{workload.budget_seconds:g}"]
    return flags


def cache_env(spec: CacheSpec) -> dict[str, str]:
    """The JAX cache environment of a cache: identical in its warm-up Jobs and in its training pods.

    The one place that maps a spec to :func:`compilecache.frameworks.jax.env.jax_cache_env`.
    """
    jax = spec.warmup.jax
    return jax_cache_env(
        spec.cache_dir,
        min_compile_time_secs=jax.min_compile_time_secs,
        min_entry_size_bytes=jax.min_entry_size_bytes,
        xla_flags=jax.xla_flags,
    )


def trainer_env(spec: CacheSpec) -> dict[str, str]:
    """A trainer's: the warm-up Jobs' settings (the same key); on a read-only cache
    (``consumers.readOnly``) a minimum compile time that stops JAX trying writes."""
    return never_write(cache_env(spec)) if spec.consumers.read_only else cache_env(spec)


def key_variables(envs: Sequence[Mapping[str, str]]) -> Sequence[str]:
    """:data:`KEY_VARIABLES`, whatever the envs set."""
    return KEY_VARIABLES


def spec_problems(warmup: Mapping[str, Any]) -> list[Problem]:
    """None: every option of ``spec.warmup`` is read by JAX's warmer."""
    return []
