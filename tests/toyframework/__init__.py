"""A toy framework, for the tests only: the smallest :class:`~compilecache.frameworks.interface.Framework`.

It proves the seam: a third framework is this one folder plus an entry point
(``toy = "toyframework:FRAMEWORK"`` in the ``compilecache.frameworks`` group), with no edit
anywhere in the package (``tests/test_framework_seam.py`` registers it as an installed
distribution would and runs it through warm, expire, env and a trainer's verdict).

A toy "program" is a name; compiling it writes one file, ``<name>-<key>.toy``, into
``$TOY_CACHE_DIR``, where the key hashes the name and ``TOY_FORMAT`` (the one setting both sides
must share, as JAX's key hashes its flags). A toy training script (:mod:`.train`) asks
:mod:`.runtime` for one program per step. The published cache keeps the files under ``toy/``
and one manifest per warm-up under ``toy/manifests/`` (:mod:`.cache`).

This module is the operator's half (pure functions of a parsed spec, light: the operator pod
loads it) and the thin wrappers that load the rest when called, as the built-in frameworks do.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compilecache.frameworks.interface import STEPS_AUTO, Framework, Problem

if TYPE_CHECKING:
    from compilecache.cache.expiry import Policy
    from compilecache.cache.store import CacheStore
    from compilecache.controller.api import CacheSpec, Workload

NAME = "toy"
CACHE_DIR = "TOY_CACHE_DIR"  # where the toy runtime looks programs up (and writes them, unless read-only)
FORMAT = "TOY_FORMAT"  # hashed into every key: a trainer with another value misses everything
FORMAT_VERSION = "1"
READ_ONLY = "TOY_READ_ONLY"  # "1": the runtime never writes (trainers: the published cache is read-only)
ENTRIES_DIR = "toy"  # the published programs, below the cache's root
# What a toy warmer does not read: refused, each named, instead of ignored.
NOT_TOY_WORKLOAD_KEYS = ("entrypoint", "stepFn", "resume", "resumeArgs")


def cache_env(cache_dir: str, *, read_only: bool) -> dict[str, str]:
    """The toy's cache settings: one source for warmers and trainers, so that their keys agree."""
    env = {CACHE_DIR: cache_dir, FORMAT: FORMAT_VERSION}
    return {**env, READ_ONLY: "1"} if read_only else env


def warm_command(spec: CacheSpec, workloads: Sequence[Workload], hosts: int, outputs: Sequence[str]) -> list[str]:
    """``compilecache warm --framework toy``: one script, stopped after its N-th step (none: run to its end)."""
    [workload] = workloads  # scripts each get their own container (jobs.warmup_job)
    command = ["compilecache", "warm", "--framework", NAME, "--cache-dir", spec.cache_dir]
    command += ["--verify" if spec.warmup.verify else "--no-verify", *outputs, f"--script={workload.script}"]
    if workload.steps is not None and workload.steps != STEPS_AUTO:
        command += ["--steps", str(workload.steps)]
    return [*command, "--", *workload.args]


def warmup_env(spec: CacheSpec) -> dict[str, str]:
    """The key setting only: the warmer points ``TOY_CACHE_DIR`` at its own staging folder."""
    return {key: value for key, value in cache_env(spec.cache_dir, read_only=False).items() if key != CACHE_DIR}


def trainer_env(spec: CacheSpec) -> dict[str, str]:
    """The published programs, read-only."""
    return published_env(spec.cache_dir)


def published_env(cache_dir: str) -> dict[str, str]:
    """A trainer's settings for the cache at ``cache_dir``: its programs' folder, read-only."""
    return cache_env(f"{cache_dir.rstrip('/')}/{ENTRIES_DIR}", read_only=True)


def key_variables(envs: Sequence[Mapping[str, str]]) -> list[str]:
    return [FORMAT]


def spec_problems(warmup: Mapping[str, Any]) -> list[Problem]:
    """What only JAX's warmer reads, set to other than its default (the API server writes the defaults)."""
    problems: list[Problem] = [
        (f"spec.warmup.workloads[{index}].{key}", "is not a toy setting; spec.framework is toy")
        for index, workload in enumerate(warmup["workloads"])
        for key in NOT_TOY_WORKLOAD_KEYS
        if key in workload
    ]
    problems += [
        (f"spec.warmup.jax.{key}", "is a JAX setting; spec.framework is toy")
        for key, value in (warmup.get("jax") or {}).items()
        if value
    ]
    problems += [
        (f"spec.warmup.topologies[{index}].hosts", "must be 1 with spec.framework toy")
        for index, topology in enumerate(warmup.get("topologies") or [])
        if topology["hosts"] != 1
    ]
    return problems


def _warm(args: argparse.Namespace) -> dict[str, Any]:
    from toyframework.cache import warm

    return warm(args)


def _expire(store: CacheStore, policy: Policy, dry_run: bool, now: float) -> dict[str, Any]:
    from toyframework.cache import expire

    return expire(store, policy, dry_run=dry_run, now=now)


def _env(args: argparse.Namespace) -> dict[str, str]:
    """``compilecache env --framework toy``: the trainer's settings and the report switch; JAX's flags refused."""
    from compilecache.cache.cacheenv import reporting

    for flag, value in (
        ("--xla-flags", args.xla_flags),
        ("--min-compile-time-secs", args.min_compile_time_secs),
        ("--min-entry-size-bytes", args.min_entry_size_bytes),
        ("--local-dir", args.local_dir),
    ):
        if value:
            raise ValueError(f"{flag} is no toy setting (--framework toy)")
    return reporting(published_env(args.cache_dir))


FRAMEWORK = Framework(
    name=NAME,
    title="Toy",
    warm_command=warm_command,
    warmup_env=warmup_env,
    trainer_env=trainer_env,
    trainers_write=False,  # a toy trainer only reads (READ_ONLY)
    local_copy_dir=None,
    key_variables=key_variables,
    key_hint="the toy's keys differ and every program misses (set it in a workload's env)",
    image_key_parts="nothing of the image",
    spec_problems=spec_problems,
    expire_flags=("--framework", NAME),
    warm=_warm,
    expire=_expire,
    env=_env,
)
