"""The ``compilecache`` command: one sub-command per module that owns it.

Each sub-command module exposes ``add_arguments(parser)`` and ``run(args) -> int``; a run imports
only the module of the command it runs, because ``warm``, ``expire`` and ``env`` also run from the
injected runtime on a training image's Python, where the operator's dependencies are absent.
A module that sets ``PASSES_UNKNOWN_ARGS = True`` gets the arguments it does not
declare in ``args.passthrough`` (``compilecache operator`` hands them to ``kopf run``).
No module may import JAX or kopf at its top: every one is imported to build the parser.
How a command fails (one-line errors, exit codes, Ctrl-C) lives in :mod:`compilecache.cli.errors`.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compilecache.cli.errors import EXIT_CODES_HELP, OneLineParser, guarded, warn_unread_env


@dataclass(frozen=True)
class Command:
    """One sub-command: the module that owns it, its one-line help and an example."""

    module: str
    help: str
    example: str


# Groups in the order of the top-level help, as kubectl groups its commands.
GROUPS: dict[str, dict[str, Command]] = {
    "Try it on this machine": {
        "demo": Command(
            "compilecache.local.demo",
            "the whole loop on a local cluster: operator, warm-up and expiry Jobs, a training pod",
            "compilecache demo",
        ),
    },
    "Run the operator": {
        "operator": Command(
            "compilecache.controller.runner",
            "run the operator (a thin wrapper over `kopf run`)",
            "compilecache operator --standalone -A",
        ),
    },
    "In warm-up and expiry Jobs": {
        "warm": Command(
            "compilecache.jobtools.warm",
            "compile workloads into a cache directory (runs in warm-up Jobs)",
            "compilecache warm --cache-dir /var/cache/compilecache --script train.py --steps 2",
        ),
        "expire": Command(
            "compilecache.jobtools.expirecmd",
            "apply the lifecycle policy: expire old, oversized and corrupt entries",
            "compilecache expire --cache-dir /var/cache/compilecache --max-age 7d --dry-run",
        ),
    },
    "On the training side": {
        "env": Command(
            "compilecache.training.envcmd",
            "print the cache environment a training process needs (JAX; PyTorch with --framework pytorch)",
            'eval "$(compilecache env --cache-dir /var/cache/compilecache)"',
        ),
    },
}
COMMANDS: dict[str, Command] = {name: command for group in GROUPS.values() for name, command in group.items()}
SUMMARY = "Keep JAX compilation caches warm for GPU training on Kubernetes."


def version_line() -> str:
    """``compilecache 0.1.0 (python 3.11.9, jax 0.8.1, jaxlib 0.8.1)``, read from the installed metadata.

    importlib.metadata, not ``import jax``: the version must print in a second, also where JAX
    is missing (the operator image) or would start a backend.
    """
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    parts = [f"python {platform.python_version()}"]
    parts += [f"{name} {found}" for name in ("jax", "jaxlib") if (found := installed(name))]
    return f"compilecache {installed('compilecache-operator') or 'unknown'} ({', '.join(parts)})"


def grouped_help() -> str:
    """The command list of the top-level help: one line per command and an example each."""
    width = max(len(name) for name in COMMANDS) + 2
    lines = [SUMMARY, ""]
    for title, commands in GROUPS.items():
        lines.append(f"{title}:")
        for name, command in commands.items():
            lines.append(f"  {name.ljust(width)}{command.help}")
            lines.append(f"  {''.ljust(width)}e.g. {command.example}")
        lines.append("")
    lines.append("Run `compilecache COMMAND --help` for a command's flags.")
    return "\n".join(lines)


def build_parser(loaded: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser with the own arguments of the sub-commands in ``loaded`` (all by default).

    A sub-command left out is still listed but gets no arguments: its module is never imported.
    """
    chosen = set(COMMANDS if loaded is None else loaded)
    parser = OneLineParser(
        prog="compilecache",
        usage="compilecache [-h] [--version] COMMAND [FLAGS]",
        description=grouped_help(),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line())
    # The grouped description lists the commands: argparse's own list would repeat them.
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, help=argparse.SUPPRESS, prog="compilecache"
    )
    for name, command in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=command.help, description=command.help)
        if name not in chosen:
            continue
        module = importlib.import_module(command.module)
        module.add_arguments(subparser)
        subparser.set_defaults(_module=module, _parser=subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``compilecache`` console script."""
    given = sys.argv[1:] if argv is None else list(argv)
    # The command is the first word that is no option (the top level has no option taking a value).
    named = next((word for word in given if not word.startswith("-")), None)
    parser = build_parser([named] if named in COMMANDS else [])
    args, unknown = parser.parse_known_args(given)
    if unknown and not getattr(args._module, "PASSES_UNKNOWN_ARGS", False):
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.passthrough = unknown
    prog = f"compilecache {args.command}"
    warn_unread_env(prog)
    code: int = guarded(prog, lambda: args._module.run(args))
    return code
