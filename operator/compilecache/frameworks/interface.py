"""What a framework implements: the one seam between a compilation cache's framework and the rest.

A framework (JAX's persistent cache, PyTorch's ``torch.compile`` caches, ...) is one
:class:`Framework`, built in its own folder (``compilecache/frameworks/<name>/``) and found by
name through :mod:`compilecache.frameworks`. Each field is one thing the rest of the package
asks of it, grouped by the program that asks:

- the operator pod (``controller/``): what a ``CompileCache`` spec means for this framework —
  the warm-up container's command and environment, a trainer's environment and mounts, which
  of a pod's variables change the cache keys, which spec options it would ignore;
- the warm-up and expiry pods (``jobtools/``): warm a cache, plan and apply its expiry;
- training processes (``training/``): ``compilecache env``'s environment (the framework's own
  runtime hook, loaded by the framework itself at import, reports the verdict);
- the local cluster (``local/``): the demo's framework part.

The fields the operator calls are plain functions of a spec that import nothing of the
framework's libraries (the operator pod has none); the others load their modules when called.
Nothing here imports a framework: the interface is shared, its implementations are not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compilecache.cache.expiry import Policy
    from compilecache.cache.store import CacheStore
    from compilecache.controller.api import CacheSpec, Workload

# How a spec and every warmer spell "run whole epochs within a budget" (workloads[].steps, --steps).
STEPS_AUTO = "auto"
# A problem with a spec: the field's path and what is wrong (the operator raises it as a SpecError).
Problem = tuple[str, str]


@dataclass(frozen=True)
class Framework:
    """One framework's implementation of everything the package asks of a framework."""

    name: str  # spec.framework, and every command's --framework
    title: str  # how messages name it ("JAX", "PyTorch")

    # --- the operator pod: pure functions of a parsed spec, no framework library ---
    # The warm-up container's command for a pool's workloads on ``hosts`` hosts; ``outputs`` are the
    # Job's report and termination-log flags, which every framework's warmer takes.
    warm_command: Callable[[CacheSpec, Sequence[Workload], int, Sequence[str]], list[str]]
    # The cache environment of a warm-up container (the same key as the trainers').
    warmup_env: Callable[[CacheSpec], dict[str, str]]
    # What a training process reads the cache with (before the report switch).
    trainer_env: Callable[[CacheSpec], dict[str, str]]
    # Whether a trainer may keep ``consumers.readOnly: false`` (write entries into the published cache).
    trainers_write: bool
    # A trainer's writable local copy of the cache (an emptyDir the webhook adds), if the framework needs one.
    local_copy_dir: str | None
    # The names of a container's variables that change this framework's keys, given every env in play
    # (a framework may key on a whole prefix), and what the warning about a differing one adds.
    key_variables: Callable[[Sequence[Mapping[str, str]]], Sequence[str]]
    key_hint: str
    # What of an image enters the keys (the warning when training runs another image says it).
    image_key_parts: str
    # Options of the raw ``spec.warmup`` that this framework's warmer would ignore: each refused, named.
    spec_problems: Callable[[Mapping[str, Any]], list[Problem]]
    # The flags ``compilecache expire`` needs for this framework's entries (before ``--cache-dir``).
    expire_flags: tuple[str, ...]

    # --- the warm-up and expiry pods ---
    # ``compilecache warm --framework NAME``: the whole run; the report, or WarmError. The command has
    # turned the trainer's report off in this process's environment (a warm-up is no trainer).
    warm: Callable[[argparse.Namespace], dict[str, Any]]
    # ``compilecache expire --framework NAME``: plan the lifecycle over the store, apply it unless a
    # dry run; the result document (compilecache.jobtools.expirecmd.result_document).
    expire: Callable[[CacheStore, Policy, bool, float], dict[str, Any]]

    # --- training processes ---
    # ``compilecache env --framework NAME --cache-dir DIR``: a trainer's whole environment; a flag
    # this framework does not take raises ValueError with the one-line reason.
    env: Callable[[argparse.Namespace], dict[str, str]]

    # --- the local cluster (optional: a framework without them says so in one line) ---
    # ``compilecache demo --framework NAME``: the loop on a local cluster under ``root``; its exit code.
    demo: Callable[[argparse.Namespace, Path, Path], int] | None = None
    # ``compilecache demo --warmer-only``: the loop with no cluster (cold, warm, hit), where the framework has one.
    warmer_only_demo: Callable[[argparse.Namespace], int] | None = None
