"""PyTorch (``spec.framework: pytorch``): ``torch.compile``'s Inductor, AOTAutograd and kernel caches.

Its :class:`~compilecache.frameworks.interface.Framework`. The operator's half is :mod:`.spec`
(light: no torch); the rest loads when called: the warm-up (:mod:`.warm`, which runs the
training entrypoint through :mod:`.run`), whole-generation expiry (:mod:`.expire`, planned by
:mod:`.expiry`), the store's generations (:mod:`.store`, :mod:`.cache`), the trainer's hook at
``import torch`` (:mod:`.hook`, through torch's own ``torch.backends`` entry points) and the demo
(:mod:`.demo`). docs/pytorch.md is the user's page.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compilecache.frameworks.interface import Framework
from compilecache.frameworks.pytorch import spec
from compilecache.frameworks.pytorch.env import TORCH_LOCAL_DIR

if TYPE_CHECKING:
    from compilecache.cache.expiry import Policy
    from compilecache.cache.store import CacheStore


def _warm(args: argparse.Namespace) -> dict[str, Any]:
    """``--steps``/``--budget`` come from the environment as for JAX (a CompileCache workload's
    ``env`` reaches the warm-up container)."""
    from compilecache.frameworks.pytorch.warm import warm_torch
    from compilecache.jobtools.warm import script_arguments, steps_from_env

    env = dict(os.environ)
    steps_from_env(args, env)
    return warm_torch(args, script_arguments(args), env)


def _expire(store: CacheStore, policy: Policy, dry_run: bool, now: float) -> dict[str, Any]:
    from compilecache.frameworks.pytorch.expire import expire_torch

    return expire_torch(store, policy, dry_run=dry_run, now=now)


def _env(args: argparse.Namespace) -> dict[str, str]:
    """``--read-only`` changes nothing here: a PyTorch trainer never writes the published cache
    (it works in the local copy), and JAX's minimum compile time is no PyTorch setting."""
    from compilecache.cache.cacheenv import reporting
    from compilecache.frameworks.pytorch.env import torch_cache_env

    local_dir = args.local_dir or TORCH_LOCAL_DIR
    return reporting(torch_cache_env(args.cache_dir, local_dir=local_dir))


def _demo(args: argparse.Namespace, repo: Path, root: Path) -> int:
    from compilecache.frameworks.pytorch.demo import run_loop

    return run_loop(args, repo, root)


FRAMEWORK = Framework(
    name="pytorch",
    title="PyTorch",
    warm_command=spec.warm_command,
    warmup_env=spec.warmup_env,
    trainer_env=spec.trainer_env,
    # Inductor has no read-only mode: it works in the local copy, so a writable mount would only
    # let a trainer damage the entries.
    trainers_write=False,
    local_copy_dir=TORCH_LOCAL_DIR,
    key_variables=spec.key_variables,
    key_hint=spec.KEY_HINT,
    image_key_parts=spec.IMAGE_KEY_PARTS,
    spec_problems=spec.spec_problems,
    expire_flags=("--framework", "pytorch"),
    warm=_warm,
    expire=_expire,
    env=_env,
    demo=_demo,
)
