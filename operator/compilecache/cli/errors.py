"""How the ``compilecache`` command fails: exit codes, one-line errors, Ctrl-C, unread variables.

kubectl and helm are the model: a user error is one line naming what is wrong and how to go on,
never a traceback; Ctrl-C ends the command with one line and exit 130 (128 + SIGINT, as shells
report it). :mod:`compilecache.cli` wraps every sub-command in :func:`guarded`; the sub-commands
raise :class:`~compilecache.cache.errors.WarmError` (exit 2) or :class:`UsageError` for bad input.
Nothing here imports JAX or kopf.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NoReturn

from compilecache.cache.errors import WarmError
from compilecache.frameworks import UnknownFramework

EXIT_OK = 0
EXIT_FAILED = 1  # the work failed (or a bug: then with a traceback)
EXIT_USAGE = 2  # bad flags, bad paths, bad input or environment: one line
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)

# Shown at the end of `compilecache --help` and in README.md ("Exit codes").
EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 failed; 2 usage error or bad input (a bad flag or path, an unknown module or "
    "function, no kubeconfig, a full disk); warm only: 3 verify found a miss, 4 an unsound entry "
    "(nothing published); 130 interrupted (Ctrl-C)."
)

PREFIX = "COMPILECACHE_"
_NAME = re.compile(rf"\b{PREFIX}[A-Z0-9_]*[A-Z0-9]\b")


class UsageError(Exception):
    """Bad input found before any work: one line (what is wrong; what to do), exit 2."""

    exit_code = EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """argparse with kubectl's kind of usage error: one line with a hint, exit 2.

    argparse's own prints the whole usage block first; the hint points at ``--help`` instead.
    Sub-parsers inherit the class (``add_subparsers`` uses the parent's type).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def whole_number(text: str) -> int:
    """An argparse ``type``: ``argument --jobs: expected a whole number, got 'two'`` rather than argparse's
    ``invalid int value`` (argparse prints an :class:`argparse.ArgumentTypeError`'s message as it is)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def number(text: str) -> float:
    """An argparse ``type``: ``expected a number, got '1m'`` (seconds and sizes are plain numbers here)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def guarded(prog: str, command: Callable[[], int]) -> int:
    """Run ``command``; Ctrl-C becomes one line and :data:`EXIT_INTERRUPTED`, a :class:`UsageError` one line.

    Any other exception is a bug and keeps its traceback (exit 1): hiding it would hide the bug.
    """
    try:
        return command()
    except KeyboardInterrupt:
        # A child (scriptrun, verify) got the same SIGINT from the terminal and is gone, or was
        # killed by subprocess.run on the way out: what it printed went to a pipe nobody shows.
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, WarmError) as error:  # a sub-command that left its own to the CLI
        print(f"{prog}: error: {error}", file=sys.stderr)
        return error.exit_code
    except UnknownFramework as error:  # an installed plug-in that gives no framework: not our bug
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def known_env_names(roots: Iterable[Path] = (Path(__file__).parent.parent,)) -> set[str]:
    """Every ``COMPILECACHE_*`` name the package's source mentions: the variables something reads.

    Read from the source rather than kept as a list, so that a module that starts reading a new
    variable never gets it reported as unread (a few milliseconds, and only when one is set).
    """
    names: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            names.update(_NAME.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


def unread_env_names(environ: Mapping[str, str], known: set[str]) -> list[str]:
    """Set ``COMPILECACHE_*`` variables that no module reads (a typo, or a removed setting)."""
    return sorted(name for name in environ if name.startswith(PREFIX) and name not in known)


def warn_unread_env(prog: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per unread ``COMPILECACHE_*`` variable, on stderr; returns their names."""
    environ = os.environ if environ is None else environ
    if not any(name.startswith(PREFIX) for name in environ):
        return []
    known = known_env_names()
    unread = unread_env_names(environ, known)
    for name in unread:
        close = _closest(name, known)
        hint = f" (did you mean {close}?)" if close else ""
        print(f"{prog}: warning: {name} is set but nothing reads it{hint}", file=sys.stderr)
    return unread


def _closest(name: str, known: Iterable[str]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    return matches[0] if matches else None
