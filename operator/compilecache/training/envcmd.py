"""``compilecache env``: print the cache environment a training process needs (the framework's).

``compilecache env --cache-dir DIR`` prints the environment of a training process: the
framework's ``env`` (:mod:`compilecache.frameworks`; for JAX
:func:`compilecache.frameworks.jax.env.jax_cache_env`, the function the operator's Job and pod
manifests use, so the cache key is the warmer's) plus the trainer's report switch, as shell
``export`` lines safe for ``eval "$(compilecache env ...)"`` (or ``--format dotenv|json|yaml``).
``--framework pytorch`` prints PyTorch's instead: the published cache as
``COMPILECACHE_TORCH_SOURCE``, the local copy (``--local-dir``) as ``TORCHINDUCTOR_CACHE_DIR``;
its runtime hook copies it at ``import torch``.
``compilecache env NAME -n NS`` reads a CompileCache from the cluster and prints the volume,
mount and env YAML a pod needs to use it, for clusters without the admission webhook.
"""

from __future__ import annotations

import argparse
import sys

from compilecache import frameworks
from compilecache.cache.cacheenv import FORMATS, format_env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``compilecache env``."""
    parser.add_argument(
        "name", nargs="?", help="a CompileCache: print the volume, mount and env YAML of a pod that uses it"
    )
    parser.add_argument("-n", "--namespace", help="namespace of NAME (with NAME)")
    parser.add_argument("--cache-dir", help="cache location as training mounts it (local path or gs://)")
    parser.add_argument(
        "--framework",
        choices=frameworks.names(),
        default=frameworks.DEFAULT,
        help="jax (default); pytorch: torch.compile's cache, read from --cache-dir through a local copy",
    )
    parser.add_argument(
        "--local-dir",
        default=None,
        help="for a framework that works in a writable local copy of the cache: that folder "
        f"(default: where training pods keep it: {_local_copies()})",
    )
    parser.add_argument("--min-compile-time-secs", type=float, default=0.0, help="default 0: cache everything")
    parser.add_argument("--min-entry-size-bytes", type=int, default=0, help="default 0")
    parser.add_argument(
        "--xla-flags",
        default=None,
        help="XLA_FLAGS, identical in warmers and trainers; write it with '=' since the value starts "
        "with '--': --xla-flags='--xla_a=1 --xla_b=2'",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="the trainer must not add entries (a read-only mount): JAX tries no writes, the key is unchanged",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="shell",
        help='shell (default): export lines for eval "$(compilecache env ...)"; dotenv: KEY=value lines; '
        "json; yaml: a container's env list",
    )


def _local_copies() -> str:
    """``pytorch /var/tmp/compilecache-torch``: each built-in framework's local copy, as the webhook mounts it."""
    found = [(name, frameworks.get(name).local_copy_dir) for name in frameworks.BUILT_IN]
    return ", ".join(f"{name} {folder}" for name, folder in found if folder)


def run(args: argparse.Namespace) -> int:
    """Print the environment, or a one-line error."""
    if args.name is not None:
        from compilecache.controller.admission import print_snippet  # reads the cluster only for NAME

        return print_snippet(args.name, args.namespace)
    if not args.cache_dir:
        print("compilecache env: error: --cache-dir is required", file=sys.stderr)
        return 2
    if args.min_compile_time_secs < 0 or args.min_entry_size_bytes < 0:
        print("compilecache env: error: minimums must be >= 0", file=sys.stderr)
        return 2
    try:
        env = frameworks.get(args.framework).env(args)
    except ValueError as error:
        print(f"compilecache env: error: {error}", file=sys.stderr)
        return 2
    return _print(env, args.format)


def _print(env: dict[str, str], fmt: str) -> int:
    try:
        text = format_env(env, fmt)
    except ValueError as exc:
        print(f"compilecache env: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
