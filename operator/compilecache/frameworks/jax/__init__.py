"""JAX (``spec.framework: jax``, the default): JAX's persistent compilation cache.

Its :class:`~compilecache.frameworks.interface.Framework`. The operator's half is :mod:`.spec`
and :mod:`.env` (light: no JAX); the rest loads when called: the warm-up (:mod:`.warm`, with its
AOT compiles in :mod:`.compiler`, script runs in :mod:`.scriptrun`, multi-host groups in
:mod:`.multihost` and :mod:`.verify`), entry expiry (:mod:`.expire`) and the demo (:mod:`.demo`).
The trainer's verdict is JAX's own plugin hook (``jax_plugins`` entry point: :mod:`.verdict`).
What is still JAX's outside this folder is the cache format both frameworks share (entry names,
the store's listing, the expiry plan of entries: ``cache/``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compilecache.frameworks.interface import Framework
from compilecache.frameworks.jax import spec

if TYPE_CHECKING:
    from compilecache.cache.expiry import Policy
    from compilecache.cache.store import CacheStore


def _warm(args: argparse.Namespace) -> dict[str, Any]:
    from compilecache.frameworks.jax.warm import warm

    return warm(args)


def _expire(store: CacheStore, policy: Policy, dry_run: bool, now: float) -> dict[str, Any]:
    from compilecache.frameworks.jax.expire import expire

    return expire(store, policy, dry_run=dry_run, now=now)


def _env(args: argparse.Namespace) -> dict[str, str]:
    """JAX's cache options from the flags (the same key as the warm-up's), and the report switch."""
    from compilecache.frameworks.jax.env import jax_cache_env, trainer_env

    if args.local_dir:
        raise ValueError("--local-dir is for --framework pytorch")
    env = jax_cache_env(
        args.cache_dir,
        min_compile_time_secs=args.min_compile_time_secs,
        min_entry_size_bytes=args.min_entry_size_bytes,
        xla_flags=args.xla_flags,
    )
    return trainer_env(env, read_only=args.read_only)


def _demo(args: argparse.Namespace, repo: Path, root: Path) -> int:
    from compilecache.frameworks.jax.demo import run_loop

    return run_loop(args, repo, root)


def _warmer_only_demo(args: argparse.Namespace) -> int:
    from compilecache.frameworks.jax.demo import run_warmer_only

    return run_warmer_only(args)


FRAMEWORK = Framework(
    name="jax",
    title="JAX",
    warm_command=spec.warm_command,
    warmup_env=spec.cache_env,
    trainer_env=spec.trainer_env,
    trainers_write=True,  # unless consumers.readOnly: JAX adds what training compiled that no warm-up did
    local_copy_dir=None,  # JAX reads the mount (or gs://) itself
    key_variables=spec.key_variables,
    key_hint=spec.KEY_HINT,
    image_key_parts=spec.IMAGE_KEY_PARTS,
    spec_problems=spec.spec_problems,
    expire_flags=(),  # the command older warmer images take
    warm=_warm,
    expire=_expire,
    env=_env,
    demo=_demo,
    warmer_only_demo=_warmer_only_demo,
)
