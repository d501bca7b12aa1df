"""The ``compilecache`` command: one sub-command per module that owns it.

Each sub-command module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
A module that sets ``PASSES_UNKNOWN_ARGS = True`` gets the arguments it does not
declare in ``args.passthrough`` (``compilecache operator`` hands them to ``kopf run``).
No module may import JAX or kopf at its top: every one is imported to build the parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name → (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("compilecache.controller.runner", "run the operator (a thin wrapper over `kopf run`)"),
    "warm": ("compilecache.jobtools.warm", "compile workloads into a cache directory (runs in warm-up Jobs)"),
    "expire": (
        "compilecache.jobtools.expirecmd",
        "apply the lifecycle policy: expire old, oversized and corrupt entries",
    ),
    "env": ("compilecache.envcmd", "print the JAX cache environment a training process needs"),
    "demo": (
        "compilecache.demo",
        "the whole loop on a local cluster: operator, warm-up and expiry Jobs, a training pod",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command's own arguments."""
    parser = argparse.ArgumentParser(prog="compilecache", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(subparser)
        subparser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``compilecache`` console script."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    if unknown and not getattr(args._module, "PASSES_UNKNOWN_ARGS", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.passthrough = unknown
    code: int = args._module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
